"""Finding ALFWorld problems: the data root, the split names and the trial folders.

A problem is one ALFWorld trial folder (``traj_data.json`` + ``initial_state.pddl``) under
``<data root>/<split>/<task family>-<n>/<trial>/`` (or ``<data root>/json_2.1.1/<split>/...``).
:class:`envs.alfworld.ALFWorldEnv` draws the problems it plays from :func:`find_problems`.
"""

import logging
import os
from pathlib import Path

from utils.errors import UsageError

logger = logging.getLogger(__name__)

SPLITS = ("train", "valid_seen", "valid_unseen", "valid_train")
VALID_SPLITS = ("valid_seen", "valid_unseen", "valid_train")  # what split="valid" means
TRIAL_FILES = ("traj_data.json", "initial_state.pddl")


def resolve_data_root(data_root: str | os.PathLike | None) -> Path:
    """The data root from the argument, else ``$ALFWORLD_DATA``."""
    value = data_root or os.environ.get("ALFWORLD_DATA")
    if not value:
        raise UsageError("--alfworld_data: no ALFWorld data root; pass --alfworld_data (data_root=...) or set "
                         "ALFWORLD_DATA")
    root = Path(value).expanduser()
    if not root.is_dir():
        source = "--alfworld_data" if data_root else "$ALFWORLD_DATA"
        raise UsageError(f"{source}: the ALFWorld data root {root} is not a folder")
    return root.resolve()


def split_names(split: str) -> list[str]:
    """``"valid"`` → the three valid_* splits; a comma-separated list → each of its names."""
    names: list[str] = []
    for name in (part.strip() for part in split.split(",")):
        for expanded in VALID_SPLITS if name == "valid" else (name,):
            if expanded and expanded not in names:
                names.append(expanded)
    if not names:
        raise UsageError(f"--alfworld_split: empty ALFWorld split {split!r}; use one of {SPLITS}, 'valid' or a "
                         "comma-separated list")
    return names


def find_problems(root: Path, split: str, task: str) -> list[Path]:
    """Every trial folder of ``split`` whose task folder name starts with ``task``, sorted.

    ``root`` may hold the split folders directly or inside ``json_2.1.1/``.
    """
    root = Path(root)
    problems: set[Path] = set()
    split_dirs = []
    for name in split_names(split):
        split_dir = root / name if (root / name).is_dir() else root / "json_2.1.1" / name
        if not split_dir.is_dir():
            if _holds_tasks(root, task) and not any((root / s).is_dir() for s in SPLITS):
                # A folder of task folders with no split level (e.g. the hand-made fixtures).
                logger.warning("%s has task folders but no split folders: playing them all (split %r ignored)",
                               root, split)
                split_dirs = [root]
                break
            raise UsageError(f"--alfworld_data: no ALFWorld split folder {name!r} in {root} (nor in "
                             f"{root / 'json_2.1.1'}; --alfworld_split {split!r})")
        split_dirs.append(split_dir)
    for split_dir in split_dirs:
        for task_dir in split_dir.iterdir():
            if task_dir.is_dir() and task_dir.name.startswith(task):
                problems.update(trial for trial in task_dir.iterdir() if is_trial(trial))
    if not problems:
        raise UsageError(f"--alfworld_data: no ALFWorld problem in {root} for split {split!r} and task {task!r} "
                         f"(--alfworld_data, --alfworld_split, --alfworld_task)")
    return sorted(problems)


def _holds_tasks(root: Path, task: str) -> bool:
    return any(d.is_dir() and d.name.startswith(task) and any(is_trial(t) for t in d.iterdir())
               for d in root.iterdir())


def is_trial(path: Path) -> bool:
    return path.is_dir() and all((path / name).is_file() for name in TRIAL_FILES)


def _as_trial(path: str | os.PathLike) -> Path:
    trial = Path(path).expanduser().resolve()
    if not is_trial(trial):
        raise ValueError(f"{trial} is not an ALFWorld trial folder: it needs {' and '.join(TRIAL_FILES)}")
    return trial
