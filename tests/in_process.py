"""Run the project's command lines in the test process, as a new ``python`` process would run them, from a
copy of the repository: the seconds of importing torch and transformers are paid once, not per command."""

import contextlib
import functools
import importlib.util
import os
import runpy
import sys
from pathlib import Path

from tests.conftest import REPO


def forget_modules(root: Path) -> dict:
    """Take the project's modules (not the tests') imported from ``root`` out of ``sys.modules``; returns them."""
    library = _resolved(sys.prefix)
    found = {}
    for name, module in list(sys.modules.items()):
        location = getattr(module, "__file__", None)
        if location and name.partition(".")[0] != "tests":
            resolved = _resolved(location)
            if resolved.is_relative_to(root) and not resolved.is_relative_to(library):
                found[name] = sys.modules.pop(name)
    return found


@functools.cache
def _resolved(location: str) -> Path:
    """A module file's resolved path, remembered: a test that runs thirty commands looked at the same 3,500
    modules' paths each time (0.4 s a command), and a file's place does not change within a session."""
    return Path(location).resolve()


@contextlib.contextmanager
def project_from(work: Path):
    """Inside, the project's modules are imported from the copy ``work``, so that its ``paths.REPO_ROOT``,
    from which every default path (``data/...``, ``results/...``) hangs, is the copy; on leaving, the
    checkout's modules are back. Torch and the other libraries stay loaded."""
    saved = forget_modules(REPO)
    sys.path.insert(0, str(work))
    try:
        yield
    finally:
        sys.path.remove(str(work))
        forget_modules(work)
        sys.modules.update(saved)


def run_in_process(words: list[str], work: Path) -> int:
    """``python -m MODULE FLAGS`` or ``python SCRIPT FLAGS`` run in this process as its ``__main__``, with the
    project's modules imported afresh from ``work`` as a new process would (see :func:`project_from`); its
    exit status."""
    forget_modules(work)
    saved = sys.argv
    try:
        if words[1] == "-m":
            sys.argv = [importlib.util.find_spec(words[2]).origin, *words[3:]]
            runpy.run_module(words[2], run_name="__main__")
        else:
            sys.argv = words[1:]
            runpy.run_path(words[1], run_name="__main__")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else int(done.code is not None)
    finally:
        sys.argv = saved
    return 0


@contextlib.contextmanager
def environment(values: dict[str, str]):
    """``os.environ`` replaced by ``values`` inside, restored on leaving."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
