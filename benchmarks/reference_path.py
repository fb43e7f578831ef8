"""What the demo's reference numerical path costs in speed: its work on that path and on this CPU's own, side by side.

    python -m benchmarks.reference_path [--rounds 2] [--threads 1] [--sft_steps 20] [--rl_iterations 4]
        [--out FILE.json]

The reference path (utils/cpu.py: torch's kernels, oneDNN, MKL and NumPy at AVX2, fixed threads) is what ``make
demo`` computes on, so that one seed gives one table on any x86 CPU with AVX2. Each workload runs in a fresh process
(the libraries read the path when torch starts), on the two paths in turn, ``--rounds`` times, with ``--threads``
torch threads (1: a demo stage beside another on 2 cores): SFT steps of tiny-gpt2 at the demo's batch of 16 (the
last row of ``benchmarks.sft_step``, supervised_pretrain.py's defaults) and RL iterations of Taxi pickup with
reflection at the defaults (row 2 of ``benchmarks.rl_iteration``). Printed per workload: seconds per step on either
path (the best round's) and the reference path's cost, and the CPU's capabilities.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.rows import own_flags, print_table, refuse, save
from experiment_args import one_line_usage_errors
from utils import cpu

PROG = "python -m benchmarks.reference_path"


def workloads(sft_steps: int, rl_iterations: int) -> dict[str, tuple[list[str], str, int]]:
    """Name -> (the benchmark's command after ``python -m``, the JSON field of its seconds per step, its row)."""
    return {
        f"SFT step (tiny-gpt2, 16 texts; {sft_steps} steps)":
            (["benchmarks.sft_step", f"--max_steps={sft_steps}"], "s_per_step", -1),
        f"RL iteration (Taxi pickup with reflection, the defaults; {rl_iterations} iterations)":
            (["benchmarks.rl_iteration", "--rows", "2", f"--max_steps={rl_iterations}"], "s_per_iteration", 1),
    }


def timed(command: list[str], field: str, row: int, reference: bool, threads: int) -> float:
    """Seconds per step of ``command``'s chosen row, played in a fresh process on either path."""
    environ = {name: value for name, value in os.environ.items() if name not in cpu.PINNED}
    if reference:
        cpu.pin(environ)
    environ["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "rows.json"
        done = subprocess.run([sys.executable, "-m", *command, f"--out={out}"], env=environ, capture_output=True,
                              text=True)
        if done.returncode != 0:
            refuse(PROG, f"{' '.join(command)} failed (status {done.returncode}): "
                         f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        return float(json.loads(out.read_text())[row][field])


def main(argv: list[str]) -> int:
    own, rest = own_flags(argv, PROG, __doc__, {
        "--rounds": dict(type=int, default=2, help="times each workload runs on each path (the best is kept)"),
        "--threads": dict(type=int, default=1, help="torch threads of each run"),
        "--sft_steps": dict(type=int, default=20, help="SFT steps a run"),
        "--rl_iterations": dict(type=int, default=4, help="RL iterations a run")})
    if "-h" in rest or "--help" in rest:
        return 0  # own_flags has printed this benchmark's flags
    if rest:
        refuse(PROG, f"unknown flags {rest}: this benchmark takes only its own")
    # a step count of 2 at least: the first step warms up and is left out (benchmarks.rows.steady)
    for name, least in {"rounds": 1, "threads": 1, "sft_steps": 2, "rl_iterations": 2}.items():
        if getattr(own, name) < least:
            refuse(PROG, f"--{name}: at least {least}, got {getattr(own, name)}")
    results = []
    for name, (command, field, row) in workloads(own.sft_steps, own.rl_iterations).items():
        seconds: dict[bool, list[float]] = {False: [], True: []}
        for round_ in range(own.rounds):
            for reference in ((False, True) if round_ % 2 == 0 else (True, False)):  # each path first in turn
                seconds[reference].append(timed(command, field, row, reference, own.threads))
        native, pinned = min(seconds[False]), min(seconds[True])
        results.append({"workload": name, "native_s": native, "reference_s": pinned, "cost": pinned / native - 1,
                        "rounds": {"native": seconds[False], "reference": seconds[True]},
                        "threads": own.threads, "cpu": cpu.caps().describe()})
    print(f"\nThe reference path against this CPU's own ({own.threads} thread(s), the best of {own.rounds} rounds; "
          f"CPU: {cpu.caps().describe()})\n")
    print_table(["workload", "this CPU's path (s / step)", "reference path (s / step)", "cost"],
                ["---", "---:", "---:", "---:"],
                [[r["workload"], f"{r['native_s']:.3f}", f"{r['reference_s']:.3f}", f"{100 * r['cost']:+.0f}%"]
                 for r in results])
    save(own.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(one_line_usage_errors(PROG, main, sys.argv[1:]))
