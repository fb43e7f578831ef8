"""python -m data_gen.auto_explore.filter_task --task_file=data/auto_explore/tasks/: clean and merge tasks.

``--task_file`` is a folder of per-repo task files (its ``data.json``, the union of
them, is not read again) or one json file. Tasks with an empty question, or whose
files are not in the filtered repository under ``--repo_dir``, are dropped. Tasks of
the same repository with the same question are merged into one whose ``filename`` is
the sorted list of all their files (a single file stays a string), and the optimal
path (``cd`` per folder, ``cat`` and ``id`` the file) and ``n_level`` (depth of the
shallowest target) are recomputed. Output ``tasks_filtered/data.json`` (or in
``--output_dir``), in input order of each task's first occurrence.
"""

import logging
import sys
from collections import Counter
from pathlib import Path

from data_gen.auto_explore import FILTERED_DIR, TASKS_DIR, filtered_repos_dir
from data_gen.common import print_counts
from envs.auto_explore_tasks import existing_targets, load_tasks, optimal_path, target_depth
from experiment_args import run_script
from utils.errors import UsageError
from utils.io import write_json

logger = logging.getLogger(__name__)


def read_tasks(task_file: Path) -> list[dict]:
    if task_file.is_dir():
        files = sorted(p for p in task_file.glob("*.json") if p.name != "data.json" and not p.name.startswith("."))
        if not files:
            raise UsageError(f"--task_file: no per-repo task file (*.json) in folder {str(task_file)!r}")
    else:
        files = [task_file]
    return [task for path in files for task in load_tasks(path, whole_records=True)]


def filter_tasks(tasks: list[dict], repos_dir: Path, counts: Counter) -> list[dict]:
    merged: dict[tuple[str, str], dict] = {}
    for task in tasks:
        question = task.get("question")
        if not isinstance(question, str) or not question.strip():
            counts["dropped: empty question"] += 1
            continue
        targets = existing_targets(task, repos_dir)
        if not targets:
            counts["dropped: file missing"] += 1
            continue
        key = (task["root"], question.strip())
        if key in merged:
            counts["merged duplicates"] += 1
            merged[key]["targets"].update(targets)
        else:
            merged[key] = {"task": dict(task, question=question.strip()), "targets": set(targets)}
    kept = []
    for entry in merged.values():
        task, targets = entry["task"], sorted(entry["targets"])
        task["filename"] = targets[0] if len(targets) == 1 else targets
        task["optimal_path"] = optimal_path(task)
        task["n_level"] = min(target_depth(t) for t in targets)
        kept.append(task)
    return kept


def main(args) -> int:
    task_file = Path(args.task_file) if args.task_file else TASKS_DIR
    if not task_file.exists():
        raise UsageError(f"--task_file: {str(task_file)!r} does not exist")
    repos_dir = filtered_repos_dir(args)
    out_dir = Path(args.output_dir) if args.output_dir else FILTERED_DIR
    tasks = read_tasks(task_file)
    counts: Counter = Counter()
    kept = filter_tasks(tasks, repos_dir, counts)
    path = out_dir / "data.json"
    write_json(path, kept)
    depths = Counter(task["n_level"] for task in kept)
    print_counts("auto_explore.filter_task", {
        "tasks in": len(tasks), **dict(sorted(counts.items())), "tasks out": len(kept),
        "with several files": sum(isinstance(t["filename"], list) for t in kept),
        **{f"depth {d}": n for d, n in sorted(depths.items())}, "output": str(path)})
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m data_gen.auto_explore.filter_task"))
