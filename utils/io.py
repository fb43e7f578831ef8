"""Files written so that an interrupted run never leaves half of one: the one atomic writer, JSON and JSONL;
and the files that flags name, read with one-line errors (:func:`read_input`).

A file is written to a temporary name beside it, flushed to disk and renamed over the old one, so a
reader sees the old file or the new one, never a part (the same holds for a kill -9 at any moment).

A write that fails for want of space (:func:`on_full_disk`) is said as such: :class:`DiskFull`, one line naming the
path, exit status 2 (``experiment_args.one_line_usage_errors``), and what was finished stays as it was.
"""

import contextlib
import errno
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from utils.errors import UsageError

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# How the writers that are not Python's own say it: safetensors (Rust's io error), and torch.save, whose
# "unexpected pos" / "failed writing" names no cause: taken as a full disk when the disk is (nearly) full
_NO_SPACE_TEXT = ("No space left on device", "StorageFull", "Disk quota exceeded")
_TORCH_WRITE_TEXT = ("unexpected pos", "PytorchStreamWriter failed writing", "file write failed")
NEARLY_FULL = 64 << 20  # bytes free under which a failed torch write is put down to the disk


class DiskFull(UsageError):
    """A write failed for want of disk space: one line naming the path and what the user does next."""

    def __init__(self, path: str | Path, then: str):
        self.path, self.then = Path(path), then
        super().__init__(f"no space left on the disk of {path} ({free_bytes(path) / 2**20:.1f} MiB free) while "
                         f"writing it; {then}")


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions behind it, outermost first."""
    chain, seen = [error], {id(error)}
    while (cause := chain[-1].__cause__ or chain[-1].__context__) is not None and id(cause) not in seen:
        seen.add(id(cause))
        chain.append(cause)
    return chain


def full_disk(error: BaseException) -> "DiskFull | None":
    """The :class:`DiskFull` that ``error`` is or stems from (a file closed after a failed write raises again
    on closing), or one naming the file of an unexplained write that failed for want of space; else None."""
    for link in _chain(error):
        if isinstance(link, DiskFull):
            return link
    return DiskFull(getattr(error, "filename", None) or "a file", AGAIN) if out_of_space(error) else None


def out_of_space(error: BaseException, path: str | Path | None = None) -> bool:
    """Whether ``error`` (or one behind it) is a write that failed for want of space (on ``path``'s disk)."""
    for link in _chain(error):
        if isinstance(link, OSError) and link.errno in NO_SPACE:
            return True
        text = str(link)
        if any(words in text for words in _NO_SPACE_TEXT):
            return True
        if path is not None and any(words in text for words in _TORCH_WRITE_TEXT) and free_bytes(path) < NEARLY_FULL:
            return True
    return False


def free_bytes(path: str | Path) -> int:
    """Bytes free on the disk that holds ``path`` (or its nearest existing folder)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


AGAIN = "free some space, then run the same command again: what was finished is kept and the rest is done"


@contextlib.contextmanager
def on_full_disk(path: str | Path, then: str | Callable[[], str] | None = None):
    """Inside, a write that fails for want of space raises :class:`DiskFull` naming ``path`` (or the file a
    :class:`DiskFull` from within named) and ``then``, what the user does next (a text, or a function that
    tells it once the disk is full; default :data:`AGAIN`; one from within is kept unless this one says
    otherwise); any other error passes unchanged."""
    try:
        yield
    except DiskFull as error:
        if then is None:
            raise
        raise DiskFull(error.path, then() if callable(then) else then) from error.__cause__
    except Exception as error:
        if not out_of_space(error, path):
            raise
        raise DiskFull(path, (then() if callable(then) else then) or AGAIN) from error


def write_text_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    with on_full_disk(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}-{threading.get_ident()}")  # one per writer
        try:
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a failed write (a full disk, a kill's KeyboardInterrupt) leaves nothing
            raise


def write_json(path: str | Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def write_jsonl(path: str | Path, records: Iterable[dict]) -> int:
    """Write one JSON object a line; returns how many."""
    lines = [json.dumps(record, ensure_ascii=False) for record in records]
    write_text_atomic(path, "".join(line + "\n" for line in lines))
    return len(lines)


def read_input(path: str | Path, flag: str) -> str:
    """The text of the input file ``path`` that ``flag`` names, or a :class:`UsageError` naming both: no such
    file, a folder, a device or a pipe (``/dev/null``, a shell's ``<(...)``: inputs may be read more than
    once), unreadable, or not UTF-8 text (a binary file)."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag}: {path} is a folder; give a file")
    if not path.exists():
        raise UsageError(f"{flag}: no such file {str(path)!r}")
    if not path.is_file():
        raise UsageError(f"{flag}: {path} is not a regular file (a device or a pipe); give a file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"{flag}: {path} is not UTF-8 text (byte {error.start}: a binary file?)") from None
    except OSError as error:
        raise UsageError(f"{flag}: cannot read {path} ({error.strerror or error})") from None


def read_json(path: str | Path, flag: str = "--task_file") -> Any:
    """A JSON file, or a :class:`UsageError` naming ``flag`` and the file (:func:`read_input`; not JSON)."""
    text = read_input(path, flag)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"{flag}: {path} is not valid JSON ({error})") from None
