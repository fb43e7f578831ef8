"""What a seed's stages leave behind to be kept or continued (:mod:`runner.stages` runs them): a stage's done and
started markers (:func:`once`), the newest whole checkpoint a stage cut short continues from
(:func:`newest_checkpoint`), and a result computed in the runner itself and kept under its key (:func:`remembered`).

A stage's seconds count every attempt's work that its finish builds on: an attempt cut short counts up to the last
file it left that a later attempt continued from (its newest whole checkpoint, or its journal's last write)."""

import json
import os
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from utils import checkpoints, complete
from utils.io import write_json

DONE = ".done.json"  # logs/<stage>.done.json: the stage finished (its key, a token of this finish, its seconds)
STARTED = ".started.json"  # logs/<stage>.started.json: the key the stage's folder holds a run of, written before it
SUPERSEDED = "superseded"  # <seed>/superseded/: the last run of another key of each stage, moved there, not deleted


def say(message: str) -> None:
    print(f"\n[demo] {message}", flush=True)


def done_marker(logs: Path, name: str) -> Path:
    return logs / f"{name}{DONE}"


def step(checkpoint: str) -> int:
    return int(checkpoint.rsplit("-", 1)[1])


def newest_checkpoint(folder: Path) -> Path | None:
    """The newest whole checkpoint of the runs in a stage's ``folder``: the highest step, the later run's of
    two (a resumed run cut short before its first save leaves none of its own)."""
    found = []
    for index, run in enumerate(checkpoints.run_dirs(folder)):
        complete.clean_scratch(run)  # a whole checkpoint a kill left under its scratch name is put in place
        newest = complete.newest_whole(run)
        if newest is not None:
            found.append((step(newest.name), index, newest))
    return max(found)[2] if found else None


def _last_write(path: Path | None) -> float | None:
    """When the newest file under ``path`` (a folder, or a file) was written; None where there is none."""
    if path is None or not path.exists():
        return None
    files = [path] if path.is_file() else [found for found in path.rglob("*") if found.is_file()]
    return max((found.stat().st_mtime for found in files), default=None)


def _carried(started: Path, earlier: dict, kept_until: float | None) -> float:
    """The seconds of work a stage's attempts cut short leave for the next one to continue: what the earlier ones
    carried, and the last one's from its start (or, in a marker written before attempts were timed, the marker's
    own writing) to ``kept_until``, when it wrote the last thing continued from."""
    began = float(earlier.get("attempt", started.stat().st_mtime))
    return float(earlier.get("carried", 0.0)) + (max(0.0, kept_until - began) if kept_until is not None else 0.0)


def once(logs: Path, name: str, key: dict, work: Callable[[Path | None], None], folder: Path | None = None,
         resumable: bool = False) -> float:
    """Run ``work`` unless its marker ``logs/<name>.done.json`` says that it finished with the same ``key``
    (``runner.stages.stage_key``); its seconds, then or now. The marker is written when ``work`` returns, with a
    fresh token (what the stages reading this one's output key on), when it started and in which process (what ran
    side by side), so a stage that was killed or failed runs again when its seed resumes.

    ``folder``: what ``work`` writes, its alone. Before ``work`` starts, ``logs/<name>.started.json`` takes its
    key and when this attempt began. A run of the key the started marker already holds continues what was cut
    short: ``work`` is given the newest whole checkpoint in ``folder`` where ``resumable`` (a script whose
    ``--resume_from`` continues its run) and there is one, else None (a journal the script keeps in ``folder``
    goes on). Any other run starts afresh in an empty ``folder``: what a run of another key made (its folder and
    markers) is moved aside (:func:`set_aside`), never deleted, and the message says what changed in the key. The
    seconds of a continued run count the earlier attempts' work it continues (``carried`` in the marker), not their
    time lost after it."""
    marker, started = done_marker(logs, name), logs / f"{name}{STARTED}"
    earlier = json.loads(started.read_text(encoding="utf-8")) if started.is_file() else {}
    if marker.is_file():
        done = json.loads(marker.read_text(encoding="utf-8"))
        if done.get("key") == key:
            say(f"{name}: finished by an earlier run ({done['seconds']:.0f} s), kept")
            return float(done["seconds"])
        ours = earlier.get("key") == key  # the folder holds a run of this key, cut short: kept to continue
        say(f"{name}: finished earlier with another key ({difference(done.get('key'), key)}); it runs again, "
            f"and what it made is moved to {set_aside(logs.parent, [marker] if ours else [marker, started, folder])}")
        earlier = earlier if ours else {}
    resume, carried = None, 0.0
    if earlier.get("key") == key:
        resume = newest_checkpoint(folder) if resumable and folder is not None else None
        carried = _carried(started, earlier, _last_write(resume if resumable else folder))
    elif folder is not None and folder.exists():
        why = f"cut short earlier with another key ({difference(earlier['key'], key)})" if "key" in earlier else \
            "its folder holds what no started marker names"
        say(f"{name}: {why}; it starts afresh, and what was there is moved to "
            f"{set_aside(logs.parent, [started, folder])}")
    tic = time.time()
    write_json(started, {"key": key, "attempt": tic, "carried": carried})
    work(resume)
    seconds = time.time() - tic + carried
    write_json(marker, {"key": key, "token": uuid.uuid4().hex, "seconds": seconds, "started": tic,
                        "process": os.getpid(), **({"resumed_from": str(resume)} if resume is not None else {}),
                        **({"carried": carried} if carried else {})})
    return seconds


def recalled(path: Path, key: dict) -> tuple[Any, float] | None:
    """What :func:`remembered` kept at ``path`` under ``key``, and its seconds; None where nothing was."""
    saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return (saved["made"], float(saved["seconds"])) if saved.get("key") == key else None


def remembered(path: Path, key: dict, make: Callable[[], Any]) -> tuple[Any, float]:
    """What ``make`` returns (plain JSON) and its seconds: read back from ``path`` where an earlier run made it
    with the same ``key``, else made now and kept there with the key."""
    found = recalled(path, key)
    if found is not None:
        say(f"{path.stem}: made by an earlier run ({found[1]:.0f} s), read back from {path}")
        return found
    tic = time.time()
    made = make()
    seconds = time.time() - tic
    write_json(path, {"key": key, "made": made, "seconds": seconds})
    return made, seconds


def set_aside(seed: Path, paths: list[Path | None]) -> Path:
    """Move each of ``paths`` that exists (a stage's folder and markers, or a seed's results) to the same place
    under ``seed/superseded/``, replacing what an earlier change had put there: the last run of another key is
    kept, so a change made by mistake (a model named by another path, a flag) loses nothing that took hours. The
    folder it moved them under."""
    aside = seed / SUPERSEDED
    for path in (path for path in paths if path is not None and (path.exists() or path.is_symlink())):
        path = path.parent.resolve() / path.name  # a link itself is moved, not what it points to
        target = aside / (path.relative_to(seed.resolve()) if path.is_relative_to(seed.resolve()) else path.name)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
    return aside


_ABSENT = object()  # a place one side of a difference lacks
WORDS_SHOWN = 3  # differences named in a message, at most
VALUE_SHOWN = 160  # characters of a value shown in a message, at most


def difference(old: Any, new: Any) -> str:
    """Where ``old`` differs from ``new`` (two stage keys, or a seed's settings), in a few words: the first
    :data:`WORDS_SHOWN` places, each ``place: old -> new``; a command line compares word by word."""
    found: list[str] = []

    def shown(value: Any) -> str:
        text = "(none)" if value is _ABSENT else json.dumps(value) if not isinstance(value, str) else value
        return text if len(text) <= VALUE_SHOWN else text[:VALUE_SHOWN - 3] + "..."

    def walk(a: Any, b: Any, where: str) -> None:
        if a == b or len(found) > WORDS_SHOWN:
            return
        if isinstance(a, str) and isinstance(b, str) and (" " in a or " " in b):
            a, b = a.split(), b.split()
        if isinstance(a, dict) and isinstance(b, dict):
            for name in sorted(set(a) | set(b), key=str):
                walk(a.get(name, _ABSENT), b.get(name, _ABSENT), f"{where}.{name}" if where else str(name))
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for index, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{where}[{index}]")
        elif isinstance(a, list) and isinstance(b, list) and all(isinstance(x, str) for x in a + b):
            # words counted, so that a repeated word gone or added is named (lengths differ: one side has more)
            gone, added = Counter(a) - Counter(b), Counter(b) - Counter(a)
            found.append(f"{where or 'it'}: " + "; ".join(part for part in (
                f"without {shown(' '.join(gone.elements()))}" if gone else "",
                f"with {shown(' '.join(added.elements()))}" if added else "") if part))
        else:
            found.append(f"{where or 'it'}: {shown(a)} -> {shown(b)}")

    walk(old, new, "")
    more = "; and more" if len(found) > WORDS_SHOWN else ""
    return "; ".join(found[:WORDS_SHOWN]) + more if found else "no difference"

