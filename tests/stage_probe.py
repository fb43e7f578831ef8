"""A pipeline stage for the runner's tests (``runner.stages.Stage("...", "tests.stage_probe", [...])``): it notes when it
starts (with its process id and torch's threads) and ends in ``order.txt`` beside its ``--output_dir``, which it
creates, and takes a moment between. With ``--task_file``, it ends only once that file exists (another stage's
``--output_dir``, say): a stage that must run beside another one, else it fails after :data:`WAIT` seconds."""

import os
import time
from pathlib import Path

import torch

SECONDS = 0.5
WAIT = 300


def main(args) -> int:
    out = Path(args.output_dir)
    with open(out.parent / "order.txt", "a", encoding="utf-8") as order:
        order.write(f"start {out.name}\n")
        order.write(f"pid {out.name} {os.getpid()}\n")
        order.write(f"threads {out.name} {torch.get_num_threads()}\n")
    time.sleep(SECONDS)
    deadline = time.time() + WAIT
    while args.task_file and not Path(args.task_file).exists():
        if time.time() > deadline:
            raise RuntimeError(f"{out.name}: {args.task_file} was not made beside it in {WAIT} s")
        time.sleep(0.1)
    out.mkdir()
    with open(out.parent / "order.txt", "a", encoding="utf-8") as order:
        order.write(f"end {out.name}\n")
    return 0
