"""python -m data_gen.auto_explore.gen_sft --task_file=.../train.json: SFT texts by replaying trajectories.

Each trajectory is replayed in a fresh AutoExplore episode (no leave-out; with
``--shuffle_action`` the labels come from a seeded reset, see :func:`replay_seed`), so
every text holds exactly the observation and the label a rollout would show. Used:

* positives that identify a target (checked by the replay): every step (``--sft_positives all``,
  the paper's code: every positive, one that identifies a wrong file or none included);
* negatives: only the corrective last step, the one after the wrong ``cat``.

Five files next to the task file (or in ``--output_dir``), each line ``{"text": ...}``
built by ``data_gen.sft.sft_texts``: ``sft.jsonl`` (no reflection), ``sft_reflection.jsonl``,
``sft_policy.jsonl`` (positives and negatives) and ``sft_reflection_positive.jsonl``,
``sft_policy_positive.jsonl`` (positives only, for Reflect-RL without negatives).
"""

import logging
import sys
from collections import Counter
from pathlib import Path

from data_gen.auto_explore import FILTERED_DIR, filtered_repos_dir, task_key
from data_gen.common import item_rng, print_counts
from data_gen.sft import sft_labels, sft_texts
from envs.auto_explore import AutoExploreEnv
from envs.auto_explore_tasks import field_problem, load_tasks
from envs.base import rng_seed
from experiment_args import run_script
from prompts import write_label_file
from utils.errors import UsageError
from utils.io import write_jsonl

logger = logging.getLogger(__name__)

OUTPUT_FILES = ("sft.jsonl", "sft_reflection.jsonl", "sft_policy.jsonl",
                "sft_reflection_positive.jsonl", "sft_policy_positive.jsonl")


class ReplayError(ValueError):
    """A recorded command that the environment does not offer at that point."""


def replay_seed(seed: int, task: dict, index: int) -> int:
    """The reset seed of trajectory ``index`` of ``task`` (it fixes the shuffled labels)."""
    return rng_seed(item_rng(seed, "gen_sft", task_key(task), index))


def replay(env: AutoExploreEnv, task: dict, trajectory: dict, seed: int) -> tuple[list[tuple[str, str, str]], dict]:
    """(observation, label, reflection) of each recorded step, and the info after the last one."""
    obs, info = env.reset(seed=seed, options={"task": task})
    states = []
    steps = trajectory["trajectory"]
    for number, step in enumerate(steps):
        if step["cmd"] not in info["actions"]:
            raise ReplayError(f"step {number}: {step['cmd']!r} is not offered; offered {info['actions']}")
        label = env.label_of(step["cmd"])
        states.append((obs, label, step["reflection"]))
        obs, _, terminated, truncated, info = env.step(label)
        if (terminated or truncated) and number + 1 < len(steps):
            raise ReplayError(f"the episode ended at step {number} of {len(steps)}")
    return states, info


def trajectory_texts(env: AutoExploreEnv, task: dict, trajectory: dict, seed: int, counts: Counter,
                     all_positives: bool = False):
    """The (obs, label, reflection) states that become SFT texts, and whether they are positive.
    ``all_positives`` (``--sft_positives all``) keeps positives that identify no target."""
    positive = trajectory["info"].startswith("positive")
    if not trajectory["trajectory"]:
        counts["skipped: empty trajectory"] += 1
        return [], positive
    if positive and trajectory.get("filename") is None and not all_positives:
        counts["skipped: no target identified"] += 1
        return [], positive
    try:
        states, info = replay(env, task, trajectory, seed)
    except ReplayError as error:
        logger.warning("task %r, trajectory %s: cannot replay (%s); skipped", task["question"], trajectory["info"],
                       error)
        counts["skipped: cannot replay"] += 1
        return [], positive
    if positive and not info.get("correct"):
        if not all_positives:
            counts["skipped: no target identified"] += 1
            return [], positive
        counts["positives used without a target identified"] += 1
    used = states if positive else states[-1:]
    if any(reflection is None for _, _, reflection in used):
        counts["skipped: step without reflection"] += 1
        return [], positive
    counts["positives used" if positive else "negatives used"] += 1
    return used, positive


def record_problem(record: dict) -> str | None:
    """Why ``record`` is no task with trajectories this step can replay (its fields' kinds), or None."""
    problem = field_problem(record)
    if problem is not None:
        return problem
    trajectories = record.get("trajectories")
    if not isinstance(trajectories, list):
        return "it has no list 'trajectories'"
    for index, trajectory in enumerate(trajectories):
        steps = trajectory.get("trajectory") if isinstance(trajectory, dict) else None
        if not isinstance(steps, list) or not isinstance(trajectory.get("info"), str):
            return f"trajectory {index} is not an object with a string 'info' and a list 'trajectory'"
        if not all(isinstance(step, dict) and isinstance(step.get("cmd"), str) and "reflection" in step
                   for step in steps):
            return f"a step of trajectory {index} is not an object with a string 'cmd' and a 'reflection'"
    return None


def main(args) -> int:
    task_file = Path(args.task_file) if args.task_file else FILTERED_DIR / "train.json"
    records = load_tasks(task_file, whole_records=True)
    for number, record in enumerate(records):
        problem = record_problem(record)
        if problem is not None:
            raise UsageError(f"--task_file: task {number} of {task_file}: {problem} (give the output of "
                             "reflection_negative or split_data)")
    out_dir = Path(args.output_dir) if args.output_dir else task_file.parent
    labels = sft_labels(args)
    env = AutoExploreEnv(horizon=args.horizon, shuffle_action=args.shuffle_action, leaveout_prob=0.0,
                         repos_dir=filtered_repos_dir(args), labels=labels, view_tokens=args.auto_explore_view_tokens,
                         text_layout=args.text_layout)
    texts: dict[str, list[str]] = {name: [] for name in OUTPUT_FILES}
    counts: Counter = Counter()
    try:
        for record in records:
            for index, trajectory in enumerate(record["trajectories"]):
                used, positive = trajectory_texts(env, record, trajectory, replay_seed(args.seed, record, index),
                                                  counts, all_positives=args.sft_positives == "all")
                for obs, label, reflection in used:
                    plain, reflect, policy = sft_texts(obs, AutoExploreEnv, label, reflection, args.text_layout)
                    texts["sft.jsonl"].append(plain)
                    texts["sft_reflection.jsonl"].append(reflect)
                    texts["sft_policy.jsonl"].append(policy)
                    if positive:
                        texts["sft_reflection_positive.jsonl"].append(reflect)
                        texts["sft_policy_positive.jsonl"].append(policy)
    finally:
        env.close()
    lines = {name: write_jsonl(out_dir / name, ({"text": t} for t in column)) for name, column in texts.items()}
    write_label_file(out_dir, labels, args.model_name)
    print_counts("auto_explore.gen_sft", {"tasks": len(records), **dict(sorted(counts.items())), **lines,
                                          "output": str(out_dir)})
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m data_gen.auto_explore.gen_sft"))
