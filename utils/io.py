"""Files written so that an interrupted run never leaves half of one: the one atomic writer, JSON and JSONL.

A file is written to a temporary name beside it, flushed to disk and renamed over the old one, so a
reader sees the old file or the new one, never a part (the same holds for a kill -9 at any moment).
"""

import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any


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


def read_json(path: str | Path, flag: str = "--task_file") -> Any:
    """A JSON file, or a ValueError naming ``flag`` and the file when it is missing or not JSON."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{flag}: no such file {str(path)!r}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{flag}: {path} is not valid JSON ({error})") from None
