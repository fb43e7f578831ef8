"""AutoExplore data: repositories -> tasks -> trajectories with reflections -> splits -> SFT texts.

Each step is ``python -m data_gen.auto_explore.<step>`` (files under ``data/auto_explore/``):

0. ``collect_repos``        a few installed Python packages as offline repositories -> ``repos/``
1. ``filter_repo``          ``--repo_dir=repos/`` -> ``repos_filtered/<repo>/``
2. ``gen_task``             ``repos_filtered/`` -> ``tasks/<repo>.json`` + ``tasks/data.json``
3. ``filter_task``          ``--task_file=tasks/`` -> ``tasks_filtered/data.json``
4. ``reflection_negative``  -> ``tasks_filtered/data_reflection_negative.json``
5. ``split_data``           -> ``train.json``, ``validate.json``, ``test.json``
6. ``gen_sft``              ``--task_file=train.json`` -> the five ``sft*.jsonl`` files

From step 2 on, ``--repo_dir`` names the folder of *filtered* repositories (default
``repos_filtered/``): a task's ``root`` is a repository folder name inside it, which is
also how the environment resolves it. The record schemas are in ``data/README.md``.
"""

import hashlib
import json
from pathlib import Path

from envs.auto_explore_tasks import DEFAULT_REPOS_DIR, task_targets
from envs.sandbox import is_safe_name
from utils.errors import UsageError
from utils.paths import DATA_DIR

DATA_ROOT = DATA_DIR / "auto_explore"
RAW_REPOS_DIR = DATA_ROOT / "repos"
TASKS_DIR = DATA_ROOT / "tasks"
FILTERED_DIR = DATA_ROOT / "tasks_filtered"


def filtered_repos_dir(args) -> Path:
    """The folder of filtered repositories that tasks' ``root`` names live in."""
    path = Path(args.repo_dir) if args.repo_dir else DEFAULT_REPOS_DIR
    if not path.is_dir():
        raise UsageError(f"--repo_dir: folder of filtered repositories {str(path)!r} not found "
                         "(run data_gen.auto_explore.filter_repo first)")
    return path


def list_repos(folder: Path) -> list[str]:
    """The repository folder names directly under ``folder``, sorted (hidden and odd names skipped)."""
    return sorted(entry.name for entry in folder.iterdir()
                  if entry.is_dir() and not entry.is_symlink() and is_safe_name(entry.name))


def task_key(task: dict) -> str:
    """A stable name of a task (repo, question, targets) for journals and per-task seeding."""
    identity = [str(task.get("root")), str(task.get("question", "")).strip(), task_targets(task.get("filename"))]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:20]
