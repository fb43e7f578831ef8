"""Play episodes in the terminal: ``python -m envs.play --env taxi --policy oracle|random|human``.

Prints every observation, the label chosen, the reward and the outcome. AutoExplore
plays tasks from ``--task_file``, or else finds a file of ``--repo_dir`` (default: this
project's ``data_gen`` folder) given as an easy "Find <file>" task. ALFWorld plays the
``--alfworld_split`` problems of ``--alfworld_data`` (or ``$ALFWORLD_DATA``).
"""

import sys
from pathlib import Path

import numpy as np

from envs import env_kwargs, make_env
from envs.auto_explore import load_tasks, optimal_path, target_depth
from envs.sandbox import file_kind, is_safe_name
from envs.taxi import curriculum_at
from experiment_args import parse_args
from paths import REPO_ROOT

DEFAULT_PLAY_REPO = REPO_ROOT / "data_gen"


def repo_task(repo: Path, rng: np.random.Generator) -> dict:
    """A 'Find <file>' task for a random allowed file of ``repo`` at depth <= 2."""
    repo = repo.resolve()
    if not repo.is_dir():
        raise ValueError(f"--repo_dir: no such folder {str(repo)!r}")
    candidates = sorted(
        p.relative_to(repo).as_posix() for p in repo.rglob("*")
        if p.is_file() and not p.is_symlink() and file_kind(p.name)
        and all(is_safe_name(part) for part in p.relative_to(repo).parts) and len(p.relative_to(repo).parts) <= 3
    )
    if not candidates:
        raise ValueError(f"--repo_dir: {repo} has no file with an allowed suffix at depth <= 2")
    target = candidates[int(rng.integers(len(candidates)))]
    task = {"question": f"Find {target.rpartition('/')[2]}", "answer": target, "filename": target,
            "root": str(repo), "n_level": target_depth(target), "model": "play"}
    task["optimal_path"] = optimal_path(task)
    return task


def reset_options(args, rng: np.random.Generator) -> dict:
    if args.env == "taxi":
        return {"curriculum": curriculum_at(args.curriculum_index)}
    if args.env == "auto_explore":
        if args.task_file:
            tasks = load_tasks(args.task_file)
            return {"task": tasks[int(rng.integers(len(tasks)))]}
        return {"task": repo_task(Path(args.repo_dir) if args.repo_dir else DEFAULT_PLAY_REPO, rng)}
    return {}


def choose(policy: str, info: dict, rng: np.random.Generator) -> str | None:
    if policy == "oracle":
        if info["oracle_label"] is None:
            raise RuntimeError("the environment knows no oracle action here")
        return info["oracle_label"]
    if policy == "random":
        return str(rng.choice(info["labels"]))
    try:
        return input("label> ").strip()
    except EOFError:
        return None


def play(args) -> list[dict]:
    rng = np.random.default_rng(args.seed)
    env = make_env(args.env, **env_kwargs(args, evaluation=True))
    outcomes = []
    try:
        for episode in range(args.runs):
            obs, info = env.reset(seed=int(rng.integers(2**31 - 1)), options=reset_options(args, rng))
            print(f"===== episode {episode + 1} =====\n{obs}", flush=True)
            while True:
                label = choose(args.policy, info, rng)
                if label is None:
                    print("(input closed; stopping)")
                    return outcomes
                obs, reward, terminated, truncated, info = env.step(label)
                print(f"--> chose {label!r}: reward {reward:+.3f}"
                      + (" (not a listed label: nothing happens)" if info.get("invalid_label") else ""))
                if terminated or truncated:
                    outcome = {"success": info["success"], "cost": info["cost"], "steps": env.steps,
                               "truncated": truncated}
                    print(f"===== {'SUCCESS' if info['success'] else 'FAILURE'}: cost {info['cost']:.3f} "
                          f"after {env.steps} steps{' (horizon reached)' if truncated else ''} =====", flush=True)
                    outcomes.append(outcome)
                    break
                print(obs, flush=True)
    finally:
        env.close()
    wins = sum(o["success"] for o in outcomes)
    print(f"[play] {args.env} / {args.policy}: {wins} of {len(outcomes)} episodes succeeded")
    return outcomes


def main(args) -> int:
    outcomes = play(args)
    return 0 if outcomes else 1


if __name__ == "__main__":
    sys.exit(main(parse_args(prog="python -m envs.play")))
