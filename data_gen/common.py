"""What every pipeline step shares: resumable item journals, atomic writes, seeding.

A step processes *items* (a file, a task, an episode), each with a key that names
its inputs. Finished items are appended to a journal ``<out_dir>/.progress/<step>.jsonl``
(one line each, flushed and fsynced), so an interrupted run loses nothing it had
finished and a re-run skips them. Each item draws its randomness from
:func:`item_rng` (the run's seed and the item's key), so an interrupted-then-resumed
run writes exactly what an uninterrupted one writes. Outputs are written atomically.
"""

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

logger = logging.getLogger(__name__)


def item_rng(seed: int, *key: Any) -> np.random.Generator:
    """A generator for one item, from the run's seed and the item's key (order-independent)."""
    digest = hashlib.sha256(json.dumps([seed, *key], sort_keys=True, default=str).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def write_text_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def write_json(path: str | Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def write_jsonl(path: str | Path, records: Iterable[dict]) -> int:
    lines = [json.dumps(record, ensure_ascii=False) for record in records]
    write_text_atomic(path, "".join(line + "\n" for line in lines))
    return len(lines)


def read_json(path: str | Path, flag: str = "--task_file") -> Any:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{flag}: no such file {str(path)!r}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{flag}: {path} is not valid JSON ({error})") from None


class Journal:
    """Finished items of one step, kept across runs in ``<out_dir>/.progress/<name>.jsonl``."""

    def __init__(self, out_dir: str | Path, name: str):
        self.path = Path(out_dir) / ".progress" / f"{name}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.done: dict[str, Any] = {}
        if self.path.is_file():
            for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    # Only the last line can be torn (a crash mid-write); the item is simply redone.
                    logger.warning("%s:%d: ignoring a torn line", self.path, number)
                    continue
                self.done[entry["key"]] = entry["result"]

    def run(self, items: list[tuple[str, Any]], work: Callable[[Any], Any], desc: str) -> list[Any]:
        """Results of ``work(payload)`` for every ``(key, payload)``, in item order, skipping finished keys."""
        todo = [(key, payload) for key, payload in items if key not in self.done]
        if len(todo) < len(items):
            logger.info("%s: %d of %d items already done (%s)", desc, len(items) - len(todo), len(items), self.path)
        with open(self.path, "a", encoding="utf-8") as journal:
            for key, payload in tqdm(todo, desc=desc, unit="item"):
                result = work(payload)
                journal.write(json.dumps({"key": key, "result": result}, ensure_ascii=False) + "\n")
                journal.flush()
                os.fsync(journal.fileno())
                self.done[key] = result
        return [self.done[key] for key, _ in items]


def journal_name(step: str, model: str, seed: int, *settings: Any) -> str:
    """The journal of one configuration of a step: changing any setting starts a fresh one."""
    digest = hashlib.sha256(repr(settings).encode()).hexdigest()[:10]
    return f"{step}_{re.sub(r'[^A-Za-z0-9_.-]', '_', model)}_{seed}_{digest}"


def random_prob(args, default: float) -> float:
    """``--random_prob`` of an "expert + random p" rollout, or the environment's paper default."""
    return default if args.random_prob is None else args.random_prob


def api_reflection(client, system: str, user: str) -> str:
    """A reflection written by an API model (Taxi, ALFWorld): sampled at temperature 0.7,
    at most 120 tokens, its whitespace collapsed to one line."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return " ".join(client.complete(messages, temperature=0.7, max_tokens=120).split())


def print_counts(step: str, counts: dict[str, Any], client=None) -> None:
    """The summary line every step ends with (after the LLM usage, when an API was used)."""
    if client is not None:
        tqdm.write(client.usage.summary())
    print(f"[{step}] " + ", ".join(f"{name}: {value}" for name, value in counts.items()))
