"""How a flag is declared and checked, for every group of flags (``utils/arg_groups*.py``).

A field's ``help`` is its ``--help`` text, and its ``only_with`` the settings it needs to have any effect
(:class:`Applies`, declared with :func:`_arg`); :func:`applicability` gathers them into the one table of the
"does not apply" warning. The conditions fields name are here, and the checks each group's ``__post_init__``
runs (:func:`need` and the range checks), ending at :class:`_Group`.
"""

from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from utils.cuda import cuda_available

# --- when a flag has an effect: the one table of the "does not apply" warning ---------------------

@dataclass(frozen=True)
class Applies:
    """A setting a flag needs to have any effect: ``where`` names it in the warning, ``holds(args)`` tells
    whether the run has it. ``scripts``: the entry points (``rl_finetune``, ``evaluation.evaluate`` ...; see
    :func:`experiment_args.script_name`) whose runs it describes, for a flag that one script reads under a
    condition and another always (empty: every script's). A field declares it as ``only_with``."""

    where: str
    holds: Callable[[Any], bool]
    scripts: tuple[str, ...] = ()
    not_in: tuple[str, ...] = ()  # the entry points that read the flag without it (of every script else)

    def checked_in(self, script: str | None) -> bool:
        """Whether the condition is asked of a run of ``script`` (None: a script that did not say which)."""
        return (not self.scripts or script in self.scripts) and script not in self.not_in


def _never(args) -> bool:
    return False


RL_SCRIPT, SFT_SCRIPT, EVAL_SCRIPT = "rl_finetune", "supervised_pretrain", "evaluation.evaluate"
# The entry points that play several environments whatever --env says, and the environments' own flags each
# reads there: for them such a flag applies without its --env.
READ_WITHOUT_ENV = {"benchmarks.env_speed": ("alfworld_data", "repo_dir")}
PG = Applies("--trainer pg", lambda a: a.trainer == "pg")
PPO = Applies("--trainer ppo", lambda a: a.trainer == "ppo")
PPO_OR_CLIPPED = Applies("--trainer ppo, grpo or gigpo", lambda a: a.trainer in ("ppo", "grpo", "gigpo"))
REFUEL = Applies("--trainer refuel", lambda a: a.trainer == "refuel")
CLIPPED_GROUP = Applies("--trainer grpo or gigpo", lambda a: a.trainer in ("grpo", "gigpo"))
GIGPO = Applies("--trainer gigpo", lambda a: a.trainer == "gigpo")
PG_OR_GROUP = Applies("--trainer pg, rloo, grpo or gigpo", lambda a: a.trainer in ("pg", "rloo", "grpo", "gigpo"))
NOT_REFUEL = Applies("--trainer pg, ppo, rloo, grpo or gigpo", lambda a: a.trainer != "refuel")
CRITIC = Applies("--baseline critic", lambda a: a.baseline == "critic")
FOUR_BIT = Applies("--load_in_4bit", lambda a: a.load_in_4bit)
NO_CUDA = Applies("no CUDA device", lambda a: not cuda_available())
# A checkpoint given as --load_dir keeps its own LoRA shape; only a new adapter is built from these flags.
NEW_LORA = Applies("--use_peft and without --load_dir, whose adapter keeps its own",
                   lambda a: a.use_peft and not a.load_dir)
WARM_UP = Applies("an --lr_scheduler_type with warm-up, e.g. constant_with_warmup",
                  lambda a: a.lr_scheduler_type != "constant")
DEPTH_CURRICULUM = Applies("--depth_curriculum", lambda a: a.depth_curriculum)
# Evaluation may take its reflectors from --eval_load_list's entries, so there only RL and evaluation say.
REFLECTOR = Applies("a reflector: --reflect_load_dir, --reflect or an --eval_load_list entry's",
                    lambda a: a.use_reflection or bool(a.eval_load_list), scripts=(RL_SCRIPT, EVAL_SCRIPT))
# The reflection memo is exact only where a prompt's reflection is a function of the prompt.
GREEDY_REFLECTIONS = Applies("greedy reflections, --top_k 1", lambda a: a.top_k == 1)
ONLY_SFT = Applies("SFT, supervised_pretrain.py", _never, scripts=(RL_SCRIPT,))
ONLY_EVALUATION = Applies("evaluation, python -m evaluation.evaluate", _never, scripts=(RL_SCRIPT, SFT_SCRIPT))
ONLY_RL = Applies("RL, rl_finetune.py", _never, scripts=(SFT_SCRIPT, EVAL_SCRIPT))
# collect_repos writes the repositories (to --output_dir); the steps after it read them from --repo_dir.
READS_REPOS = Applies("a step that reads repositories; collect_repos writes them to --output_dir", _never,
                      scripts=("data_gen.auto_explore.collect_repos",))
# Evaluation plays --eval_load_list's entries when it is given, each with its own checkpoints.
NO_LOAD_LIST = Applies("an evaluation without --eval_load_list, whose entries name their own checkpoints",
                       lambda a: not a.eval_load_list, scripts=(EVAL_SCRIPT,))
PANEL = Applies("--eval_steps, the RL validation panel", lambda a: a.eval_steps > 0)
API = Applies("--api openai, azure or local", lambda a: a.api != "oracle")

ONLY_WITH = "only_with"  # the field metadata key of its conditions: one Applies, or a tuple of them


def _arg(default, help: str, only_with: Applies | tuple[Applies, ...] = (), **kwargs):
    """A dataclass field carrying its help string, argparse extras such as aliases, and ``only_with``: the
    settings it needs to have an effect (:class:`Applies`), for the "does not apply" warning."""
    conditions = (only_with,) if isinstance(only_with, Applies) else tuple(only_with)
    return field(default=default, metadata={"help": help, **kwargs, **({ONLY_WITH: conditions} if conditions else {})})


def applicability(fields: tuple[Field, ...], specs: dict) -> dict[str, tuple[Applies, ...]]:
    """THE table of the "does not apply" warning: ``{flag: conditions}``, every condition a flag needs to have
    an effect. Each is declared once, beside what it is about: on the field (``only_with``), or, for a flag
    that means something for some environments only, in those environments' specs (``own_flags``)."""
    table = {f.name: f.metadata.get(ONLY_WITH, ()) for f in fields}
    for flag, names in flag_owners(specs, "own_flags").items():
        readers = tuple(script for script, flags in READ_WITHOUT_ENV.items() if flag in flags)
        table[flag] = (*table[flag], Applies(f"--env {' or '.join(names)}", lambda a, names=names: a.env in names,
                                             not_in=readers))
    return {flag: conditions for flag, conditions in table.items() if conditions}


def arg_metadata(f: Field) -> dict:
    """A field's metadata as argparse takes it (without its ``only_with``)."""
    return {key: value for key, value in f.metadata.items() if key != ONLY_WITH}


# The seeds a run takes: NumPy's global generator (utils.seeding.set_seed) accepts no other.
SEEDS = range(2**32)


def need(ok: bool, flag: str, message: str) -> None:
    if not ok:
        raise ValueError(f"--{flag}: {message}")


def flag_owners(specs: dict, kind: str) -> dict[str, list[str]]:
    """``{flag: [environments]}`` over the specs' ``own_flags`` or ``exclusive_flags``."""
    owners: dict[str, list[str]] = {}
    for name, spec in specs.items():
        for flag in getattr(spec, kind):
            owners.setdefault(flag, []).append(name)
    return {flag: sorted(names) for flag, names in owners.items()}


def flag_values(settings_class, args) -> dict:
    """The fields of ``settings_class`` (what one consumer reads of the flags, as a frozen dataclass: the model
    loader's ``utils.models.ModelSettings`` ...), each read from the flag of its name; a list as a tuple, so that
    the settings stay as they were parsed."""
    values = {f.name: getattr(args, f.name) for f in fields(settings_class)}
    return {name: tuple(value) if isinstance(value, list) else value for name, value in values.items()}


def _file_on_the_way(path: Path) -> Path | None:
    """The file that ``path`` is, or lies under (so it can never be a folder), or None."""
    for place in (path, *path.parents):
        if place.exists():
            return None if place.is_dir() else place
    return None


def output_folders(args, *names: str) -> None:
    """The flags ``names`` name folders a run writes into: none may be an existing file, or lie under one."""
    for name in names:
        value = getattr(args, name)
        blocker = _file_on_the_way(Path(value)) if value else None
        if blocker is not None:
            need(False, name, f"{value} is a file, not a folder" if blocker == Path(value)
                 else f"{value} cannot be a folder: {blocker} is a file")


def _at_least(args, minimum, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        need(value is None or value >= minimum, name, f"must be >= {minimum}, got {value}")


def _positive(args, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        need(value is None or value > 0, name, f"must be > 0, got {value}")


def _probability(args, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        need(value is None or 0.0 <= value <= 1.0, name, f"must be in [0, 1], got {value}")


@dataclass
class _Group:
    """End of the ``__post_init__`` chain: each group checks its fields, then calls ``super()``."""

    def __post_init__(self) -> None:
        pass
