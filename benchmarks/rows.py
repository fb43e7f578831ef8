"""What the benchmarks that add one option a row share (``rl_iteration``, ``sft_step``): the ``--out FILE.json``
option, the steady-state mean of a row's timings, and the Markdown table they print."""

import json
import sys
from pathlib import Path

import numpy as np


def take_out(argv: list[str], prog: str) -> tuple[Path | None, list[str]]:
    """``--out FILE`` taken from ``argv`` (None if absent) and the rest; a missing file name ends the program
    with one line and status 2."""
    if "--out" not in argv:
        return None, argv
    at = argv.index("--out")
    if at + 1 >= len(argv):
        print(f"{prog}: error: --out needs a file name", file=sys.stderr)
        raise SystemExit(2)
    return Path(argv[at + 1]), argv[:at] + argv[at + 2:]


def steady(values: list) -> list:
    """The measurements after the first (which warms caches and kernels up), or the first if it is alone."""
    return values[1:] or values


def steady_mean(seconds: list[float]) -> float:
    """The mean of the :func:`steady` times."""
    return float(np.mean(steady(seconds)))


def print_table(header: list[str], align: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(align) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def save(out: Path | None, results: list[dict]) -> None:
    if out is not None:
        out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
