"""The configurations an evaluation run plays: the list (``EVAL_LOAD_LIST``, ``--eval_load_list``, or the
flags' one), each entry's name, the checks of every entry before any is played, and an entry's key in the
journal. What an entry may say is in ``evaluation/evaluate.py``'s docstring."""

import hashlib
import json
import logging
import os
from pathlib import Path

import yaml

from utils import checkpoints
from utils.checkpoint_checks import CheckSettings, checkpoint_problems, describe, warn_once
from utils.errors import UsageError
from utils.io import read_input

logger = logging.getLogger(__name__)

# The keys of a configuration.
CONFIG_KEYS = ("env", "load_dir", "reflect_load_dir", "name")
# The load_dir of an entry that evaluates the base model (with a fresh LoRA, no adapter): said, as a load_dir
# left out (a slip, a misspelt key) would evaluate it under the entry's name. A folder of that name: ./base.
BASE = "base"


def load_configs(args, eval_load_list: list[dict]) -> list[dict]:
    """The configurations to evaluate (see ``evaluation/evaluate.py``'s docstring), each with its name; all checked
    (:func:`check_configs`) before any is played."""
    configs = [dict(c) if isinstance(c, dict) else c for c in eval_load_list]
    if args.eval_load_list:
        configs += read_eval_load_list(args.eval_load_list)
    from_flags = not configs
    if from_flags:
        # no --load_dir: the base model; --load_dir=base: a folder of that name (BASE is a list entry's word)
        policy = os.path.join(".", BASE) if args.load_dir == BASE else args.load_dir
        configs = [{"env": args.env, "load_dir": policy, "reflect_load_dir": args.reflect_load_dir}]
    elif (args.load_dir or args.reflect_load_dir) and not args.eval_load_list:
        # (beside --eval_load_list, the flags' own "does not apply" warning says it: experiment_args)
        logger.warning("--load_dir and --reflect_load_dir are ignored: EVAL_LOAD_LIST in evaluation/evaluate.py "
                       "names the checkpoints of each configuration")
    for config in configs:
        if isinstance(config, dict):
            config.setdefault("name", default_name(config))
    check_configs(args, configs, from_flags)
    return configs


def policy_dir(config: dict) -> str | None:
    """The checkpoint a configuration's policy loads; None for the base model (``load_dir: base``, or no
    ``--load_dir`` for the one configuration of the flags)."""
    directory = config.get("load_dir")
    return None if directory == BASE else directory


def default_name(config: dict) -> str:
    """The name of a configuration that gives none: its policy's checkpoint (or "base model"), and its
    reflector's where it reads one, so that two entries of one policy with and without a reflector differ."""
    name = policy_dir(config) or "base model"
    reflector = config.get("reflect_load_dir")
    return f"{name} + reflector {reflector}" if isinstance(reflector, str) and reflector else name


def read_eval_load_list(name: str) -> list:
    """The entries of ``--eval_load_list``: a YAML list, not empty."""
    path = Path(name)
    try:
        loaded = yaml.safe_load(read_input(path, "--eval_load_list"))
    except yaml.YAMLError as error:
        raise UsageError(f"--eval_load_list: {path} is not a YAML file ({' '.join(str(error).split())})") from None
    if not isinstance(loaded, list) or not loaded:
        raise UsageError(f"--eval_load_list: {path} must hold a list of {{env, load_dir, reflect_load_dir, name}}, "
                         f"not {'nothing' if not loaded else type(loaded).__name__}")
    return loaded


def check_configs(args, configs: list, from_flags: bool = False) -> None:
    """Stop with one line naming each bad configuration, by number and name, and what is wrong with it
    (:func:`config_problems`), and each name several share (:func:`shared_names`), before any is played; log
    the checkpoints' warnings. ``from_flags``: the one configuration of ``--load_dir`` and
    ``--reflect_load_dir``, named by those flags."""
    bad = [problem for number, config in enumerate(configs, 1)
           if (problem := config_problems(args, config, number, from_flags)) is not None]
    if bad and from_flags:
        raise UsageError("; ".join(bad))
    shared = shared_names(configs)
    if bad or shared:
        said = (f"{len(bad)} of the {len(configs)} evaluation configurations cannot run, so none was played: " if bad
                else "no evaluation configuration was played: ")
        raise UsageError(said + "; ".join(bad + shared))


def shared_names(configs: list) -> list[str]:
    """A phrase for each name that several configurations give: each is a row of the results (and a curve of
    the figures), found by its name, so a shared one would show one configuration's figures for another's."""
    numbers: dict[str, list[int]] = {}
    for number, config in enumerate(configs, 1):
        if isinstance(config, dict) and isinstance(config.get("name"), str):
            numbers.setdefault(config["name"], []).append(number)
    return [f"configurations {', '.join(map(str, found[:-1]))} and {found[-1]} share the name {name!r}; give each "
            f"its own (name: ...)" for name, found in numbers.items() if len(found) > 1]


def config_problems(args, config, number: int, from_flags: bool = False) -> str | None:
    """What is wrong with configuration ``number`` (its keys, its env, its checkpoints:
    ``checkpoint_checks.checkpoint_problems``), in one phrase that names it; None if nothing is."""
    if not isinstance(config, dict):
        return f"configuration {number} is not a mapping of {{env, load_dir, reflect_load_dir, name}}: {config!r}"
    label = f"configuration {number} ({config['name']})"
    problems = []
    unknown = set(config) - set(CONFIG_KEYS)
    if unknown:
        problems.append(f"unknown keys {sorted(unknown)} (known: {', '.join(CONFIG_KEYS)})")
    if config.get("env", args.env) != args.env:
        problems.append(f"it is for env {config['env']!r}, but this run evaluates --env={args.env}")
    if not isinstance(config["name"], str):
        problems.append(f"its name must be a string, not {config['name']!r}")
    if not from_flags and config.get("load_dir") is None:
        problems.append(f"it names no load_dir (give its policy's checkpoint, or load_dir: {BASE} for the base "
                        "model with a fresh LoRA)")
    for key, player in (("load_dir", checkpoints.POLICY), ("reflect_load_dir", checkpoints.REFLECTOR)):
        directory = config.get(key)
        where = f"--{key}" if from_flags else key
        if directory is None or (key, directory) in (("load_dir", BASE), ("reflect_load_dir", "")):
            continue  # the base model (from the flags: no --load_dir); no reflector
        if not isinstance(directory, str):
            problems.append(f"{where} must name a folder, not {directory!r}")
            continue
        errors, warnings = checkpoint_problems(CheckSettings.from_args(args), directory, player)
        if errors:
            problems.append(describe(where, directory, errors))
        warn_once(where if from_flags else f"{label}: {where}", directory, warnings)
    if not problems:
        return None
    return "; ".join(problems) if from_flags else f"{label}: " + "; ".join(problems)


def config_key(config: dict) -> str:
    """A configuration's key in the journal: its name and what its checkpoints hold."""
    held = [checkpoints.fingerprint(directory) if directory else None
            for directory in (policy_dir(config), config.get("reflect_load_dir"))]
    return f"{config['name']}|{hashlib.sha256(json.dumps(held).encode()).hexdigest()[:16]}"
