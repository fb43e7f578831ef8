"""Whole checkpoints, or refused: a checkpoint folder counts only once its ``complete.json`` is written, last,
listing each of its files with its size.

* :func:`mark` writes it when every file is in place (RL's :func:`utils.checkpoints.save_checkpoint`, into its
  scratch folder before the rename; SFT's, after the HF Trainer's files and the project's own);
* :func:`problems` says why a folder is no whole checkpoint (no marker: torn by a kill or a full disk; a file
  missing, or of another size than when it was saved: damaged) before any loader reads it, so a torn or damaged
  checkpoint is refused in one line naming the folder and the file, and a missing adapter never sends peft to
  the hub;
* :func:`clean_scratch` removes what a killed save left in a run folder (RL's ``.checkpoint-N.tmp<pid>``);
* ``python -m utils.complete DIR`` vouches for a checkpoint saved before checkpoints carried a marker.

A folder with neither a marker nor any file of this project's runs (a bare peft adapter from elsewhere) is not a
run's checkpoint: it is loaded with a warning, if its weights are there.
"""

import json
import logging
import os
import re
import shutil
import sys
from pathlib import Path

from utils.io import write_text_atomic
from utils.paths import SETTINGS_FILE, TRAINER_STATE_FILE

logger = logging.getLogger(__name__)

MARKER = "complete.json"
# What one of this project's runs leaves in every checkpoint (a folder holding any of them is a run's, and without
# a marker is torn): the settings, and the trainer state, RL's or the HF Trainer's
RUN_FILES = (SETTINGS_FILE, TRAINER_STATE_FILE, "trainer_state.json")
# The weights a loader reads: a peft adapter's, or a whole model's (--no_use_peft)
WEIGHTS = {"adapter_config.json": ("adapter_model.safetensors", "adapter_model.bin"),
           "config.json": ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")}
_SCRATCH = re.compile(r"\.(?P<name>checkpoint-\d+)\.(?P<kind>tmp|old)(?P<pid>\d+)")  # RL's, nothing else


def mark(directory: str | Path) -> Path:
    """Write ``directory``'s marker: its files and their sizes. Call it when every file is written."""
    directory = Path(directory)
    files = {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file() and p.name != MARKER}
    path = directory / MARKER
    write_text_atomic(path, json.dumps({"files": files}, indent=1) + "\n")
    return path


def is_whole(directory: str | Path) -> bool:
    return (Path(directory) / MARKER).is_file() and not problems(directory)[0]


def problems(directory: str | Path) -> tuple[list[str], list[str]]:
    """``(errors, warnings)`` on whether ``directory`` is a whole checkpoint, each phrased to follow its name."""
    directory = Path(directory)
    marker = directory / MARKER
    if not marker.is_file():
        return _unmarked(directory)
    try:
        files = json.loads(marker.read_text(encoding="utf-8"))["files"]
        sizes = {str(name): int(size) for name, size in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return [f"is damaged: its {MARKER} cannot be read ({type(error).__name__}: {error})"], []
    for name, size in sizes.items():
        path = directory / name
        if not path.is_file():
            return [f"is damaged: its {name} is missing (listed in its {MARKER})"], []
        actual = path.stat().st_size
        if actual != size:
            return [f"is damaged: its {name} holds {actual} bytes, {size} when it was saved"], []
    return [], []


def _unmarked(directory: Path) -> tuple[list[str], list[str]]:
    weights = [(config, names) for config, names in WEIGHTS.items() if (directory / config).is_file()]
    ours = [name for name in RUN_FILES if (directory / name).is_file()]
    if ours:
        return [f"is torn: it has no {MARKER}, written once all its files are (a kill or a full disk while it was "
                "saved?)"], []
    for config, names in weights:
        if not any((directory / name).is_file() for name in names):
            return [f"is incomplete: it has {config} but no {' or '.join(names)}"], []
    return [], [f"is not a checkpoint of this project's runs (no {MARKER}, {' or '.join(RUN_FILES)}): it is loaded "
                "as it is"]


def whole_checkpoints(run_dir: str | Path) -> list[Path]:
    """A run folder's whole ``checkpoint-N/`` folders, oldest first."""
    return [path for path in numbered_checkpoints(run_dir) if is_whole(path)]


def numbered_checkpoints(run_dir: str | Path) -> list[Path]:
    """A run folder's ``checkpoint-N/`` folders, whole or not, in step order."""
    run_dir = Path(run_dir)
    found = [(int(m.group(1)), p) for p in (run_dir.iterdir() if run_dir.is_dir() else [])
             if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name))]
    return [path for _, path in sorted(found)]


def newest_whole(run_dir: str | Path) -> Path | None:
    found = whole_checkpoints(run_dir)
    return found[-1] if found else None


def resume_hint(run_dir: str | Path) -> str:
    """What a user does after a run stopped part-way (a full disk): resume from its newest whole checkpoint."""
    newest = newest_whole(run_dir)
    if newest is None:
        return f"it had saved no whole checkpoint yet ({run_dir}): free some space, then run the same command again"
    return f"its checkpoints up to {newest.name} are whole: free some space, then add --resume_from={newest}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_scratch(run_dir: str | Path) -> list[str]:
    """Remove what a killed save left in ``run_dir``: a scratch folder of a process no longer running (a kill
    while RL wrote a checkpoint), or, where a kill came between moving an old checkpoint aside and renaming its
    replacement in, put the whole one of the two in place. Each is said in one line; returns the lines."""
    said = []
    run_dir = Path(run_dir)
    for path in sorted(run_dir.iterdir()) if run_dir.is_dir() else []:
        found = _SCRATCH.fullmatch(path.name)
        if not found or not path.is_dir() or _alive(int(found["pid"])):
            continue
        target = run_dir / found["name"]
        if found["kind"] == "tmp" and not target.exists() and is_whole(path):
            os.rename(path, target)
            line = f"{path} was a whole checkpoint a killed run had not renamed yet: now {target}"
        elif found["kind"] == "old" and not target.exists():
            os.rename(path, target)
            line = f"{path} was a checkpoint a killed run had moved aside: back at {target}"
        else:
            shutil.rmtree(path)
            line = f"removed {path}, a scratch folder left by a killed run"
        logger.warning(line)
        said.append(line)
    return said


def main(argv: list[str] | None = None) -> int:
    """``python -m utils.complete DIR ...``: mark checkpoints saved before markers existed as whole."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m utils.complete", description=(
        "Mark checkpoint folders you know to be whole (saved before checkpoints carried complete.json) as whole."))
    parser.add_argument("checkpoints", nargs="+", type=Path, metavar="CHECKPOINT_DIR")
    for folder in parser.parse_args(argv).checkpoints:
        if not folder.is_dir():
            parser.error(f"{folder} is not a folder")
        print(f"marked {folder} whole: {mark(folder)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
