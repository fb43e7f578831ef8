"""Run directories, their settings, and checkpoints: the only save/load path of training state.

* :func:`make_run_dir` creates ``<ckpt_path>/<id>_<script>/`` and writes its ``setting.yml``;
* :func:`save_checkpoint` / :func:`load_checkpoint` write and restore adapter (or model),
  tokenizer, choice labels (``labels.json``), settings, optimiser, RNG states, step and a
  learner's own state, atomically;
* every checkpoint says what it is in ``role.json`` (:class:`CheckpointRole`: policy or reflector,
  made by SFT or RL); whether it fits the place it is loaded into (the flag, the player, this run's
  settings) is ``utils/checkpoint_checks.py``'s.
"""

import contextlib
import fcntl
import json
import os
import re
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import yaml
from torch import nn

from prompts import ANALYZE_MARKER, completion_start, label_alphabet, write_label_file
from utils import complete
from utils.errors import UsageError
from utils.io import write_text_atomic
from utils.lm_head import full_head
from utils.paths import SETTINGS_FILE, TRAINER_STATE_FILE  # noqa: F401 (checkpoints.SETTINGS_FILE ...)
from utils.seeding import rng_state, set_rng_state

ROLE_FILE = "role.json"


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
    role: "CheckpointRole | None" = None,
) -> Path:
    """Save adapter (or model), tokenizer, settings, what it is (``role``, default :data:`RL_POLICY`: RL is
    the one caller; SFT's checkpoints are the HF Trainer's, see :func:`write_role`), optimiser, RNG states,
    step and ``state`` (plus any text ``files`` by name, e.g. episode logs).

    Written into a scratch folder, marked whole (:func:`utils.complete.mark`) and renamed into place, so a
    crash or a full disk never leaves a half-written checkpoint behind (a failed save removes its scratch).
    """
    directory = Path(directory)
    scratch = directory.with_name(f".{directory.name}.tmp{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        scratch.mkdir(parents=True)
        with full_head(model):
            model.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        write_label_file(scratch, label_alphabet(tokenizer), args.model_name)
        save_settings(scratch, args)
        write_role(scratch, role or RL_POLICY)
        payload = {
            "step": step,
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "rng": rng_state(),
            "state": state or {},
        }
        torch.save(payload, scratch / TRAINER_STATE_FILE)
        for name, text in (files or {}).items():
            (scratch / name).write_text(text, encoding="utf-8")
        complete.mark(scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if directory.exists():
        old = directory.with_name(f".{directory.name}.old{os.getpid()}")
        os.rename(directory, old)
        os.rename(scratch, directory)
        shutil.rmtree(old)
    else:
        os.rename(scratch, directory)
    return directory


def prune_checkpoints(run_dir: str | Path, keep: int | None) -> list[Path]:
    """Delete all but the newest ``keep`` whole ``checkpoint-N/`` folders of a run (``--save_total_limit``; None
    keeps all), and the torn ones older than the newest whole one; returns the deleted folders. The newest whole
    checkpoint is always kept, so a save cut short by a kill or a full disk still leaves one to resume from."""
    if keep is None:
        return []
    found = complete.numbered_checkpoints(run_dir)
    whole = [path for path in found if complete.is_whole(path)]
    if not whole:
        return []
    kept = whole[-max(keep, 1):]
    doomed = [path for path in found[:found.index(whole[-1])] if path not in kept]
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
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        payload["step"], payload["optimizer"], payload["rng"], payload["state"]  # noqa: B018 (its shape)
    except Exception as error:  # a truncated or overwritten file: the stream reader's own words name no file
        raise UsageError(f"checkpoint {directory}: its {TRAINER_STATE_FILE} is damaged and cannot be read "
                         f"({type(error).__name__}: {' '.join(str(error).split())[:160]})") from None
    if optimizer is not None:
        if payload["optimizer"] is None:
            raise ValueError(f"{path} holds no optimiser state")
        optimizer.load_state_dict(payload["optimizer"])
    if restore_rng:
        set_rng_state(payload["rng"])
    return {"step": payload["step"], "state": payload["state"]}


# --- what a checkpoint is (whether it fits where it is loaded: utils/checkpoint_checks.py) ----------

POLICY, REFLECTOR = "policy", "reflector"  # the two players
SFT, RL = "SFT", "RL"  # the stages that make checkpoints
_STAGE_OF_SCRIPT = {"supervised_pretrain": SFT, "rl_finetune": RL}  # a run folder <id>_<script> -> its stage


@dataclass(frozen=True)
class CheckpointRole:
    """What a checkpoint was trained as: ``role``, :data:`POLICY` or :data:`REFLECTOR` (``policy+reflector``
    from SFT data of both kinds), and the ``stage`` that made it, :data:`SFT` or :data:`RL`."""

    role: str
    stage: str

    def fits(self, player: str) -> bool:
        return player in self.role.split("+")

    def __str__(self) -> str:
        return f"an {self.stage} {self.role.replace('+', ' and ')}"


RL_POLICY = CheckpointRole(POLICY, RL)


def sft_role(texts: list[str]) -> CheckpointRole:
    """What SFT on ``texts`` trains: a reflector on texts that end with a reflection (after the analyze
    marker), a policy on texts that end with a choice label."""
    players = {REFLECTOR if text[:completion_start(text)].endswith(ANALYZE_MARKER) else POLICY for text in texts}
    return CheckpointRole("+".join(sorted(players)), SFT)


def write_role(directory: str | Path, role: CheckpointRole) -> None:
    """Record what the checkpoint in ``directory`` is, as ``role.json``."""
    write_text_atomic(Path(directory) / ROLE_FILE, json.dumps(asdict(role)) + "\n")


def read_role(directory: str | Path) -> CheckpointRole | None:
    """What the checkpoint in ``directory`` is: its ``role.json``, or for one made before checkpoints
    recorded it, what its run tells (:func:`_inferred_role`); None if neither does."""
    path = Path(directory) / ROLE_FILE
    if not path.is_file():
        return _inferred_role(Path(directory))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return CheckpointRole(str(data["role"]), str(data["stage"]))
    except (ValueError, KeyError, TypeError) as error:
        raise UsageError(f"{path} is not a role file ({error})") from None


def _inferred_role(directory: Path) -> CheckpointRole | None:
    """The role of a checkpoint without ``role.json``. Its stage: its run folder's name, or the trainer state
    each stage leaves (ours for RL, the HF Trainer's for SFT). RL trains the policy; SFT trained what its
    ``--reflect`` insisted on, or else what the first text of its ``--task_file`` (if still there) trains."""
    run = _RUN_DIR.fullmatch(directory.resolve().parent.name)
    stage = _STAGE_OF_SCRIPT.get(run.group(2)) if run else None
    if stage is None and (directory / TRAINER_STATE_FILE).is_file():
        stage = RL
    elif stage is None and (directory / "trainer_state.json").is_file():
        stage = SFT
    settings = settings_or_none(directory)
    if stage == RL:
        return RL_POLICY
    if stage is None or settings is None:
        return None
    if settings.get("reflect") is not None:
        return CheckpointRole(REFLECTOR if settings["reflect"] else POLICY, SFT)
    try:
        with open(settings["task_file"], encoding="utf-8") as data:
            first = next(line for line in data if line.strip())
        return sft_role([json.loads(first)["text"]])
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None


def settings_or_none(directory: Path) -> dict | None:
    """The settings saved in ``directory`` (its ``setting.yml``), or None where it has none that can be read."""
    try:
        settings = load_settings(directory)
    except (ValueError, OSError, yaml.YAMLError):
        return None
    return settings if isinstance(settings, dict) else None


def fingerprint(directory: str | Path) -> list:
    """What identifies a checkpoint's contents, cheaply: the name, size and modification time of each of its
    files (one saved again, even under the same name, differs)."""
    return sorted([p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in Path(directory).iterdir() if p.is_file())
