"""Environment speed: reset time and steps per second of each environment, as a table.

    python -m benchmarks.env_speed [--runs N] [--alfworld_data DIR]

Random policy, fixed seeds. AutoExplore explores this project's ``data_gen`` folder (or
``--repo_dir``); ALFWorld runs the hand-made fixture and, when ``--alfworld_data`` (or
``$ALFWORLD_DATA``) is given, the real tomato→microwave games there, as textworld plays them, then with the
worker's memo of the engine's PDDL translation and grammar parsing (``envs.alfworld_worker.memoise_engine``)
and with its grammar's contexts copied without deep copies (``copy_contexts_shallowly``), and the first reset
of a game in a worker with the memo's translations kept on disk by another worker or not (in a temporary store
of the run's own).
"""

import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from envs import make_env
from envs.auto_explore_tasks import DEFAULT_PLAY_REPO, repo_task
from experiment_args import run_script
from utils.paths import SHARED_DIR

FIXTURES = SHARED_DIR / "alfworld" / "fixtures"
# The real games' engine as textworld has it, then with each of the worker's exact speed-ups added in turn.
ENGINE_ROWS = (("engine as textworld has it", False, False),
               ("+ engine memoised", True, False),
               ("+ grammar contexts copied shallowly", True, True))


def measure(env, options_for, episodes: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    resets, step_times = [], []
    try:
        for _ in range(episodes):
            options = options_for(rng)
            tic = time.perf_counter()
            _, info = env.reset(seed=int(rng.integers(2**31 - 1)), options=options)
            resets.append(time.perf_counter() - tic)
            done = False
            while not done:
                label = str(rng.choice(info["labels"]))
                tic = time.perf_counter()
                _, _, terminated, truncated, info = env.step(label)
                step_times.append(time.perf_counter() - tic)
                done = terminated or truncated
    finally:
        env.close()
    return {"episodes": episodes, "steps": len(step_times), "reset_ms": 1000 * statistics.median(resets),
            "steps_per_s": len(step_times) / max(sum(step_times), 1e-9)}


def main(args) -> int:
    episodes = args.runs if args.runs > 1 else 20  # --runs defaults to 1: too few to time
    repo = Path(args.repo_dir) if args.repo_dir else DEFAULT_PLAY_REPO
    rows = [
        ("taxi (full, horizon 20)", measure(make_env("taxi"), lambda rng: {}, episodes, args.seed)),
        ("taxi (with history + rules)",
         measure(make_env("taxi", with_history=True, with_prompt=True), lambda rng: {}, episodes, args.seed)),
        (f"auto_explore ({repo.name})",
         measure(make_env("auto_explore", leaveout_prob=0.5), lambda rng: {"task": repo_task(repo, rng)},
                 episodes, args.seed)),
    ]
    if FIXTURES.is_dir():
        rows.append(("alfworld (hand-made fixture)",
                     measure(make_env("alfworld", data_root=str(FIXTURES)), lambda rng: {}, min(episodes, 5),
                             args.seed)))
    data = args.alfworld_data or os.environ.get("ALFWORLD_DATA")
    with tempfile.TemporaryDirectory() as cache, _cache_at(cache):  # the engine's translations kept in a store of
        # this run's own, filled here only
        if data:  # 6 episodes (at most --runs) over 2 games; with the memo a game played again resets without re-translating
            for name, memoise, shallow in ENGINE_ROWS:
                env = make_env("alfworld", data_root=data, horizon=10, memoise_engine=memoise, keep_translations=False,
                               shallow_contexts=shallow)
                games = env.problems[:2]
                rows.append((f"alfworld (tomato->microwave, train; {name})",
                             measure(env, lambda rng, games=games: {"problem": str(games[int(rng.integers(2))])},
                                     min(episodes, 6), args.seed)))
        print("\n| environment | episodes | steps | reset (median, ms) | steps/s |\n|---|---:|---:|---:|---:|")
        for name, row in rows:
            print(f"| {name} | {row['episodes']} | {row['steps']} | {row['reset_ms']:.1f} | {row['steps_per_s']:.0f} |")
        if data:
            print("\n| a game's first reset in a started worker | ms |\n|---|---:|")
            for name, ms in first_resets(data):
                print(f"| {name} | {ms:.1f} |")
    return 0


@contextlib.contextmanager
def _cache_at(folder: str):
    """``$REFLECTRL_CACHE`` (which the ALFWorld workers started inside inherit) at ``folder``, then as before."""
    before = os.environ.get("REFLECTRL_CACHE")
    os.environ["REFLECTRL_CACHE"] = folder
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("REFLECTRL_CACHE")
        else:
            os.environ["REFLECTRL_CACHE"] = before


def first_resets(data: str) -> list[tuple[str, float]]:
    """The reset of a game a started worker has not played (the first table has it without the memo): with the
    memo in the worker only, and with its translations kept on disk by another worker before (every RL or
    evaluation worker's case after the first to play that game)."""
    rows = []
    for name, keep in (("memoised in the worker only", False), ("memoised, translations kept by another worker", True)):
        env = make_env("alfworld", data_root=data, horizon=10, keep_translations=keep)
        first, game = env.problems[:2]
        if keep:
            other = make_env("alfworld", data_root=data, horizon=10)
            other.reset(seed=0, options={"problem": str(game)})
            other.close()
        try:
            env.reset(seed=0, options={"problem": str(first)})  # starts the worker
            tic = time.perf_counter()
            env.reset(seed=1, options={"problem": str(game)})
            rows.append((name, 1000 * (time.perf_counter() - tic)))
        finally:
            env.close()
    return rows


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m benchmarks.env_speed"))
