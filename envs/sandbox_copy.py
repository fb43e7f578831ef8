"""The sandbox's copies of a repository; see ``envs/sandbox.py`` for the whole picture.

:func:`pristine_copy` copies a source repository once per process and parent folder (the
system's temporary folder, or ``--sandbox_dir``), into the process's scratch folder there
(``envs/scratch.py``: removed at exit, or by the next start if the process was killed): only
regular files and directories with safe names (:func:`~envs.sandbox_paths.is_safe_name`),
read with ``O_NOFOLLOW`` up to :data:`MAX_COPY_BYTES` and written read-only. What it leaves out is
counted by reason (:func:`entry_skip`; :func:`skip_reason`: an entry it cannot list or read, or whose
path is too long for the system) and logged. :func:`shown_files` lists the files such a copy holds and
an episode shows, with the same reasons, for the data steps that walk a repository.
:func:`link_tree` builds the copy of an episode that leaves entries out: a hard-link tree of the
pristine copy without them (an episode that leaves nothing out reads the pristine copy itself).
"""

import errno
import logging
import os
import stat
import tempfile
import threading
from collections import Counter
from collections.abc import Callable

from envs.sandbox_paths import file_kind, is_safe_name
from envs.scratch import process_folder

logger = logging.getLogger(__name__)

MAX_COPY_BYTES = 5 * 1024 * 1024  # larger files are not copied into the sandbox


# --- the per-process pristine copies ------------------------------------------------

_pristine: dict[tuple[str, str | None], str] = {}
_pristine_lock = threading.Lock()


def pristine_copy(source: str | os.PathLike, parent: str | os.PathLike | None = None) -> str:
    """The private copy of repository ``source`` for this process, made on first use in this process's
    scratch folder under ``parent`` (default: the system's temporary folder; ``envs/scratch.py``).

    Later changes to ``source`` are not seen: the copy is a snapshot taken once.
    """
    real = os.path.realpath(source)
    if not os.path.isdir(real):
        raise ValueError(f"repository {os.fspath(source)!r} is not a directory")
    parent = None if parent is None else os.path.realpath(parent)
    with _pristine_lock:
        if (real, parent) in _pristine:  # a forked child reuses its parent's copies
            return _pristine[real, parent]
        # ... but makes new ones in a folder of its own
        target = tempfile.mkdtemp(prefix=os.path.basename(real)[:40] + "_", dir=process_folder(parent))
        skipped = _copy_tree(real, target)
        if skipped:
            logger.info("copied %s into the sandbox; skipped %s", real, dict(sorted(skipped.items())))
        _pristine[real, parent] = target
        return target


def skip_reason(error: OSError) -> str | None:
    """Why an entry that raised ``error`` when listed, looked at, read or copied is skipped: "unreadable" (no
    permission) or "path too long" (its path passes PATH_MAX, or a name NAME_MAX); None for any other error (a
    full disk, a failing drive), which is not the entry's and is raised."""
    if isinstance(error, PermissionError):
        return "unreadable"
    if error.errno == errno.ENAMETOOLONG:
        return "path too long"
    return None


def entry_skip(entry: os.DirEntry) -> str | None:
    """Why the copy leaves ``entry`` out by its name, type or size; None for a directory or file it copies."""
    if entry.name.startswith("."):
        return "hidden"
    if not is_safe_name(entry.name):
        return "unsafe name"
    if entry.is_symlink():
        return "symlink"
    if entry.is_dir(follow_symlinks=False):
        return None
    if not entry.is_file(follow_symlinks=False):
        return "not a file or directory"
    if entry.stat(follow_symlinks=False).st_size > MAX_COPY_BYTES:
        return "too large"
    return None


def _sorted(folder: str) -> list[os.DirEntry]:
    with os.scandir(folder) as it:
        return sorted(it, key=lambda e: e.name)


def sorted_entries(folder: str, skipped: Counter) -> list[os.DirEntry]:
    """The entries of ``folder`` by name; none if it cannot be listed (counted in ``skipped``: :func:`skip_reason`)."""
    listed: list[os.DirEntry] = []
    _tally(lambda: listed.extend(_sorted(folder)), skipped)
    return listed


def _copy_tree(source: str, target: str) -> Counter:
    """Copy the regular files and directories of ``source`` into ``target``; count what was skipped."""
    skipped: Counter = Counter()
    stack = [(sorted_entries(source, skipped), target)]
    while stack:
        entries, dst_dir = stack.pop()
        for entry in entries:
            dst = os.path.join(dst_dir, entry.name)

            def copy(entry=entry, dst=dst) -> str | None:
                reason = entry_skip(entry)
                if reason is None and entry.is_dir(follow_symlinks=False):
                    below = _sorted(entry.path)  # listed first: a folder that cannot be is not copied empty
                    os.mkdir(dst)
                    stack.append((below, dst))
                elif reason is None and not _copy_file(entry.path, dst):
                    reason = "changed while copying"
                return reason

            _tally(copy, skipped)
    return skipped


def _tally(visit, skipped: Counter) -> None:
    """Count in ``skipped`` why ``visit()`` left its entry out: the reason it returns, or the one its OSError gives
    (:func:`skip_reason`; any other OSError is raised)."""
    try:
        reason = visit()
    except OSError as error:
        reason = skip_reason(error)
        if reason is None:
            raise
    if reason is not None:
        skipped[reason] += 1


def read_regular(path: str, limit: int = MAX_COPY_BYTES) -> bytes | None:
    """The bytes of the regular file ``path``, opened without following a link; None if it is not one (it turned
    into a link or a FIFO since it was listed) or holds more than ``limit`` bytes. Raises OSError (an unreadable
    file, a path too long: :func:`skip_reason`)."""
    # O_NONBLOCK: if the entry turned into a FIFO since it was listed, open must not wait.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def _copy_file(src: str, dst: str) -> bool:
    data = read_regular(src)
    if data is None:
        return False
    _write_read_only(dst, data)
    return True


def shown_files(repo: str | os.PathLike, skipped: Counter, max_depth: int | None = None) -> list[str]:
    """The '/'-separated paths, sorted, of the files of ``repo`` that its sandbox copy holds and an AutoExplore
    episode shows (an allowed suffix: ``file_kind``), in folders at most ``max_depth`` below the root; what is
    left out is counted in ``skipped`` as the copy counts it (a file is opened to know it can be read)."""
    found = []
    stack = [("", os.fspath(repo))]
    while stack:
        rel_dir, folder = stack.pop()
        for entry in sorted_entries(folder, skipped):
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name

            def visit(entry=entry, rel=rel) -> str | None:
                reason = entry_skip(entry)
                if reason is None and entry.is_dir(follow_symlinks=False):
                    if max_depth is None or rel.count("/") < max_depth:
                        stack.append((rel, entry.path))
                elif reason is None and file_kind(entry.name):
                    os.close(os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC))
                    found.append(rel)
                return reason

            _tally(visit, skipped)
    return sorted(found)


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
            try:
                if is_dir:
                    os.mkdir(dst)
                    subdirs.append(rel)
                else:
                    _link(entry.path, dst)
            except OSError as error:
                # the pristine copy held it, but this copy's folder has a longer name: left out, as the copy
                # leaves out a path too long (skip_reason)
                if error.errno != errno.ENAMETOOLONG:
                    raise
        stack.extend(reversed(subdirs))


def _link(src: str, dst: str) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:
            raise
        with open(src, "rb") as f:  # another file system, or no hard links there
            _write_read_only(dst, f.read())
