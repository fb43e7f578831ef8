"""Run directories, their settings, and checkpoints: the only save/load path of training state.

* :func:`make_run_dir` creates ``<ckpt_path>/<id>_<script>/`` and writes its ``setting.yml``;
* :func:`save_checkpoint` / :func:`load_checkpoint` write and restore adapter (or model),
  tokenizer, choice labels (``labels.json``), settings, optimiser, RNG states, step and a
  learner's own state, atomically.
"""

import contextlib
import fcntl
import os
import re
import shutil
import sys
from pathlib import Path

import torch
import yaml
from torch import nn

from prompts import label_alphabet, write_label_file
from utils.io import write_text_atomic
from utils.models import full_head
from utils.seeding import rng_state, set_rng_state

SETTINGS_FILE = "setting.yml"
TRAINER_STATE_FILE = "trainer_state.pt"


# --- run directories and settings -----------------------------------------------------------

@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_RUN_DIR = re.compile(r"(\d+)_(.+)")  # <id>_<script>
_CHECKPOINT_DIR = re.compile(r"checkpoint-(\d+)")


def run_dirs(root: str | Path, script: str | None = None) -> list[Path]:
    """The run directories under ``root`` (of ``script`` only, if given), in id order."""
    root = Path(root)
    found = [(int(m.group(1)), p) for p in (root.iterdir() if root.is_dir() else [])
             if (m := _RUN_DIR.fullmatch(p.name)) and script in (None, m.group(2))]
    return [path for _, path in sorted(found)]


def make_run_dir(args, script: str) -> Path:
    """Create ``<ckpt_path>/<id>_<script>/`` with the next free numeric id and save its settings.

    Ids are unique across scripts and safe when several runs start at once.
    """
    root = Path(args.ckpt_path)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".run_id.lock"):
        runs = run_dirs(root)
        last = int(_RUN_DIR.fullmatch(runs[-1].name).group(1)) if runs else 0
        run_dir = root / f"{last + 1}_{script}"
        run_dir.mkdir()
    save_settings(run_dir, args)
    return run_dir


def save_settings(directory: Path, args) -> None:
    """Write ``setting.yml``: the run's arguments, usable again as ``--config``."""
    header = "# " + " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) + "\n"
    settings = {k: v for k, v in args.to_dict().items() if k != "config"}
    write_text_atomic(Path(directory) / SETTINGS_FILE, header + yaml.safe_dump(settings, sort_keys=False))


def load_settings(directory: str | Path) -> dict:
    path = Path(directory) / SETTINGS_FILE
    if not path.is_file():
        raise ValueError(f"{directory!r} has no {SETTINGS_FILE}")
    return yaml.safe_load(path.read_text(encoding="utf-8"))


# --- checkpoints -------------------------------------------------------------------------------

def save_checkpoint(
    directory: str | Path,
    *,
    model: nn.Module,
    tokenizer,
    args,
    step: int,
    optimizer: torch.optim.Optimizer | None = None,
    state: dict | None = None,
    files: dict[str, str] | None = None,
) -> Path:
    """Save adapter (or model), tokenizer, settings, optimiser, RNG states, step and ``state``
    (plus any text ``files`` by name, e.g. episode logs).

    Written into a scratch folder and renamed into place, so a crash never leaves a
    half-written checkpoint behind.
    """
    directory = Path(directory)
    scratch = directory.with_name(f".{directory.name}.tmp{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    with full_head(model):
        model.save_pretrained(scratch)
    tokenizer.save_pretrained(scratch)
    write_label_file(scratch, label_alphabet(tokenizer), args.model_name)
    save_settings(scratch, args)
    payload = {
        "step": step,
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "rng": rng_state(),
        "state": state or {},
    }
    torch.save(payload, scratch / TRAINER_STATE_FILE)
    for name, text in (files or {}).items():
        (scratch / name).write_text(text, encoding="utf-8")
    if directory.exists():
        old = directory.with_name(f".{directory.name}.old{os.getpid()}")
        os.rename(directory, old)
        os.rename(scratch, directory)
        shutil.rmtree(old)
    else:
        os.rename(scratch, directory)
    return directory


def prune_checkpoints(run_dir: str | Path, keep: int | None) -> list[Path]:
    """Delete all but the newest ``keep`` ``checkpoint-N/`` folders of a run (``--save_total_limit``;
    None keeps all); returns the deleted folders."""
    if keep is None:
        return []
    numbered = [(int(m.group(1)), p) for p in Path(run_dir).iterdir()
                if p.is_dir() and (m := _CHECKPOINT_DIR.fullmatch(p.name))]
    found = [p for _, p in sorted(numbered)]
    doomed = found[:-keep] if keep else found
    for folder in doomed:
        shutil.rmtree(folder)
    return doomed


def load_checkpoint(
    directory: str | Path,
    optimizer: torch.optim.Optimizer | None = None,
    restore_rng: bool = True,
) -> dict:
    """Restore optimiser and RNG states saved by :func:`save_checkpoint`; return
    ``{"step": ..., "state": ...}``. The adapter itself is loaded by the loader."""
    path = Path(directory) / TRAINER_STATE_FILE
    if not path.is_file():
        raise ValueError(f"{directory!r} is not a training checkpoint (no {TRAINER_STATE_FILE})")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if optimizer is not None:
        if payload["optimizer"] is None:
            raise ValueError(f"{path} holds no optimiser state")
        optimizer.load_state_dict(payload["optimizer"])
    if restore_rng:
        set_rng_state(payload["rng"])
    return {"step": payload["step"], "state": payload["state"]}

