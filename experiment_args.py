"""The settings shared by every script, grouped by purpose and parsed once.

Every entry point (``supervised_pretrain.py``, ``rl_finetune.py``, the evaluation
scripts and the data-generation steps) parses :class:`ScriptArguments` with
:func:`parse_args`, so a flag means the same thing everywhere and a run's
``setting.yml`` can be replayed by any script. ``ScriptArguments`` is composed of one
dataclass per purpose, defined in ``utils/arg_groups.py``, ``utils/arg_groups_model.py`` and
``utils/arg_groups_io.py`` (model, optimisation, environment, RL, curriculum, data, LLM backend,
evaluation, logging); each validates its own fields in ``__post_init__``, and
``ScriptArguments`` the combinations across groups. Nothing changes a setting after
parsing.

Flags keep the names of the paper's README (``--load_dir``, ``--reflect_load_dir``,
``--shrink_head``, ``--depth_curriculum`` ...). Values come from, in increasing
precedence: the defaults of the groups, the saved settings of ``--resume_from``, ``--config
FILE.yaml``, explicit command-line flags. How a settings file and the command line's words are
read, and their errors said: ``utils/arg_words.py``.
"""

import argparse
import contextvars
import dataclasses
import gc
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args, get_type_hints

from transformers import HfArgumentParser

from rl_algorithms.defaults import learner_defaults
from utils import complete
from utils.arg_fields import RL_SCRIPT, SFT_SCRIPT, applicability, arg_metadata, need
from utils.arg_groups import CurriculumArguments, EnvArguments, OptimArguments, RLArguments
from utils.arg_groups_io import DataArguments, EvalArguments, LLMArguments, LoggingArguments
from utils.arg_groups_model import ModelArguments
from utils.arg_words import closest, file_value_problem, flags_in, load_yaml, named_by_file, unknown_words
from utils.cuda import cuda_available
from utils.errors import UsageError
from utils.io import full_disk
from utils.parity import PRESETS
from utils.paths import SETTINGS_FILE, TRAINER_STATE_FILE

logger = logging.getLogger(__name__)

# Flags a resumed run may set differently from the run it continues.
RESUME_MAY_CHANGE = ("max_steps", "save_steps", "logging_steps", "ckpt_path", "resume_from", "config")

# What a script's --resume_from continues from besides setting.yml: the trainer state it wrote there.
RESUME_STATE = {RL_SCRIPT: TRAINER_STATE_FILE, SFT_SCRIPT: "trainer_state.json"}

# The script being parsed for (script_name of parse_args' prog; None: a caller that did not say), read by
# the "does not apply" warning for conditions that hold in some scripts only.
_SCRIPT: contextvars.ContextVar[str | None] = contextvars.ContextVar("script", default=None)


@dataclass
class ScriptArguments(LoggingArguments, EvalArguments, LLMArguments, DataArguments, CurriculumArguments,
                      RLArguments, EnvArguments, OptimArguments, ModelArguments):
    """Every flag of every script: the groups above, composed (fields in the groups' order)."""

    def __post_init__(self) -> None:
        for name, hint in get_type_hints(ScriptArguments).items():
            if getattr(hint, "__origin__", None) is Literal:
                allowed = get_args(hint)
                need(getattr(self, name) in allowed, name, f"{getattr(self, name)!r} is not one of {allowed}")
        super().__post_init__()
        if self.taxi_curriculum and self.curriculum_index is not None:
            from envs.taxi import CURRICULA

            levels = ", ".join(f"{i} ({name})" for i, name in enumerate(CURRICULA))
            need(self.curriculum_index < len(CURRICULA), "curriculum_index",
                 f"Taxi has levels {levels}; got {self.curriculum_index}")
        if self.curriculum_steps is not None:
            need(sum(self.curriculum_steps) == self.max_steps, "curriculum_steps",
                 f"{self.curriculum_steps} sum to {sum(self.curriculum_steps)}, but --max_steps is {self.max_steps}")
        self._warn_inapplicable()
        self._fall_back_without_cuda()

    def _warn_inapplicable(self) -> None:
        """One warning naming every flag set (away from its default, or its --preset's value) where it has no
        effect: the conditions of :func:`utils.arg_fields.applicability`, those of this script included."""
        from envs import ENVS

        fields = dataclasses.fields(self)
        chosen = {f.name: f.default for f in fields} | learner_defaults(self.trainer) | PRESETS.get(self.preset, {})
        script = _SCRIPT.get()
        idle = []
        for name, conditions in applicability(fields, ENVS).items():
            if getattr(self, name) == chosen[name]:
                continue
            unmet = [c for c in conditions if c.checked_in(script) and not c.holds(self)]
            if unmet:
                idle.append(f"--{name} (only with {unmet[0].where})")
        if idle:
            logger.warning("these settings do not apply to this run and are ignored: %s", ", ".join(idle))

    def _fall_back_without_cuda(self) -> None:
        """Let the paper's GPU defaults (8-bit, bf16) run on a CPU-only machine: float32, or bfloat16
        with ``--cpu_bf16``."""
        off = ("load_in_8bit", "load_in_4bit", "fp16") + (() if self.cpu_bf16 else ("bf16",))
        wanted = [name for name in off if getattr(self, name)]
        cuda_optim = self.optim.startswith("paged_") or "8bit" in self.optim  # bitsandbytes optimisers
        if not (wanted or self.cpu_bf16 or cuda_optim) or _cuda_available():
            return
        for name in wanted:
            setattr(self, name, False)  # part of parsing: the instance is not handed out before this
        if cuda_optim:
            wanted.append(f"optim={self.optim} (now adamw_torch)")
            self.optim = "adamw_torch"
        self.bf16 = self.cpu_bf16
        if wanted:
            # Said when a model is loaded (report_cpu_fallback): steps that only call an API stay quiet.
            self._cpu_fallback = (f"No CUDA device: {', '.join(f'--{n}' for n in wanted)} turned off; the model runs "
                                  f"in {'bfloat16 (--cpu_bf16)' if self.bf16 else 'float32'} on the CPU.")

    def report_cpu_fallback(self) -> None:
        """Warn, once, that the paper's GPU settings were turned off on this CPU-only machine."""
        note = self.__dict__.pop("_cpu_fallback", None)
        if note:
            logger.warning(note)

    @property
    def use_reflection(self) -> bool:
        """Whether RL and evaluation put a reflection in the policy prompt."""
        return bool(self.reflect_load_dir) if self.reflect is None else self.reflect

    @property
    def multi_level_curriculum(self) -> bool:
        """Whether the curriculum splits --max_steps over several levels."""
        return (self.taxi_curriculum or self.depth_curriculum) and self.curriculum_index is None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


GROUPS = (ModelArguments, OptimArguments, EnvArguments, RLArguments, CurriculumArguments, DataArguments,
          LLMArguments, EvalArguments, LoggingArguments)


def _cuda_available() -> bool:
    return cuda_available()


def require_env(args: ScriptArguments, env: str, script: str) -> None:
    """For a script that works on one environment only (its parser defaults ``--env`` to it)."""
    need(env == args.env, "env", f"{script} works on --env={env} only, got {args.env}")


def check_resume(args: ScriptArguments, only: set[str] | None = None, saved: dict | None = None) -> None:
    """Refuse to resume ``args.resume_from`` with settings that would not continue that run.

    Compares the flags in ``only`` (default: all) with the checkpoint's ``setting.yml``;
    those in :data:`RESUME_MAY_CHANGE` may differ, and ``--max_steps`` only without a
    multi-level curriculum (its level boundaries are fractions of ``--max_steps``).
    ``saved``: the checkpoint's settings, if the caller has read them already.
    """
    if saved is None:
        saved = load_yaml(Path(args.resume_from) / SETTINGS_FILE, "--resume_from")
    names = [f.name for f in dataclasses.fields(args) if only is None or f.name in only]
    different = [f"--{name}={saved[name]!r} there, {getattr(args, name)!r} here" for name in names
                 if name in saved and name not in RESUME_MAY_CHANGE and saved[name] != getattr(args, name)]
    if args.multi_level_curriculum and saved.get("max_steps", args.max_steps) != args.max_steps:
        different.append(f"--max_steps={saved['max_steps']!r} there, {args.max_steps!r} here (the curriculum "
                         "splits its levels over --max_steps)")
    if different:
        raise ValueError(f"--resume_from: {args.resume_from} was trained with other settings: " + "; ".join(different))


class _GroupedParser(HfArgumentParser):
    """HfArgumentParser that lists each group's flags under its title in ``--help``."""

    def _add_dataclass_arguments(self, dtype) -> None:
        hints = get_type_hints(dtype)
        for group in GROUPS:
            section = self.add_argument_group(group.TITLE)
            for f in dataclasses.fields(group):
                clone = dataclasses.field(default=f.default, default_factory=f.default_factory,
                                          metadata=arg_metadata(f))
                clone.name, clone.type = f.name, hints[f.name]
                self._parse_dataclass_field(section, clone)
                negation = self._actions[-1]
                if isinstance(negation, argparse._StoreFalseAction) and negation.dest == f.name:
                    # transformers gives ``--no_X`` X's own help and "(default: False)", which reads as if X were off
                    negation.help, negation.default = f"Turn --{f.name} off (it is on by default).", argparse.SUPPRESS
                if clone.type == bool | None:
                    # A bare ``--reflect`` means True, as for the plain bool flags.
                    self._actions[-1].nargs, self._actions[-1].const = "?", True


def build_parser(prog: str | None = None) -> HfArgumentParser:
    return _GroupedParser(ScriptArguments, prog=prog, allow_abbrev=False,
                          usage="%(prog)s [flags]   (all flags: --help)",
                          description="Reflect-RL: every script shares these flags.")


def _to_argv(values: dict, source: str, parser: argparse.ArgumentParser | None = None,
             over: frozenset[str] = frozenset()) -> list[str]:
    """Flag values (from a YAML file) as command-line words, so argparse checks their types. With ``parser``,
    the values of a settings file: each is checked first as its flag's would be
    (:func:`utils.arg_words.file_value_problem`), a bad one an error naming ``source`` (the file) and the key, and
    those of ``over`` (the names a later source gives, whose value wins) are left out, unchecked."""
    known = {f.name for f in dataclasses.fields(ScriptArguments)}
    unknown = sorted(set(values) - known)
    if unknown:
        close = {key: closest(str(key), known) for key in unknown}
        hints = "; ".join(f"{key!r}: did you mean {match!r}?" for key, match in close.items() if match)
        raise ValueError(f"{source} has unknown keys {unknown}" + (f" ({hints})" if hints else ""))
    argv: list[str] = []
    for key, value in values.items():
        if key == "config" or value is None or key in over:
            continue
        problem = None if parser is None else file_value_problem(parser, key, value)
        if problem:
            raise UsageError(f"{source}: {key}: {problem}")
        if isinstance(value, list):
            argv += [f"--{key}", *map(str, value)]
        else:
            argv.append(f"--{key}={value}")
    return argv


def parse_args(argv: list[str] | None = None, prog: str | None = None, env: str | None = None) -> ScriptArguments:
    """Parse ``argv`` (default ``sys.argv[1:]``) over ``--config`` over ``--resume_from``'s saved settings.

    ``env``: the one environment a script works on (a data step for Taxi, say); it is then
    the default of ``--env`` and any other value is an error.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    if env is not None:
        parser.set_defaults(env=env)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    pre.add_argument("--resume_from")
    pre.add_argument("--preset")
    known, _ = pre.parse_known_args(argv)
    script = script_name(parser.prog)
    try:
        config = load_yaml(Path(known.config), "--config") if known.config else {}
        # A file's value that fails its check is said as the file's; an explicit flag's as the flag's.
        given = frozenset(flags_in(parser, argv))
        config_source = f"--config: {known.config}"
        explicit = _to_argv(config, config_source, parser, over=given) + argv
        resume_from = known.resume_from or config.get("resume_from")
        saved = {}
        if resume_from:
            check_resumable(Path(resume_from), script, parser.prog)
            saved = load_yaml(Path(resume_from) / SETTINGS_FILE, "--resume_from")
        # Precedence, lowest first: a resumed run's settings, the preset, --config, the command line.
        preset = known.preset or config.get("preset") or saved.get("preset")
        preset_values = PRESETS.get(preset, {})
        preset_argv = _to_argv(preset_values, f"--preset={preset}")
        saved_source = f"--resume_from: {resume_from}/{SETTINGS_FILE}"
        origins = {**{name: saved_source for name in saved}, **{name: config_source for name in config}}
        origins = {name: where for name, where in origins.items()
                   if name not in given and (where == config_source or name not in preset_values)}
        parsing = _SCRIPT.set(script)
        try:
            words = _to_argv({k: v for k, v in saved.items() if k not in ("resume_from", "config")}, saved_source,
                             parser, over=given | set(config) | set(preset_values)) + preset_argv + explicit
            try:
                args, remaining = parser.parse_args_into_dataclasses(args=words, look_for_args_file=False,
                                                                     return_remaining_strings=True)
            except ValueError as error:  # a settings check (__post_init__)
                raise named_by_file(error, origins) from None
            if remaining:
                raise UsageError(unknown_words(parser, remaining))
        finally:
            _SCRIPT.reset(parsing)
        if env is not None:
            require_env(args, env, parser.prog)
        if args.resume_from:
            check_resume(args, only=flags_in(parser, explicit), saved=saved)
    except ValueError as error:
        parser.error(str(error))
    return args


def script_name(prog: str) -> str:
    """The entry point a ``prog`` names: ``rl_finetune`` for ``rl_finetune.py``, ``evaluation.evaluate`` for
    ``python -m evaluation.evaluate``."""
    word = prog.split()[-1] if prog.split() else prog
    return word.removesuffix(".py").replace("/", ".")


def check_resumable(path: Path, script: str, prog: str) -> None:
    """``--resume_from`` must be a checkpoint folder that ``script`` wrote (it holds that script's trainer
    state, :data:`RESUME_STATE`): another script's checkpoint would hand this run its settings, an SFT data
    file as RL's task file, say, and the error would be about that file."""
    if not path.is_dir():
        raise UsageError(f"--resume_from: no such checkpoint folder {str(path)!r}")
    state = RESUME_STATE.get(script)
    if state is None or (path / state).is_file():
        complete.clean_scratch(path.parent)  # what a kill left beside it: said, and put right
        torn = complete.problems(path)[0]
        if torn and state is not None:
            newest = complete.newest_whole(path.parent)
            raise UsageError(f"--resume_from: {path} {torn[0]}" + (f"; its run's newest whole one is {newest}"
                                                                    if newest else ""))
        return
    writer = next((name for name, file in RESUME_STATE.items() if (path / file).is_file()), None)
    if writer is None:
        raise UsageError(f"--resume_from: {path} is no checkpoint of {prog} (it has no {state})")
    start = f" (to start RL from it, give --load_dir {path})" if script == RL_SCRIPT else ""
    raise UsageError(f"--resume_from: {path} is a checkpoint of {writer}.py; {prog} continues its own runs "
                     f"only{start}")


def run_script(main, prog: str, env: str | None = None, defaults: tuple[str, ...] = ()) -> int:
    """An entry point: parse the command line (after ``defaults``, flags the script sets unless the command line
    does), run ``main(args)``; a :class:`errors.UsageError` (a model without enough labels, data of another
    alphabet ...) ends it with one line, status 2."""
    args = parse_args([*defaults, *sys.argv[1:]], prog=prog, env=env)
    return one_line_usage_errors(prog, main, args)


def one_line_usage_errors(prog: str, main, *arguments) -> int:
    """``main(*arguments)``, where a :class:`errors.UsageError` (or a full disk, :func:`utils.io.full_disk`) ends
    the program with one line and status 2 (the entry points that parse their own command line:
    ``benchmarks.rl_iteration`` ...). The line comes last: what the stopped work still held (a progress bar that
    redraws itself when it closes) is let go first."""
    try:
        return main(*arguments)
    except UsageError as error:
        said = str(error)
    except Exception as error:  # a full disk, said below the top (then a file's close failed too) or nowhere
        full = full_disk(error)
        if full is None:
            raise
        said = str(full)
        del full
    gc.collect()  # the frames of the failed work, and the progress bars in them, close here
    print(f"{prog}: error: {said}", file=sys.stderr, flush=True)
    return 2
