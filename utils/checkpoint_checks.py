"""Whether a checkpoint fits where it is loaded, said before anything is played or written.

:func:`check_checkpoint` (what it finds: :func:`checkpoint_problems`) checks a folder given as a player's
checkpoint (by a flag, or an evaluation entry) against the place it is loaded into: it must be a whole checkpoint
(``utils/complete.py``) of that player (its ``role.json``, ``utils/checkpoints.py``) with the choice labels of the
model it is loaded on, and an RL checkpoint is compared with this run's settings of what a policy reads
(:class:`CheckSettings`, built once from the flags at the entry point).
"""

import logging
from dataclasses import dataclass, field, fields
from pathlib import Path

from prompts import check_label_file
from utils import complete
from utils.arg_fields import flag_values
from utils.checkpoints import REFLECTOR, RL, ROLE_FILE, read_role, settings_or_none
from utils.errors import UsageError
from utils.log_filters import say_once
from utils.models import policy_labels

logger = logging.getLogger(__name__)

ERROR, WARN = "error", "warning"
_READ = "read"  # a CheckSettings field's metadata: how a checkpoint trained under another value of it counts


def _read(severity: str):
    return field(metadata={_READ: severity})


@dataclass(frozen=True)
class CheckSettings:
    """What a checkpoint is checked against, given explicitly (:meth:`from_args`): the base models it is loaded
    on (``--model_name``; the reflector's, ``--reflect_model_name``) and this run's settings of what a policy reads.

    The settings of what a policy reads are compared between an RL checkpoint's setting.yml (RL played the
    environment under them) and the run that loads it; a flag that is one environment's own is compared only
    in a run of that environment. An SFT checkpoint is not compared: SFT reads a data file, and the
    environment flags in its setting.yml are the defaults, not those the data was written under.

    * ERROR: the policy would read another environment or another arrangement of the texts (where the markers
      stand, which instruction is kept), prompts unlike any it learned from: its figures would measure nothing.
      (Its choice labels, the other such mismatch, are its labels.json's, checked beside these.)
    * WARN: the same kind of prompt with other content (the rules, a history, the map's letters, how long an
      episode may run, how much of a file is shown): playing a policy under them is a fair experiment in how
      it carries over, so it runs, but never silently: the warning names both values.
    """

    model_name: str
    reflect_model_name: str | None
    env: str = _read(ERROR)
    text_layout: str = _read(ERROR)
    horizon: int | None = _read(WARN)
    shuffle_action: bool = _read(WARN)
    with_prompt: bool = _read(WARN)
    with_history: bool = _read(WARN)
    taxi_depot_letters: bool = _read(WARN)
    easy: bool = _read(WARN)
    auto_explore_view_tokens: int = _read(WARN)
    alfworld_history_steps: int = _read(WARN)
    policy_answer: str = "label"  # what a policy checkpoint writes after the marker: compared for SFT and RL alike

    @classmethod
    def from_args(cls, args) -> "CheckSettings":
        return cls(**flag_values(cls, args))


# The settings of what a policy reads (the flags of CheckSettings marked ERROR or WARN), by severity.
READ_SETTINGS: dict[str, str] = {f.name: f.metadata[_READ] for f in fields(CheckSettings) if _READ in f.metadata}


def _not_a_checkpoint(path: str | Path) -> str | None:
    """Why ``path`` is no checkpoint folder (phrased to follow its name), or None."""
    if not str(path).strip():
        return "names no folder"
    path = Path(path)
    if not path.exists():
        return "does not exist"
    if not path.is_dir():
        return "is a file, not a checkpoint folder"
    if not any(path.iterdir()):
        return "is an empty folder"
    inside = complete.numbered_checkpoints(path)
    if inside:
        newest = complete.newest_whole(path)
        return ("is a run folder, not a checkpoint: give one of its checkpoints, e.g. the newest whole one, "
                f"{newest}" if newest else f"is a run folder, not a checkpoint, and none of its {len(inside)} "
                "checkpoints is whole")
    torn = complete.problems(path)[0]
    if torn:
        return torn[0]
    if (path / "adapter_config.json").is_file() or (path / "config.json").is_file():
        return None
    return "is not a checkpoint (it has no adapter_config.json or config.json)"


def checkpoint_problems(settings: CheckSettings, directory: str | Path, player: str) -> tuple[list[str], list[str]]:
    """``(errors, warnings)`` about loading ``directory`` as ``player`` into the run ``settings`` describe, each
    phrased to follow the folder's name. It must be a checkpoint (not missing, a file, empty, or a run folder),
    trained as ``player``, with the choice labels of the model it is loaded on; its base model (a warning: one
    model goes by several names) and, for an RL checkpoint, :data:`READ_SETTINGS` are compared with this run's."""
    shape = _not_a_checkpoint(directory)
    if shape is not None:
        return [shape], []
    path = Path(directory)
    errors, warnings = [], list(complete.problems(path)[1])
    try:
        role = read_role(path)
    except UsageError as error:
        errors.append(f"cannot say what it is: {error}")
        role = None
    if role is None:
        if not errors:
            warnings.append(f"has no {ROLE_FILE} and its run does not tell what it is: whether "
                            f"it is a {player} is not checked")
    elif not role.fits(player):
        errors.append(f"is {role} checkpoint, not a {player}")
    model = settings.reflect_model_name if player == REFLECTOR and settings.reflect_model_name else settings.model_name
    try:
        check_label_file(path, policy_labels(model), model, "checkpoint")
    except UsageError as error:
        errors.append(f"does not fit: {error}")
    saved = settings_or_none(path) or {}
    answer = saved.get("policy_answer", "label")  # checkpoints from before the flag answer with labels
    if role is not None and player != REFLECTOR and answer != settings.policy_answer:
        errors.append(f"was trained to answer with the {answer} (--policy_answer={answer}), and this run reads "
                      f"its answers as the {settings.policy_answer}s")
    if saved.get("model_name", model) != model:
        warnings.append(f"was trained on --model_name={saved['model_name']!r}, and is loaded here on {model!r}")
    if role is not None and role.stage == RL:
        different = _read_differently(settings, saved)
        if different[ERROR]:
            errors.append("was trained reading another environment or text layout: " + "; ".join(different[ERROR]))
        if different[WARN]:
            warnings.append("was trained with other settings of what it reads (this run keeps its own): "
                            + "; ".join(different[WARN]))
    return errors, warnings


def _read_differently(settings: CheckSettings, saved: dict) -> dict[str, list[str]]:
    """The :data:`READ_SETTINGS` on which ``saved`` (a checkpoint's settings) and ``settings`` differ, by severity."""
    from envs import ENVS, env_spec
    from utils.arg_fields import flag_owners

    others = set(flag_owners(ENVS, "own_flags")) - set(env_spec(settings.env).own_flags)  # other envs' own flags
    found: dict[str, list[str]] = {ERROR: [], WARN: []}
    for flag, severity in READ_SETTINGS.items():
        ours = getattr(settings, flag)
        if flag in saved and flag not in others and saved[flag] != ours:
            found[severity].append(f"--{flag}={saved[flag]!r} there, {ours!r} here")
    return found


def describe(where: str, directory: str | Path, phrases: list[str]) -> str:
    """One line: ``where`` (a flag, an evaluation entry's field), the folder, then what :func:`checkpoint_problems`
    says about it."""
    return f"{where} {str(directory)!r} " + "; it ".join(phrases)


def warn_once(where: str, directory: str | Path, warnings: list[str]) -> None:
    """Log each warning about ``directory`` once per process, whichever ``where`` names it (a checkpoint checked
    before an evaluation starts is checked again when it is loaded)."""
    for warning in warnings:
        say_once(logger.name, describe(where, directory, [warning]), key=(str(Path(directory).resolve()), warning))


def check_checkpoint(settings: CheckSettings, directory: str | Path, player: str, where: str) -> None:
    """Stop with one line naming ``where`` (the flag) if ``directory`` cannot be loaded as ``player`` here
    (:func:`checkpoint_problems`); log its warnings, once."""
    errors, warnings = checkpoint_problems(settings, directory, player)
    if errors:
        raise UsageError(describe(where, directory, errors))
    warn_once(where, directory, warnings)
