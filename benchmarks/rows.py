"""What the benchmarks that add one option a row share (``rl_iteration``, ``sft_step``): the ``--out FILE.json``
option, the steady-state mean of a row's timings, and the Markdown table they print."""

import sys
from pathlib import Path
from typing import NoReturn

import numpy as np

from utils.io import write_json


def take_out(argv: list[str], prog: str) -> tuple[Path | None, list[str]]:
    """``--out FILE`` taken from ``argv`` (None if absent) and the rest. Its folder is made now: a name that
    cannot be written (none given, a folder, a folder that cannot be made) ends the program with one line and
    status 2 before the benchmark runs, not after."""
    if "--out" not in argv:
        return None, argv
    at = argv.index("--out")
    if at + 1 >= len(argv):
        _refuse(prog, "--out needs a file name")
    out = Path(argv[at + 1])
    if out.is_dir():
        _refuse(prog, f"--out: {out} is a folder; give a file name")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        _refuse(prog, f"--out: cannot make the folder of {out} ({error.strerror})")
    return out, argv[:at] + argv[at + 2:]


def take_switch(argv: list[str], switch: str) -> tuple[bool, list[str]]:
    """Whether ``switch`` (a benchmark's own flag, e.g. ``--emulated_bf16``) is in ``argv``, and the rest."""
    return switch in argv, [word for word in argv if word != switch]


def _refuse(prog: str, message: str) -> NoReturn:
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


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
        write_json(out, results)
