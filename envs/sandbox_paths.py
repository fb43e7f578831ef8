"""Which names and paths a sandbox accepts; see ``envs/sandbox.py`` for the whole picture.

:func:`is_safe_name` decides which directory entries may enter a sandbox copy and
:func:`file_kind` which files AutoExplore works with (:data:`ALLOWED_SUFFIXES`).
:func:`resolve` turns the path in a command into a location that stays inside the copy
(checked one ``lstat``-ed component at a time: no absolute or home paths, no ``..``, no
symlinks), raising :class:`SandboxError` otherwise. :func:`quote_path` and
:func:`printable` write names and untrusted text back into prompts and messages.
"""

import os
import re
import stat

# The one list of file suffixes AutoExplore works with, by kind; the data pipeline
# filters repositories with it too.
ALLOWED_SUFFIXES: dict[str, tuple[str, ...]] = {
    "code": (".py", ".c", ".cpp", ".cxx", ".cc", ".h", ".hpp", ".hxx", ".cs", ".java", ".go", ".ipynb"),
    "data": (".csv", ".tsv"),
    "text": (".txt", ".md", ".rst", ".json", ".yaml", ".yml"),
    "exec": (".sh", ".bash", ".zsh"),
}
_KIND_OF_SUFFIX = {suffix: kind for kind, suffixes in ALLOWED_SUFFIXES.items() for suffix in suffixes}

_UNSAFE_CHARS = frozenset("\"'\\`")
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._/+-]+")


def file_kind(name: str) -> str | None:
    """``"code"``, ``"data"``, ``"text"`` or ``"exec"`` from the suffix of ``name``; None if not allowed."""
    return _KIND_OF_SUFFIX.get(os.path.splitext(name)[1].lower())


def is_safe_name(name: str) -> bool:
    """Whether one path component may enter a sandbox.

    Printable ASCII only (this also excludes the surrogate escapes that stand for
    non-UTF-8 bytes), no quote, backslash or backtick (so a double-quoted name always
    parses back to itself), and not hidden, ``.`` or ``..``. A leading ``~`` is refused
    too: paths starting with it are rejected as home paths, so such a file could never
    be named in a command.
    """
    return (
        bool(name)
        and all(" " <= c <= "~" for c in name)
        and not _UNSAFE_CHARS.intersection(name)
        and name[0] not in ".~"
    )


def quote_path(path: str) -> str:
    """``path`` as it appears in a command: double-quoted unless made of plain characters.

    Safe names hold no ``"`` or ``\\``, so :func:`shlex.split` returns the path unchanged.
    """
    return path if _PLAIN_PATH.fullmatch(path) else f'"{path}"'


def printable(text: str, limit: int = 200) -> str:
    """``text`` on one line of printable ASCII, for echoing untrusted input into a prompt."""
    shown = "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in text[:limit])
    return shown + ("..." if len(text) > limit else "")


class SandboxError(Exception):
    """A command that cannot run; the message becomes the ``Error:`` observation."""


def resolve(root: str, cwd: str, path: str) -> tuple[str, os.stat_result]:
    """The location of ``path`` (relative to ``cwd``) inside ``root``, and its ``lstat``.

    Returns the '/'-separated path relative to ``root`` ('' for the root itself).
    Raises :class:`SandboxError` for anything that is not a plain path to an existing
    entry inside ``root``.
    """
    if not path:
        raise SandboxError("empty path")
    if "\0" in path:
        raise SandboxError("path contains a NUL byte")
    if path.startswith("/"):
        raise SandboxError(f"absolute paths are not allowed: {printable(path)}")
    if path.startswith("~"):
        raise SandboxError(f"home paths are not allowed: {printable(path)}")
    # Empty components (a trailing or doubled '/') are harmless, so accept them.
    parts = [part for part in path.split("/") if part]
    if ".." in parts:
        raise SandboxError(f"'..' is only allowed as the exact command 'cd ..': {printable(path)}")
    for part in parts:
        if not is_safe_name(part):
            raise SandboxError(f"invalid name {printable(part)!r} in path {printable(path)}")
    rel_parts = [part for part in cwd.split("/") if part]
    status = os.lstat(os.path.join(root, *rel_parts))
    for index, part in enumerate(parts):
        if not stat.S_ISDIR(status.st_mode):
            raise SandboxError(f"not a directory: {printable('/'.join(parts[:index]))}")
        rel_parts.append(part)
        try:
            status = os.lstat(os.path.join(root, *rel_parts))
        except FileNotFoundError:
            raise SandboxError(f"no such file or directory: {printable(path)}") from None
        except OSError as error:  # a path longer than the system takes: the copy holds none
            raise SandboxError(f"{error.strerror or type(error).__name__}: {printable(path)}") from None
        if stat.S_ISLNK(status.st_mode):
            raise SandboxError(f"symbolic links are not followed: {printable(path)}")
    full = os.path.join(root, *rel_parts)
    real_root = os.path.realpath(root)
    if os.path.commonpath([os.path.realpath(full), real_root]) != real_root:
        raise SandboxError(f"path leaves the repository: {printable(path)}")
    return "/".join(rel_parts), status
