"""How often a two-process RL run (``accelerate launch``, gloo on the CPU) fails to exit 0, under the suite's load.

    python -m benchmarks.two_process_exit [--runs 50] [--repo PATH] [--no_load] [--load_workers N]
        [--load_tests tests/test_x.py ...]

Each run is the two-process RL of ``tests/test_rl_finetune.py`` (:func:`command`: tiny-gpt2, Taxi, 2 iterations)
with ``PYTHONFAULTHANDLER=1`` and one thread per process, as the suite runs it. Beside the runs, unless
``--no_load``, pytest-xdist plays ``--load_tests`` over and over on every core, as the suite does around this
test. ``--repo`` runs another checkout's code (a commit before a fix: ``git worktree add /tmp/base <commit>``)
with this venv's Python, so the two rates are measured on one machine in one session. Printed: how many runs
exited 0, how many failed and how (an abort: ``terminate called ...``, SIGABRT), each failure's last lines, and in
how many runs a rank still ran gloo's threads when it exited (``benchmarks/exit_probe.py``), the state in which a
rank may abort: rare as the abort is, that count says at once whether a checkout tears the group down.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import exit_probe
from utils.distributed import GLOO_THREADS
from utils.paths import REPO_ROOT

PROG = "python -m benchmarks.two_process_exit"
LOAD_TESTS = ("tests/test_rollout.py", "tests/test_learners.py", "tests/test_rl_algorithms.py")


def command(repo: Path, ckpt_path: Path, probe: bool = True) -> list[str]:
    """The two-process RL run: two ranks on the CPU (gloo), each rolling out 3 Taxi episodes an iteration; with
    ``probe``, each rank says its threads at exit (``benchmarks/exit_probe.py``: :func:`gloo_at_exit`)."""
    script = [str(Path(exit_probe.__file__)), str(repo / "rl_finetune.py")] if probe else [str(repo / "rl_finetune.py")]
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", *script,
            "--model_name", "tiny-gpt2", "--env", "taxi", "--taxi_curriculum", "--curriculum_index", "0",
            "--first_step", "--max_steps", "2", "--save_steps", "2", "--per_device_eval_batch_size", "3",
            "--ckpt_path", str(ckpt_path)]


def gloo_at_exit(output: str) -> dict[str, int]:
    """Per rank, how many gloo threads still ran when its interpreter exited (the probe's lines in ``output``)."""
    said = re.findall(rf"{re.escape(exit_probe.MARK)} rank (\d+) threads at exit: ([^\n\[]*)", output)
    return {rank: sum(name in GLOO_THREADS for name in names.split(",")) for rank, names in said}  # lines may mix


def environment() -> dict[str, str]:
    """The suite's environment for the processes a test starts (tests/conftest.py), on the CPU."""
    return dict(os.environ, PYTHONFAULTHANDLER="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="")


def kind(returncode: int, output: str) -> str:
    if "terminate called" in output or returncode in (-6, 134) or "SIGABRT" in output:
        return "abort"
    return f"exit {returncode}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the checkout whose rl_finetune.py runs")
    parser.add_argument("--no_load", action="store_true", help="no pytest-xdist beside the runs")
    parser.add_argument("--load_tests", nargs="+", default=list(LOAD_TESTS))
    parser.add_argument("--load_workers", default="auto",
                        help="pytest-xdist's -n for the load (auto: a worker a core, as make test)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    repo = args.repo.resolve()
    if not (repo / "rl_finetune.py").is_file():
        parser.error(f"--repo: {repo} holds no rl_finetune.py")
    env = environment()
    # the tiny model built once before the runs and the load start, as the suite's first test builds it
    subprocess.run([sys.executable, "-c", "from utils import tiny_gpt2; tiny_gpt2.tiny_gpt2_path()"], cwd=repo,
                   env=env, check=True, capture_output=True)
    load = None
    failures: list[tuple[int, str, str]] = []
    held_runs = 0  # runs where a rank still ran gloo's threads at exit
    tic = time.time()
    with tempfile.TemporaryDirectory(prefix="two_process_exit-") as scratch:
        try:
            for run in range(1, args.runs + 1):
                if not args.no_load and (load is None or load.poll() is not None):
                    pytest = [sys.executable, "-m", "pytest", "-q", "-n", args.load_workers, "-p", "no:cacheprovider"]
                    load = subprocess.Popen([*pytest, *args.load_tests], cwd=repo, env=env,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                result = subprocess.run(command(repo, Path(scratch) / f"run{run}"), cwd=repo, env=env,
                                        capture_output=True, text=True, timeout=600)
                output = result.stdout + result.stderr
                held = gloo_at_exit(output)
                held_runs += any(held.values())
                if result.returncode != 0:
                    failures.append((run, kind(result.returncode, output), output[-1500:]))
                print(f"run {run}/{args.runs}: exit {result.returncode}, gloo threads at exit {held} "
                      f"({len(failures)} failed so far)", flush=True)
        finally:
            if load is not None and load.poll() is None:
                load.terminate()
                load.wait()
    for run, how, tail in failures:
        print(f"\n--- run {run}: {how}; its last lines:\n{tail}")
    aborts = sum(how == "abort" for _, how, _ in failures)
    print(f"\n{repo}: {args.runs - len(failures)} of {args.runs} two-process runs exited 0; {aborts} aborted, "
          f"{len(failures) - aborts} failed otherwise ({'no load' if args.no_load else 'pytest-xdist beside them'}; "
          f"{time.time() - tic:.0f} s); a rank still ran gloo's threads at exit in {held_runs} of them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
