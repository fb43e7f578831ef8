"""The words settings come in, read and checked for :func:`experiment_args.parse_args`: a settings file
(``--config``, a resumed run's ``setting.yml``) read as a mapping, the flags a command line gives, and the
one-phrase errors about a file's bad value, a settings check failed on a file's value and an unknown flag."""

import argparse
import difflib
from pathlib import Path

import yaml

from utils.errors import UsageError
from utils.io import read_input


def load_yaml(path: Path, flag: str) -> dict:
    """The mapping of flag names to values in the settings file ``path``, given by ``flag``; a ValueError naming
    both if it is not one."""
    text = read_input(path, flag)
    try:
        values = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"{flag}: {path} is not valid YAML: {' '.join(str(error).split())}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{flag}: {path} must hold a mapping of flag names to values")
    return values


# What a value of each flag type must be, as a file's error says it (argparse's own words name the flag only).
_TYPE_WORDS = {"int": "an integer", "float": "a number", "string_to_bool": "true or false"}


def file_value_problem(parser: argparse.ArgumentParser, key: str, value) -> str | None:
    """What is wrong with a settings file's ``value`` of the flag ``key`` for argparse (its type, its choices, one
    value or a list), in a phrase; None if argparse takes it."""
    action = parser._option_string_actions[f"--{key}"]
    if isinstance(value, list) and action.nargs not in ("+", "*"):
        return f"{value!r} is a list; it takes one value"
    for word in map(str, value if isinstance(value, list) else [value]):
        try:
            converted = action.type(word) if action.type else word
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            return f"{word!r} is not {_TYPE_WORDS.get(getattr(action.type, '__name__', ''), 'a valid value')}"
        if action.choices is not None and converted not in action.choices:
            return f"{word!r} is not one of {tuple(action.choices)}"
    return None


def named_by_file(error: ValueError, origins: dict[str, str]) -> ValueError:
    """A settings check's error (``--name: what``, ``utils.arg_fields.need``) about a value that came from a file,
    said as that file's (``origins``: the file each such value came from), or ``error`` as it is."""
    flag, colon, what = str(error).partition(": ")
    name = flag.removeprefix("--")
    if not colon or not flag.startswith("--") or name not in origins:
        return error
    return UsageError(f"{origins[name]}: {name}: {what}")


def flags_in(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The setting names that ``argv`` gives explicitly (aliases resolved)."""
    options = parser._option_string_actions
    return {options[word.split("=", 1)[0]].dest for word in argv
            if word.startswith("--") and word.split("=", 1)[0] in options}


def unknown_words(parser: argparse.ArgumentParser, words: list[str]) -> str | None:
    """What argparse left unparsed, said in one phrase with the closest known flag for each unknown one (a typo,
    mostly), or None. A word after an unknown flag is taken as that flag's value and not named again."""
    known = [option for option in parser._option_string_actions if option.startswith("--")]
    said, after_flag = [], False
    for word in words:
        if word.startswith("-") and len(word) > 1 and not _is_number(word):
            name = word.split("=", 1)[0]
            spelled = "--" + name.lstrip("-").replace("-", "_")  # --max-step: compared as --max_step
            close = closest(spelled, known)
            said.append(f"unknown flag {name}" + (f" (did you mean {close}?)" if close else ""))
            after_flag = "=" not in word
        elif not after_flag:
            said.append(f"{word!r} follows no flag that takes it")
        else:
            after_flag = False
    return "; ".join(said) + " (all flags: --help)" if said else None


def closest(name: str, known) -> str | None:
    """The known flag or setting name that ``name`` most likely misspells, if one is close enough."""
    return next(iter(difflib.get_close_matches(name, known, n=1, cutoff=0.75)), None)


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True
