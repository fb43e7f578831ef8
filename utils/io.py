"""Files written so that an interrupted run never leaves half of one: the one atomic writer, JSON and JSONL;
and the files that flags name, read with one-line errors (:func:`read_input`).

A file is written to a temporary name beside it, flushed to disk and renamed over the old one, so a
reader sees the old file or the new one, never a part (the same holds for a kill -9 at any moment).
"""

import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from utils.errors import UsageError


def write_text_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}-{threading.get_ident()}")  # one per writer
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


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
