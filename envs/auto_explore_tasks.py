"""AutoExplore's tasks: reading task files, a task's targets and depth, and its optimal path.

A task is a dict (the schema of ``data/auto_explore/tasks*/*.json``; see ``envs/auto_explore.py``).
The environment plays one; RL, evaluation, the curriculum and the data steps read them from here.
"""

import json
import logging
import os
import stat
from collections import Counter
from pathlib import Path

import numpy as np

from envs.curriculum import Curriculum, Level, proportional_steps
from envs.sandbox import SandboxError, file_kind, is_safe_name, quote_path, resolve
from envs.sandbox_copy import shown_files
from envs.spec import EnvSettings
from utils.errors import UsageError
from utils.io import read_input
from utils.paths import DATA_DIR, REPO_ROOT

logger = logging.getLogger(__name__)

DEFAULT_REPOS_DIR = DATA_DIR / "auto_explore" / "repos_filtered"
TASK_FIELDS = ("question", "answer", "optimal_path", "filename", "root", "n_level", "model")
DEFAULT_PLAY_REPO = REPO_ROOT / "data_gen"  # envs.play's repository without --task_file or --repo_dir


def task_targets(filename) -> list[str]:
    """The task's acceptable target paths ('/'-separated, relative to the repo root), sorted.

    ``filename`` is one path or a list of paths. Raises ``ValueError`` naming a path that
    could never be reached inside a sandbox (absolute, ``..``, unsafe names).
    """
    names = [filename] if isinstance(filename, str) else filename
    if not isinstance(names, list | tuple) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"task field 'filename' must be a path or a non-empty list of paths, got {filename!r}")
    targets = set()
    for name in names:
        parts = [part for part in name.split("/") if part]
        if name.startswith("/") or not parts or not all(is_safe_name(part) for part in parts):
            raise ValueError(f"task field 'filename' holds an invalid repository path {name!r}")
        targets.add("/".join(parts))
    return sorted(targets)


def target_depth(path: str) -> int:
    """How many folders below the repository root a target path lies: its number of '/'."""
    return path.count("/")


def task_depth(task: dict) -> int:
    """A task's target depth: that of its (first) target path."""
    filename = task["filename"]
    return target_depth(filename if isinstance(filename, str) else filename[0])


def load_tasks(path: str | os.PathLike | None, whole_records: bool = False, flag: str = "--task_file") -> list[dict]:
    """The tasks of an AutoExplore task file (``--task_file``): a JSON list of task dicts.

    Each task keeps only :data:`TASK_FIELDS` (trajectories and other extras dropped), the file
    must hold at least one, and the fields an episode reads must have their types
    (:func:`field_problem`). With ``whole_records`` (the data pipeline, which passes its records
    on, checking them itself) every field is kept and an empty list is accepted. A bad file is a
    ``UsageError`` naming ``flag``, the file and the task.
    """
    if not path:
        raise UsageError(f"{flag}: AutoExplore needs a tasks .json file (e.g. data/auto_explore/tasks_filtered/"
                         "train.json)")
    file = Path(path)
    try:
        records = json.loads(read_input(file, flag))
    except json.JSONDecodeError as error:
        raise UsageError(f"{flag}: {file} is not valid JSON ({error})") from None
    if not isinstance(records, list) or not all(isinstance(record, dict) for record in records):
        raise UsageError(f"{flag}: {file} must hold a JSON list of task objects")
    if whole_records:
        return records
    if not records:
        raise UsageError(f"{flag}: {file} holds no task")
    for index, record in enumerate(records):
        problem = field_problem(record)
        if problem is not None:
            raise UsageError(f"{flag}: task {index} of {file}: {problem}")
    return [task_fields(record) for record in records]


def field_problem(task: dict) -> str | None:
    """Why ``task`` cannot be played, judged by its fields' types (a question, targets, a repository), or None."""
    if not isinstance(task.get("question"), str):
        return f"task field 'question' must be a string, got {task.get('question')!r:.200}"
    root = task.get("root")
    if not isinstance(root, str) or not root:
        return f"task field 'root' must name the repository folder, got {root!r:.200}"
    try:
        task_targets(task.get("filename"))
    except ValueError as error:
        return str(error)
    return None


def repo_folder(root, repos_dir: str | os.PathLike | None) -> Path:
    """The repository folder a task's ``root`` names: an absolute path, or a folder in ``repos_dir``
    (``--repo_dir``; None: :data:`DEFAULT_REPOS_DIR`). A ``UsageError`` names the folder looked for and the flag."""
    if not isinstance(root, str | os.PathLike) or not os.fspath(root):
        raise UsageError(f"task field 'root' must name the repository folder, got {root!r:.200}")
    path = Path(root)
    where = ""
    if not path.is_absolute():
        base = Path(repos_dir) if repos_dir is not None else DEFAULT_REPOS_DIR
        path = base / path
        where = (f" (task field 'root' {os.fspath(root)!r} lies in --repo_dir"
                 f"{'' if repos_dir is not None else ', default'} {str(base)!r})")
    if not path.is_dir():
        raise UsageError(f"repository folder {str(path)!r} not found{where}")
    return path


def existing_targets(task: dict, repos_dir: str | os.PathLike | None) -> list[str]:
    """The task's target files present (as allowed regular files) in its repository; none if it has none."""
    try:
        targets = task_targets(task.get("filename"))
        repo = repo_folder(task.get("root"), repos_dir)
    except ValueError:
        return []
    present = []
    for target in targets:
        try:
            _, status = resolve(str(repo), "", target)
        except SandboxError:
            continue
        if stat.S_ISREG(status.st_mode) and file_kind(target):
            present.append(target)
    return present


def check_tasks(tasks: list[dict], repos_dir, flag: str, file) -> None:
    """Each task of ``file`` (its fields' types, its repository folder, its targets in it) can be played, or a
    ``UsageError`` naming ``flag``, the file and the first task that cannot."""
    for index, task in enumerate(tasks):
        problem = field_problem(task)
        if problem is None:
            try:
                repo = repo_folder(task["root"], repos_dir)
            except UsageError as error:
                problem = str(error)
            else:
                missing = sorted(set(task_targets(task["filename"])) - set(existing_targets(task, repos_dir)))
                if missing:
                    problem = (f"target files {missing} are not files of an allowed kind in repository folder "
                               f"{str(repo)!r}")
        if problem is not None:
            raise UsageError(f"{flag}: task {index} of {file}: {problem}")


def task_fields(record: dict) -> dict:
    """A task record's :data:`TASK_FIELDS` (trajectories and other extras dropped)."""
    return {key: record[key] for key in TASK_FIELDS if key in record}


def run_tasks(settings: EnvSettings, flag: str = "task_file") -> list[dict]:
    """The tasks RL and evaluation play: those of ``--task_file`` (or of the file flag ``flag`` names, e.g.
    ``validation_task_file``), with ``--auto_explore_targets``; without ``--easy``, those with an empty
    question are left out (the paper's code).

    ``writer`` (the paper's code): a task's targets are its file and every file the data writer identified
    in the task's trajectories; a task where the writer identified none is left out.
    """
    path = getattr(settings, flag)
    tasks = _run_tasks(settings, path, f"--{flag}")
    if settings.easy:
        return tasks
    asked = [task for task in tasks if task.get("question") != ""]
    if not asked:
        raise UsageError(f"--{flag} {path}: every task has an empty question (give --easy to play them as "
                         "'Find <file>')")
    if len(asked) < len(tasks):
        logger.info("%d tasks with an empty question left out (as the paper's code, without --easy)",
                    len(tasks) - len(asked))
    return asked


def _run_tasks(settings: EnvSettings, path, file_flag: str) -> list[dict]:
    if settings.auto_explore_targets == "task":
        return load_tasks(path, flag=file_flag)
    flag = "--auto_explore_targets writer"
    records = load_tasks(path, whole_records=True, flag=file_flag)
    if not any("trajectories" in record for record in records):
        raise UsageError(f"{flag}: {file_flag} {path} holds no trajectories (give the output of "
                         "reflection_negative or split_data)")
    tasks = []
    for record in records:
        found = [t["filename"] for t in record.get("trajectories", []) if isinstance(t, dict) and t.get("filename")]
        if found:
            own = task_targets(record["filename"])  # first, so that the task's depth stays its own file's
            tasks.append(dict(task_fields(record), filename=own + [t for t in task_targets(found) if t not in own]))
    if not tasks:
        raise UsageError(f"{flag}: in {file_flag} {path} the writer identified no file in any task")
    logger.info("%s: %d of %d tasks kept (the others have no file the writer identified)", flag, len(tasks),
                len(records))
    return tasks


def optimal_path(task: dict) -> list[str]:
    """The shortest command sequence from the repo root: ``cd`` per folder, ``cat`` and ``id`` the target.

    With several targets, the shallowest one (ties: sorted order).
    """
    target = min(task_targets(task.get("filename")), key=lambda t: (target_depth(t), t))
    *folders, name = target.split("/")
    return [f"cd {quote_path(folder)}" for folder in folders] + [f"cat {quote_path(name)}", f"id {quote_path(name)}"]


def first_optimal_command(task: dict) -> str:
    """The first command of the task's optimal path (its ``optimal_path``, else :func:`optimal_path`'s)."""
    path = task.get("optimal_path")
    if isinstance(path, list) and path and isinstance(path[0], str):
        return path[0]
    return optimal_path(task)[0]


def depth_curriculum(tasks: list[dict], max_steps: int, merge_first_two: bool = False,
                     merge_after_first_k: int = 3, index: int | None = None) -> Curriculum:
    """``--depth_curriculum``, as the paper's code builds it.

    * A task is placed at the depth of each of its targets (once per depth), so a task with targets at
      depths 1 and 2 is trained at both levels.
    * ``merge_first_two`` merges the first two non-empty depths (depths 1 and 2 when no target lies at 0).
    * The depths past the first ``merge_after_first_k`` levels form one last level.
    * Each level gets ``max_steps // (tasks over all levels)`` iterations per task it holds and the last
      level the rest (the paper's schedule; split in proportion when there are fewer iterations than tasks).
    """
    if not tasks:
        raise ValueError("depth curriculum: no tasks")
    by_depth: dict[int, list[dict]] = {}
    for task in tasks:
        for depth in sorted({target_depth(target) for target in task_targets(task.get("filename"))}):
            by_depth.setdefault(depth, []).append(task)
    groups: list[list[int]] = [[depth] for depth in sorted(by_depth)]
    if merge_first_two and len(groups) >= 2:
        groups[:2] = [groups[0] + groups[1]]
    if len(groups) > merge_after_first_k:
        groups[merge_after_first_k:] = [[d for group in groups[merge_after_first_k:] for d in group]]
    levels = [Level(name="depth " + "+".join(map(str, group)),
                    options=[{"task": t} for depth in group for t in by_depth[depth]])
              for group in groups]
    curriculum = Curriculum(levels, paper_schedule([len(level.options) for level in levels], max_steps))
    return curriculum if index is None else curriculum.only(index)


def paper_schedule(counts: list[int], total: int) -> list[int]:
    """Iterations per level: ``total // sum(counts)`` per task, the remainder to the last level."""
    per_task = total // sum(counts)
    if per_task == 0:
        return proportional_steps(counts, total)
    steps = [per_task * count for count in counts]
    steps[-1] += total - sum(steps)
    return steps


def repo_task(repo: Path, rng: np.random.Generator) -> dict:
    """A 'Find <file>' task for a random allowed file of ``repo`` at depth <= 2."""
    repo = repo.resolve()
    if not repo.is_dir():
        raise UsageError(f"--repo_dir: no such folder {str(repo)!r}")
    # what the copy leaves out (unreadable, a path too long ...) its own log line counts when the episode starts
    candidates = shown_files(repo, Counter(), max_depth=2)
    if not candidates:
        raise UsageError(f"--repo_dir: {repo} has no file with an allowed suffix at depth <= 2")
    target = candidates[int(rng.integers(len(candidates)))]
    task = {"question": f"Find {target.rpartition('/')[2]}", "answer": target, "filename": target,
            "root": str(repo), "n_level": target_depth(target), "model": "play"}
    task["optimal_path"] = optimal_path(task)
    return task
