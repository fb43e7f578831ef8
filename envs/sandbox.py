"""A private, read-only view of a repository that AutoExplore commands run against.

Nothing here calls a shell. Commands are parsed with :func:`shlex.split` and carried
out in Python over a private copy of the repository, so the agent (or an API model in
evaluation) can only read, list and move inside that copy:

* the copy holds only regular files and directories with safe names: symlinks (at any
  depth), hidden entries, FIFOs, sockets, devices, oversized files and names that could
  confuse a prompt or a parser (:func:`is_safe_name`) are never copied;
* a path is resolved one component at a time with ``os.lstat`` and must stay inside
  the copy: no absolute paths, no ``~``, no ``..`` (except the exact command ``cd ..``);
* files are opened with ``O_NOFOLLOW`` and read up to a byte bound.

Copies come in two layers. :func:`pristine_copy` copies a source repository once per
process (cached, removed at exit). :class:`Sandbox` is one episode's view: a hard-link
tree of the pristine copy, optionally with entries left out, removed on ``close()``.
"""

import atexit
import logging
import os
import re
import shlex
import shutil
import stat
import tempfile
import threading
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# The one list of file suffixes AutoExplore works with, by kind; the data pipeline
# filters repositories with it too.
ALLOWED_SUFFIXES: dict[str, tuple[str, ...]] = {
    "code": (".py", ".c", ".cpp", ".cxx", ".cc", ".h", ".hpp", ".hxx", ".cs", ".java", ".go", ".ipynb"),
    "data": (".csv", ".tsv"),
    "text": (".txt", ".md", ".rst", ".json", ".yaml", ".yml"),
    "exec": (".sh", ".bash", ".zsh"),
}
_KIND_OF_SUFFIX = {suffix: kind for kind, suffixes in ALLOWED_SUFFIXES.items() for suffix in suffixes}

# How many lines `cat` shows per kind; any other file shows OTHER_CAT_LINES.
CAT_LINES = {"code": 1000, "data": 5, "text": 100}
OTHER_CAT_LINES = 10
HEAD_TAIL_LINES = 10
# Every file view is also capped at about this many tokens, approximated by TOKEN_RE
# pieces, and at MAX_SHOWN_CHARS characters (a single huge "word" is one piece).
MAX_TOKENS = 500
MAX_SHOWN_CHARS = 4000
TOKEN_RE = re.compile(r"\w+|[^\w\s]")

MAX_COPY_BYTES = 5 * 1024 * 1024  # larger files are not copied into the sandbox
MAX_READ_BYTES = 256 * 1024  # a command reads at most this much of a file
MAX_COMMAND_CHARS = 1000

_UNSAFE_CHARS = frozenset("\"'\\`")
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._/+-]+")
_SHELL_OPERATORS = frozenset({";", "|", "||", "&", "&&", ">", ">>", "<", "<<", "2>", "&>"})


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


# --- the per-process pristine copies ------------------------------------------------

_pristine: dict[str, str] = {}
_pristine_lock = threading.Lock()
_process_dir: str | None = None
_process_pid: int | None = None


def _remove_process_dir(path: str, pid: int) -> None:
    # A forked worker inherits this exit hook; only the creating process may remove the copies.
    if os.getpid() == pid:
        shutil.rmtree(path, ignore_errors=True)


def pristine_copy(source: str | os.PathLike) -> str:
    """The private copy of repository ``source`` for this process, made on first use.

    Later changes to ``source`` are not seen: the copy is a snapshot taken once.
    """
    global _process_dir, _process_pid
    real = os.path.realpath(source)
    if not os.path.isdir(real):
        raise ValueError(f"repository {os.fspath(source)!r} is not a directory")
    with _pristine_lock:
        if real in _pristine:
            return _pristine[real]
        if _process_dir is None or _process_pid != os.getpid():
            _process_dir = tempfile.mkdtemp(prefix="reflect_rl_repos_")
            _process_pid = os.getpid()
            atexit.register(_remove_process_dir, _process_dir, _process_pid)
        target = tempfile.mkdtemp(prefix=os.path.basename(real)[:40] + "_", dir=_process_dir)
        skipped = _copy_tree(real, target)
        if skipped:
            logger.info("copied %s into the sandbox; skipped %s", real, dict(sorted(skipped.items())))
        _pristine[real] = target
        return target


def _copy_tree(source: str, target: str) -> Counter:
    """Copy the regular files and directories of ``source`` into ``target``; count what was skipped."""
    skipped: Counter = Counter()
    stack = [(source, target)]
    while stack:
        src_dir, dst_dir = stack.pop()
        try:
            with os.scandir(src_dir) as it:
                entries = sorted(it, key=lambda e: e.name)
        except PermissionError:
            skipped["unreadable"] += 1
            continue
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                skipped["hidden"] += 1
            elif not is_safe_name(name):
                skipped["unsafe name"] += 1
            elif entry.is_symlink():
                skipped["symlink"] += 1
            elif entry.is_dir(follow_symlinks=False):
                os.mkdir(os.path.join(dst_dir, name))
                stack.append((entry.path, os.path.join(dst_dir, name)))
            elif entry.is_file(follow_symlinks=False):
                if entry.stat(follow_symlinks=False).st_size > MAX_COPY_BYTES:
                    skipped["too large"] += 1
                else:
                    try:
                        copied = _copy_file(entry.path, os.path.join(dst_dir, name))
                    except PermissionError:
                        skipped["unreadable"] += 1
                        continue
                    if not copied:
                        skipped["changed while copying"] += 1
            else:
                skipped["not a file or directory"] += 1
    return skipped


def _copy_file(src: str, dst: str) -> bool:
    # O_NONBLOCK: if the entry turned into a FIFO since it was listed, open must not wait.
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_COPY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_COPY_BYTES:
        return False
    _write_read_only(dst, data)
    return True


def _write_read_only(path: str, data: bytes) -> None:
    # Episode copies hard-link these files, so read-only modes guard the pristine bytes.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def link_tree(source: str, target: str, leave_out: Callable[[str, bool], bool] | None = None) -> None:
    """Hard-link the tree ``source`` into the existing directory ``target``.

    ``leave_out(relative_path, is_dir)`` is asked about each entry in a fixed order
    (directory by directory, entries sorted by name; a left-out directory's contents
    are not visited), so a seeded predicate gives the same copy every time.
    """
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(os.path.join(source, rel_dir)) as it:
            entries = sorted(it, key=lambda e: e.name)
        subdirs = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if entry.is_symlink() or not (is_dir or entry.is_file(follow_symlinks=False)):
                continue
            if leave_out is not None and leave_out(rel, is_dir):
                continue
            dst = os.path.join(target, rel)
            if is_dir:
                os.mkdir(dst)
                subdirs.append(rel)
                continue
            try:
                os.link(entry.path, dst, follow_symlinks=False)
            except OSError:
                with open(entry.path, "rb") as f:
                    _write_read_only(dst, f.read())
        stack.extend(reversed(subdirs))


# --- path resolution and file views -------------------------------------------------


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
        if stat.S_ISLNK(status.st_mode):
            raise SandboxError(f"symbolic links are not followed: {printable(path)}")
    full = os.path.join(root, *rel_parts)
    real_root = os.path.realpath(root)
    if os.path.commonpath([os.path.realpath(full), real_root]) != real_root:
        raise SandboxError(f"path leaves the repository: {printable(path)}")
    return "/".join(rel_parts), status


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


def cat_view(path: str, kind: str | None) -> str:
    """What ``cat`` shows of ``path``: a kind-dependent number of lines and at most ~MAX_TOKENS tokens."""
    text, complete = _read(path)
    lines = text.splitlines()
    if not lines:
        return "(empty file)"
    limit = CAT_LINES.get(kind, OTHER_CAT_LINES)
    body, token_cut = cap_tokens("\n".join(lines[:limit]))
    if len(lines) <= limit and not token_cut and complete:
        return body
    shown = len(body.splitlines())
    total = f"{len(lines)}" if complete else f"more than {len(lines)}"
    reason = f"~{MAX_TOKENS}-token limit" if token_cut else f"{limit}-line limit for this file type"
    return f"{body}\n[output cut ({reason}): showed {shown} of {total} lines]"


def head_tail_view(path: str, tail: bool) -> str:
    text, _ = _read(path, from_end=tail)
    lines = text.splitlines()
    if not lines:
        return "(empty file)"
    picked = lines[-HEAD_TAIL_LINES:] if tail else lines[:HEAD_TAIL_LINES]
    body, token_cut = cap_tokens("\n".join(picked), from_end=tail)
    if token_cut:
        where = "last" if tail else "first"
        body += f"\n[output cut (~{MAX_TOKENS}-token limit): showed the {where} {len(body.splitlines())} lines]"
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
    """One episode's disposable copy of a repository, with a current directory.

    ``leave_out`` is passed to :func:`link_tree`. The copy is removed by :meth:`close`
    (safe to call twice) or, failing that, when the object is collected or at exit.
    """

    COMMANDS = ("cd", "ls", "cat", "head", "tail", "id")

    def __init__(self, source: str | os.PathLike, leave_out: Callable[[str, bool], bool] | None = None):
        pristine = pristine_copy(source)
        self.root = tempfile.mkdtemp(prefix="auto_explore_episode_")
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
            return CommandResult(text=cat_view(self.abspath(rel), file_kind(rel)), name=name, path=rel)
        return CommandResult(text=head_tail_view(self.abspath(rel), tail=name == "tail"), name=name, path=rel)

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
