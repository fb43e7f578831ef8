"""A pipeline stage for the runner's tests (``runner.stages.Stage("...", "tests.stage_probe", [...])``): it notes when it
starts (with its process id) and ends in ``order.txt`` beside its ``--output_dir``, which it creates, and takes a moment
between."""

import os
import time
from pathlib import Path

SECONDS = 0.5


def main(args) -> int:
    out = Path(args.output_dir)
    with open(out.parent / "order.txt", "a", encoding="utf-8") as order:
        order.write(f"start {out.name}\n")
        order.write(f"pid {out.name} {os.getpid()}\n")
    time.sleep(SECONDS)
    out.mkdir()
    with open(out.parent / "order.txt", "a", encoding="utf-8") as order:
        order.write(f"end {out.name}\n")
    return 0
