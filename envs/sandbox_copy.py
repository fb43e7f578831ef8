"""The sandbox's copies of a repository; see ``envs/sandbox.py`` for the whole picture.

:func:`pristine_copy` copies a source repository once per process and parent folder (the
system's temporary folder, or ``--sandbox_dir``), into the process's scratch folder there
(``envs/scratch.py``: removed at exit, or by the next start if the process was killed): only
regular files and directories with safe names (:func:`~envs.sandbox_paths.is_safe_name`),
read with ``O_NOFOLLOW`` up to :data:`MAX_COPY_BYTES` and written read-only.
:func:`link_tree` builds the copy of an episode that leaves entries out: a hard-link tree of the
pristine copy without them (an episode that leaves nothing out reads the pristine copy itself).
"""

import logging
import os
import stat
import tempfile
import threading
from collections import Counter
from collections.abc import Callable

from envs.sandbox_paths import is_safe_name
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
