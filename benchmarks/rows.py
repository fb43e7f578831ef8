"""What the benchmarks share: the flags of their own (``--out FILE.json`` of ``rl_iteration`` and ``sft_step``,
``--batches`` of ``rl_memory`` ...) beside the shared ones, the steady-state mean of a row's timings, and the
Markdown table they print."""

import argparse
import sys
from pathlib import Path
from typing import NoReturn

import numpy as np

from utils import cpu
from utils.io import write_json


def own_flags(argv: list[str], prog: str, doc: str, flags: dict[str, dict] | None = None,
              out: bool = True) -> tuple[argparse.Namespace, list[str]]:
    """The benchmark's own flags taken from ``argv``, and the rest (the shared flags, for ``parse_args``):
    ``--out FILE.json`` (or ``--out=FILE.json``; not with ``out=False``) and ``flags`` (flag -> the keywords of
    ``add_argument``). No abbreviations: a shared flag's prefix is never taken for one of these.

    Unless asked for help, the CPU's capabilities are printed first (every benchmark's timings depend on them).
    ``--out``'s folder is made now: a name that cannot be written (none given, a folder, a folder that cannot be
    made) ends the program with one line and status 2 before the benchmark runs, not after. With ``--help``,
    ``doc`` (the module's docstring) and these flags are printed before the shared flags' help."""
    own = argparse.ArgumentParser(prog=prog, add_help=False, allow_abbrev=False, description=doc,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    group = own.add_argument_group("this benchmark's own flags")
    if out:
        group.add_argument("--out", metavar="FILE.json",
                           help="also write the rows, with every measurement, to this JSON file")
    for flag, keywords in (flags or {}).items():
        group.add_argument(flag, **keywords)
    try:
        options, rest = own.parse_known_args(argv)
    except SystemExit:  # argparse has said what is wrong (--out without a name ...), in one line, status 2
        raise SystemExit(2) from None
    if "-h" in rest or "--help" in rest:
        own.print_help()
        print()
    else:  # what the timings depend on, before them (utils/cpu.py)
        print(f"CPU: {cpu.caps().describe()}", flush=True)
    if out and options.out is not None:
        path = options.out = Path(options.out)
        if path.is_dir():  # --out= is "." too
            refuse(prog, f"--out: {path} is a folder; give a file name")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            refuse(prog, f"--out: cannot make the folder of {path} ({error.strerror})")
    return options, rest


def refuse(prog: str, message: str) -> NoReturn:
    """End the program with ``message``, one line on stderr, status 2."""
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
