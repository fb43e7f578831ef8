"""A private, read-only view of a repository that AutoExplore commands run against.

Nothing here calls a shell. Commands are parsed with :func:`shlex.split` and carried
out in Python over a private copy of the repository, so the agent (or an API model in
evaluation) can only read, list and move inside that copy:

* the copy holds only regular files and directories with safe names: symlinks (at any
  depth), hidden entries, FIFOs, sockets, devices, oversized files, names that could
  confuse a prompt or a parser (:func:`is_safe_name`), entries it cannot read and paths
  longer than the system takes are never copied (each skip counted by reason and logged);
* a path is resolved one component at a time with ``os.lstat`` and must stay inside
  the copy: no absolute paths, no ``~``, no ``..`` (except the exact command ``cd ..``);
* files are opened with ``O_NOFOLLOW`` and read up to a byte bound.

Copies come in two layers. :func:`pristine_copy` copies a source repository once per
process (cached, removed at exit). :class:`Sandbox` is one episode's view: the pristine
copy itself, or, when entries are left out, a hard-link tree of it removed on ``close()``.
Both live in the process's scratch folder (``envs/scratch.py``), which the next start removes
if the process was killed before it could.

This module holds :class:`Sandbox`, the command interpreter, and the file views its
``cat``, ``head`` and ``tail`` show. The checks on names and paths (:func:`is_safe_name`,
:func:`resolve`, ...) are in ``envs/sandbox_paths.py``; the copies (:func:`pristine_copy`,
:func:`link_tree`) in ``envs/sandbox_copy.py``.
"""

import os
import re
import shlex
import shutil
import stat
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import dataclass

# quote_path and MAX_COPY_BYTES are not used here; they stay importable from envs.sandbox for
# envs/auto_explore.py and data_gen/auto_explore/filter_repo.py.
from envs.sandbox_copy import MAX_COPY_BYTES, link_tree, pristine_copy  # noqa: F401
from envs.sandbox_paths import SandboxError, file_kind, is_safe_name, printable, quote_path, resolve  # noqa: F401

# How many lines `cat` shows per kind; any other file shows OTHER_CAT_LINES.
CAT_LINES = {"code": 1000, "data": 5, "text": 100}
OTHER_CAT_LINES = 10
HEAD_TAIL_LINES = 10
# Every file view is also capped at about this many tokens, approximated by TOKEN_RE
# pieces, and at MAX_SHOWN_CHARS characters (a single huge "word" is one piece).
MAX_TOKENS = 500
MAX_SHOWN_CHARS = 4000
TOKEN_RE = re.compile(r"\w+|[^\w\s]")

MAX_READ_BYTES = 256 * 1024  # a command reads at most this much of a file
MAX_COMMAND_CHARS = 1000

_SHELL_OPERATORS = frozenset({";", "|", "||", "&", "&&", ">", ">>", "<", "<<", "2>", "&>"})


# --- file views ----------------------------------------------------------------------


def _read(path: str, from_end: bool = False) -> tuple[str, bool]:
    """Up to MAX_READ_BYTES of the regular file ``path`` (its start, or its end) and whether that is all of it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise SandboxError(f"cannot open file: {e.strerror}") from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise SandboxError("not a regular file")
        complete = status.st_size <= MAX_READ_BYTES
        if from_end and not complete:
            os.lseek(fd, status.st_size - MAX_READ_BYTES, os.SEEK_SET)
        data = os.read(fd, MAX_READ_BYTES)
    finally:
        os.close(fd)
    text = data.decode("utf-8", errors="replace")
    if from_end and not complete:
        text = text.partition("\n")[2]  # drop the partial first line
    return text, complete


def cap_tokens(text: str, max_tokens: int = MAX_TOKENS, from_end: bool = False) -> tuple[str, bool]:
    """Keep the first (or last) ``max_tokens`` approximate tokens of ``text``; also whether it was cut."""
    window = text[-MAX_SHOWN_CHARS - 1:] if from_end else text[: MAX_SHOWN_CHARS + 1]
    pieces = list(TOKEN_RE.finditer(window))
    if from_end:
        cut = pieces[-max_tokens].start() if len(pieces) > max_tokens else 0
        kept = window[max(cut, len(window) - MAX_SHOWN_CHARS):]
    else:
        cut = pieces[max_tokens - 1].end() if len(pieces) > max_tokens else len(window)
        kept = window[: min(cut, MAX_SHOWN_CHARS)]
    return kept, len(kept) < len(text)


def cat_view(path: str, kind: str | None, max_tokens: int = MAX_TOKENS) -> str:
    """What ``cat`` shows of ``path``: a kind-dependent number of lines and at most ~``max_tokens`` tokens."""
    text, complete = _read(path)
    lines = text.splitlines()
    if not lines:
        return "(empty file)"
    limit = CAT_LINES.get(kind, OTHER_CAT_LINES)
    body, token_cut = cap_tokens("\n".join(lines[:limit]), max_tokens)
    if len(lines) <= limit and not token_cut and complete:
        return body
    shown = len(body.splitlines())
    total = f"{len(lines)}" if complete else f"more than {len(lines)}"
    reason = f"~{max_tokens}-token limit" if token_cut else f"{limit}-line limit for this file type"
    return f"{body}\n[output cut ({reason}): showed {shown} of {total} lines]"


def head_tail_view(path: str, tail: bool, max_tokens: int = MAX_TOKENS) -> str:
    text, _ = _read(path, from_end=tail)
    lines = text.splitlines()
    if not lines:
        return "(empty file)"
    picked = lines[-HEAD_TAIL_LINES:] if tail else lines[:HEAD_TAIL_LINES]
    body, token_cut = cap_tokens("\n".join(picked), max_tokens, from_end=tail)
    if token_cut:
        where = "last" if tail else "first"
        body += f"\n[output cut (~{max_tokens}-token limit): showed the {where} {len(body.splitlines())} lines]"
    return body


# --- the episode view -----------------------------------------------------------------


@dataclass
class CommandResult:
    """What one command did.

    ``name`` is the command word (``cd``, ``ls``, ``cat``, ``head``, ``tail``, ``id``) and
    ``path`` the location it acted on, relative to the sandbox root ('' is the root);
    both are None for an error. ``text`` is the output shown to the agent.
    """

    text: str
    error: bool = False
    name: str | None = None
    path: str | None = None


def _error(message: str) -> CommandResult:
    return CommandResult(text=f"Error: {message}", error=True)


class Sandbox:
    """One episode's view of a repository, with a current directory.

    With ``leave_out`` (passed to :func:`link_tree`) the view is a copy of its own, removed by
    :meth:`close` (safe to call twice) or, failing that, when the object is collected or at exit.
    Without it the view is the process's pristine copy itself: no command writes, and an episode
    copy's files are hard links to the pristine ones anyway, so a copy with nothing left out would
    only repeat its folders (it was most of an AutoExplore reset's time); ``close`` then only ends
    the view.
    """

    COMMANDS = ("cd", "ls", "cat", "head", "tail", "id")

    def __init__(self, source: str | os.PathLike, leave_out: Callable[[str, bool], bool] | None = None,
                 parent: str | os.PathLike | None = None, view_tokens: int = MAX_TOKENS):
        if view_tokens < 1:
            raise ValueError(f"view_tokens must be >= 1, got {view_tokens}")
        self.view_tokens = view_tokens  # the most (approximate) tokens a cat/head/tail shows
        pristine = pristine_copy(source, parent)
        if leave_out is None:
            self.root = pristine
            self._closer = weakref.finalize(self, lambda: None)
        else:
            # Next to the pristine copy (one file system, for the hard links).
            self.root = tempfile.mkdtemp(prefix="auto_explore_episode_", dir=os.path.dirname(pristine))
            self._closer = weakref.finalize(self, shutil.rmtree, self.root, ignore_errors=True)
            link_tree(pristine, self.root, leave_out)
        self.cwd = ""

    def close(self) -> None:
        self._closer()

    @property
    def closed(self) -> bool:
        return not self._closer.alive

    def abspath(self, rel: str) -> str:
        return os.path.join(self.root, *[part for part in rel.split("/") if part])

    def entries(self, rel: str | None = None) -> tuple[list[str], list[str]]:
        """Sorted (subdirectories, allowed files) of directory ``rel`` (default: the cwd)."""
        dirs, files = [], []
        with os.scandir(self.abspath(self.cwd if rel is None else rel)) as it:
            for entry in it:
                if not is_safe_name(entry.name) or entry.is_symlink():
                    continue
                if entry.is_dir(follow_symlinks=False):
                    dirs.append(entry.name)
                elif entry.is_file(follow_symlinks=False) and file_kind(entry.name):
                    files.append(entry.name)
        return sorted(dirs), sorted(files)

    def listing(self, rel: str | None = None) -> str:
        """The sorted entries of a directory, one a line, directories with a trailing '/'."""
        dirs, files = self.entries(rel)
        names = sorted([d + "/" for d in dirs] + files, key=lambda n: n.rstrip("/"))
        return "\n".join(names) if names else "(empty directory)"

    def execute(self, command: str) -> CommandResult:
        """Run one command; a bad command gives an ``Error:`` result, it never raises."""
        try:
            return self._execute(command)
        except SandboxError as e:
            return _error(str(e))
        except OSError as e:
            return _error(f"{e.strerror or type(e).__name__}: {printable(command)}")

    def _execute(self, command: str) -> CommandResult:
        if not isinstance(command, str):
            raise TypeError(f"a command is a str, got {type(command).__name__}")
        if len(command) > MAX_COMMAND_CHARS:
            raise SandboxError(f"command longer than {MAX_COMMAND_CHARS} characters")
        if not all(" " <= c <= "~" for c in command):
            raise SandboxError(f"commands hold printable ASCII characters only: {printable(command)}")
        try:
            words = shlex.split(command)
        except ValueError as e:
            raise SandboxError(f"cannot parse command ({e}): {printable(command)}") from None
        if not words:
            raise SandboxError("empty command")
        name, args = words[0], words[1:]
        if name not in self.COMMANDS:
            raise SandboxError(f"unknown command {printable(name)!r}; use one of {', '.join(self.COMMANDS)}")
        operators = _SHELL_OPERATORS.intersection(args)
        if operators:
            raise SandboxError(f"shell operators are not supported: {' '.join(sorted(operators))}")
        if name == "ls" and len(args) <= 1:
            return self._ls(args[0] if args else None)
        if len(args) != 1:
            usage = "ls [DIR]" if name == "ls" else f"{name} {'DIR' if name == 'cd' else 'FILE'}"
            raise SandboxError(f"{name} takes exactly one path (usage: {usage}), got {len(args)}")
        if name == "cd":
            return self._cd(args[0])
        rel, status = resolve(self.root, self.cwd, args[0])
        if stat.S_ISDIR(status.st_mode):
            raise SandboxError(f"{name}: is a directory: {printable(args[0])}")
        if not stat.S_ISREG(status.st_mode):
            raise SandboxError(f"{name}: not a regular file: {printable(args[0])}")
        if name == "id":
            if file_kind(rel) is None:
                raise SandboxError(f"id: {printable(args[0])} is not a file type that can be an answer")
            return CommandResult(text=f"Identified {rel} as the answer.", name=name, path=rel)
        if name == "cat":
            return CommandResult(text=cat_view(self.abspath(rel), file_kind(rel), self.view_tokens), name=name,
                                 path=rel)
        return CommandResult(text=head_tail_view(self.abspath(rel), tail=name == "tail", max_tokens=self.view_tokens),
                             name=name, path=rel)

    def _cd(self, path: str) -> CommandResult:
        if path == "..":
            if not self.cwd:
                raise SandboxError("cd ..: already at the repository root")
            target = self.cwd.rpartition("/")[0]
        else:
            target, status = resolve(self.root, self.cwd, path)
            if not stat.S_ISDIR(status.st_mode):
                raise SandboxError(f"cd: not a directory: {printable(path)}")
        self.cwd = target
        return CommandResult(text=f"Moved to {target or 'the repository root'}.", name="cd", path=target)

    def _ls(self, path: str | None) -> CommandResult:
        rel = self.cwd
        if path is not None:
            rel, status = resolve(self.root, self.cwd, path)
            if not stat.S_ISDIR(status.st_mode):
                raise SandboxError(f"ls: not a directory: {printable(path)}")
        return CommandResult(text=self.listing(rel), name="ls", path=rel)
