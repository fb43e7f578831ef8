"""This process's scratch folder: where the environments make their disposable copies and games.

A run's copies (AutoExplore's repository snapshots and episode sandboxes, ALFWorld's rebuilt games)
live in one folder per process and parent folder, :func:`process_folder`, named ``reflect_rl_scratch_*``,
never loose in the parent. The folder is removed at exit. A process killed outright (``kill -9``,
out of memory) cannot remove it, so each folder holds a lock for as long as a process uses it
(``flock`` on its ``.owner`` file: the kernel releases it when the last process holding it ends, a
forked child sharing its parent's), and the next process to make one in the same parent removes every
folder whose lock it can take. Killed runs therefore leave at most their own folders, and only until the
next start: the parent (the system's temporary folder by default) does not grow.
"""

import atexit
import contextlib
import fcntl
import os
import shutil
import tempfile
import threading

PREFIX = "reflect_rl_scratch_"
OWNER_FILE = ".owner"  # inside each folder; locked while a process uses the folder

_folders: dict[str | None, str] = {}  # parent folder (None: the system's) -> this process's folder in it
_owners: list[int] = []  # the lock files' descriptors, held open until the process ends
_pid: int | None = None
_lock = threading.Lock()


def process_folder(parent: str | os.PathLike | None = None) -> str:
    """This process's scratch folder in ``parent`` (default: the system's temporary folder), made on first
    use; making it first removes the folders in ``parent`` that killed processes left behind."""
    global _pid
    key = None if parent is None else os.path.realpath(parent)
    with _lock:
        if _pid != os.getpid():  # a forked child makes folders of its own (and may use its parent's copies)
            _folders.clear()
            _pid = os.getpid()
        if key not in _folders:
            where = tempfile.gettempdir() if key is None else key
            os.makedirs(where, exist_ok=True)
            with _creating(where):
                remove_orphans(where)
                _folders[key] = _new_folder(where)
            atexit.register(_remove, _folders[key], _pid)
        return _folders[key]


@contextlib.contextmanager
def _creating(parent: str):
    """Folders are made, and orphans removed, one process at a time per parent and user: a folder is
    never seen between its creation and its lock."""
    path = os.path.join(parent, f".{PREFIX}{os.getuid()}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _new_folder(parent: str) -> str:
    folder = tempfile.mkdtemp(prefix=PREFIX, dir=parent)
    fd = os.open(os.path.join(folder, OWNER_FILE), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _owners.append(fd)
    return folder


def remove_orphans(parent: str) -> list[str]:
    """Remove this user's scratch folders in ``parent`` that no live process holds; returns them."""
    removed = []
    with os.scandir(parent) as entries:
        candidates = [entry.path for entry in entries if entry.name.startswith(PREFIX)
                      and entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == os.getuid()]
    for folder in candidates:
        if _orphaned(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _orphaned(folder: str) -> bool:
    """Whether no process holds ``folder``'s lock (a folder without one predates them: nobody's either)."""
    try:
        fd = os.open(os.path.join(folder, OWNER_FILE), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def _remove(folder: str, pid: int) -> None:
    # A forked child inherits this exit hook; only the process that made the folder removes it.
    if os.getpid() == pid:
        shutil.rmtree(folder, ignore_errors=True)
