"""python -m data_gen.auto_explore.split_data --task_file=.../data_reflection_negative.json: 7:2:1 split.

Writes ``train.json``, ``validate.json`` and ``test.json`` next to the task file (or in
``--output_dir``); with ``--holdout_repo NAME``, every task of that repository goes to ``holdout.json``
instead (a repository no training task comes from). Tasks are grouped by repository and question, so a question never
appears on both sides of a split; groups are shuffled with ``--seed`` and filled into
the splits in order, each group going to the first split with room for it.
"""

import logging
import sys
from collections import Counter, defaultdict
from pathlib import Path

from data_gen.auto_explore import FILTERED_DIR
from data_gen.common import item_rng, print_counts
from envs.auto_explore_tasks import load_tasks
from experiment_args import run_script
from utils.errors import UsageError
from utils.io import write_json

logger = logging.getLogger(__name__)

SPLITS = {"train": 0.7, "validate": 0.2, "test": 0.1}


def split_tasks(tasks: list[dict], seed: int) -> dict[str, list[dict]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for task in tasks:
        groups[(str(task.get("root")), str(task.get("question", "")).strip())].append(task)
    keys = sorted(groups)
    order = item_rng(seed, "split_data").permutation(len(keys))
    sizes, names = [round(fraction * len(tasks)) for fraction in SPLITS.values()], list(SPLITS)
    sizes[-1] = len(tasks) - sum(sizes[:-1])
    splits: dict[str, list[dict]] = {name: [] for name in names}
    for index in order:
        group = groups[keys[index]]
        room = [name for name, size in zip(names, sizes) if len(splits[name]) + len(group) <= size]
        # A group too large for any remaining room goes where the shortfall is largest.
        name = room[0] if room else max(names, key=lambda n: sizes[names.index(n)] - len(splits[n]))
        splits[name] += group
    return splits


def repository(task: dict) -> str:
    """The folder name of the repository a task comes from (its ``root``)."""
    return Path(str(task.get("root", ""))).name


def main(args) -> int:
    task_file = Path(args.task_file) if args.task_file else FILTERED_DIR / "data_reflection_negative.json"
    tasks = load_tasks(task_file, whole_records=True)
    out_dir = Path(args.output_dir) if args.output_dir else task_file.parent
    held_out = [task for task in tasks if repository(task) == args.holdout_repo] if args.holdout_repo else []
    if args.holdout_repo and not held_out:
        repos = sorted({repository(task) for task in tasks})
        raise UsageError(f"--holdout_repo {args.holdout_repo!r}: no task of {task_file} comes from it "
                         f"(its repositories: {', '.join(repos)})")
    kept = [task for task in tasks if repository(task) != args.holdout_repo]
    if not kept:
        why = f"every task of it comes from --holdout_repo {args.holdout_repo!r}" if tasks else "it holds no task"
        raise UsageError(f"--task_file: nothing to split in {task_file}: {why}")
    splits = split_tasks(kept, args.seed)
    if empty := [name for name, part in splits.items() if not part]:
        logger.warning("%s: %d task(s) leave %s empty (split %s)", task_file, len(kept),
                       " and ".join(f"{name}.json" for name in empty), ":".join(f"{f:g}" for f in SPLITS.values()))
    if held_out:
        splits["holdout"] = held_out
    counts = {}
    for name, part in splits.items():
        write_json(out_dir / f"{name}.json", part)
        counts[name] = len(part)
        depths = Counter(task.get("n_level") for task in part)
        counts.update({f"{name} depth {d}": n for d, n in sorted(depths.items(), key=lambda kv: str(kv[0]))})
    counts["output"] = str(out_dir)
    print_counts("auto_explore.split_data", counts)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m data_gen.auto_explore.split_data"))
