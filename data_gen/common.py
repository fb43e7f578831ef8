"""What every pipeline step shares: resumable item journals and seeding (atomic writes: utils/io.py).

A step processes *items* (a file, a task, an episode), each with a key that names
its inputs. Finished items are appended to a journal ``<out_dir>/.progress/<step>.jsonl``
(one line each, flushed and fsynced), so an interrupted run loses nothing it had
finished and a re-run skips them. Each item draws its randomness from
:func:`item_rng` (the run's seed and the item's key), so an interrupted-then-resumed
run writes exactly what an uninterrupted one writes. Outputs are written atomically (``utils.io``).
"""

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from utils.io import on_full_disk, write_text_atomic

logger = logging.getLogger(__name__)


def item_rng(seed: int, *key: Any) -> np.random.Generator:
    """A generator for one item, from the run's seed and the item's key (order-independent)."""
    digest = hashlib.sha256(json.dumps([seed, *key], sort_keys=True, default=str).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


@dataclass
class Unfinished:
    """A result this run can use but must not journal: a re-run works on the item again
    (e.g. an episode where an LLM gave no usable reflection for some states)."""

    result: Any
    reason: str


class Journal:
    """Finished items of one step, kept across runs in ``<out_dir>/.progress/<name>.jsonl``.

    Items may be worked on concurrently, but the journal is always written in item order
    (an item's line waits until all earlier items are written), so its content does not
    depend on the concurrency, and after a crash it holds a prefix of the items: a re-run
    with the same items appends the rest and ends with the file an uninterrupted run writes.
    """

    def __init__(self, out_dir: str | Path, name: str):
        self.path = Path(out_dir) / ".progress" / f"{name}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.done: dict[str, Any] = {}
        self.unfinished: dict[str, str] = {}  # key -> reason, for items of this run not journalled
        if self.path.is_file():
            self._load()

    def _load(self) -> None:
        text = self.path.read_text(encoding="utf-8")
        if text and not text.endswith("\n"):
            # A crash mid-write left a torn last line: drop it (the item is simply redone), so that
            # the next line appended starts on a line of its own.
            logger.warning("%s: dropping a torn last line", self.path)
            text = text[: text.rfind("\n") + 1]
            write_text_atomic(self.path, text)
        for number, line in enumerate(text.splitlines(), 1):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                logger.warning("%s:%d: ignoring a damaged line", self.path, number)
                continue
            self.done[entry["key"]] = entry["result"]

    def run(self, items: list[tuple[str, Any]], work: Callable[[Any], Any], desc: str, *, workers: int = 1,
            prepare: Callable[[Any], Any] | None = None,
            status: Callable[[], dict[str, Any]] | None = None) -> list[Any]:
        """Results of ``work(prepare(payload))`` for every ``(key, payload)``, in item order, skipping
        finished keys. ``prepare`` (optional) runs in the calling thread, item after item, in order (for
        work on a shared environment); ``work`` runs on up to ``workers`` threads. A result wrapped in
        :class:`Unfinished` is returned unwrapped but not journalled. ``status`` gives the progress bar's
        postfix (e.g. the LLM client's requests in flight). The first exception stops the run: items
        not yet started are dropped (unless it came from ``prepare``: then the items handed out before
        it finish), finished ones are journalled (in order), then it is raised."""
        todo = [(key, payload) for key, payload in items if key not in self.done]
        if len(todo) < len(items):
            logger.info("%s: %d of %d items already done (%s)", desc, len(items) - len(todo), len(items), self.path)
        results: dict[str, Any] = {}
        window = max(1, 2 * workers)  # items prepared ahead of the writer
        bar = tqdm(total=len(todo), desc=desc, unit="item")
        written = 0  # items of ``todo`` whose fate (journalled or not) is settled, in order
        pending: dict[Future, str] = {}
        with open(self.path, "a", encoding="utf-8") as journal, ThreadPoolExecutor(workers) as pool:

            def settle(finished: set[Future]) -> None:
                nonlocal written
                for future in finished:
                    results[pending.pop(future)] = future.result()
                lines = []
                while written < len(todo) and todo[written][0] in results:
                    key = todo[written][0]
                    result = results[key]
                    if isinstance(result, Unfinished):
                        self.unfinished[key] = result.reason
                        results[key] = result.result
                    else:
                        lines.append(json.dumps({"key": key, "result": result}, ensure_ascii=False) + "\n")
                        self.done[key] = result
                    written += 1
                if lines:
                    with on_full_disk(self.path):  # a torn last line is dropped when the journal is read again
                        journal.write("".join(lines))
                        journal.flush()
                        os.fsync(journal.fileno())
                bar.update(len(finished))
                if status is not None:
                    bar.set_postfix(status(), refresh=False)

            def drain(until: int) -> None:
                while len(pending) > until:
                    finished, _ = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                    failed = [future for future in finished if future.exception() is not None]
                    settle(finished - set(failed))
                    if failed:
                        raise failed[0].exception()
                    if not finished and status is not None:
                        bar.set_postfix(status())

            preparing = False
            try:
                for key, payload in todo:
                    drain(window - 1)
                    preparing = True
                    prepared = prepare(payload) if prepare else payload
                    preparing = False
                    pending[pool.submit(work, prepared)] = key
                drain(0)
            except BaseException as error:
                # Keep what finished (in order), then stop. Work already handed out still finishes when the
                # failure was in preparing a later item (its own payload is ready; dropping it would depend
                # on whether a thread had picked it up yet); otherwise what has not started is dropped.
                keep_handed_out = preparing and isinstance(error, Exception)
                pool.shutdown(wait=True, cancel_futures=not keep_handed_out)
                settle({future for future in pending
                        if future.done() and not future.cancelled() and future.exception() is None})
                raise
            finally:
                bar.close()
        return [self.done[key] if key in self.done else results[key] for key, _ in items]


def journal_name(step: str, model: str, seed: int, *settings: Any) -> str:
    """The journal of one configuration of a step: changing any setting starts a fresh one."""
    digest = hashlib.sha256(repr(settings).encode()).hexdigest()[:10]
    return f"{step}_{re.sub(r'[^A-Za-z0-9_.-]', '_', model)}_{seed}_{digest}"


def random_prob(args, default: float) -> float:
    """``--random_prob`` of an "expert + random p" rollout, or the environment's paper default."""
    return default if args.random_prob is None else args.random_prob


REFLECTION_ATTEMPTS = 3  # answers asked for one reflection before its state is left without one
_GIVEAWAYS = re.compile(r"\bspoiler\b|\bbest (?:next )?(?:action|command|move)\b|\bi (?:was|am|have been) told\b",
                        re.IGNORECASE)


def reflection_problem(reflection: str, spoiler: str) -> str | None:
    """Why an API reflection may not become training data, or None: it quotes the spoiler (the
    best next action's text) or gives away that it was told one."""
    text = " ".join(reflection.lower().split())
    if re.search(rf"(?<![\w]){re.escape(' '.join(spoiler.lower().split()))}(?![\w])", text):
        return "names the spoiler"
    if _GIVEAWAYS.search(text):
        return "mentions the spoiler"
    return None


def reflect_with_api(client, system: str, records: list[dict], asks: list[tuple[str, str]], result: Any) -> Any:
    """Fill in each record's reflection, written by an API model (Taxi, ALFWorld) for its ``(user prompt,
    spoiler)`` in ``asks`` (spoiler None: the writer was told none); all are sent at once, sampled at
    temperature 0.7, at most 120 tokens, and their whitespace collapsed to one line. An empty answer, or
    one that gives its spoiler away, is asked again (up to :data:`REFLECTION_ATTEMPTS` answers); a record with none usable gets None. Returns
    ``result`` (the item's journal entry, which holds ``records``), as :class:`Unfinished` (not
    journalled, so a re-run asks again) when some record got no reflection."""
    chats = [[{"role": "system", "content": system}, {"role": "user", "content": user}] for user, _ in asks]
    accepts = [lambda answer, spoiler=spoiler: reflection_problem(answer, spoiler) if spoiler else None
               for _, spoiler in asks]
    answers = client.complete_many(chats, accepts=accepts, temperature=0.7, max_tokens=120,
                                   attempts=REFLECTION_ATTEMPTS)
    for record, answer in zip(records, answers, strict=True):
        record["reflection"] = None if answer is None else " ".join(answer.split())
    missing = sum(answer is None for answer in answers)
    return Unfinished(result, f"{missing} states without a usable reflection") if missing else result


def usable_records(episodes: list[list[dict]]) -> tuple[list[dict], int]:
    """The records of all episodes that have a reflection, and how many have none."""
    records = [record for episode in episodes for record in episode]
    usable = [record for record in records if record["reflection"] is not None]
    return usable, len(records) - len(usable)


def print_counts(step: str, counts: dict[str, Any], client=None, *, missing: int = 0, unfinished: int = 0) -> None:
    """The summary line every step ends with (after the LLM usage, when an API was used). ``missing``
    states got no usable reflection (left out of the output); their ``unfinished`` items are not
    journalled, so a re-run asks for them again."""
    if client is not None:
        tqdm.write(client.usage.summary())
    if missing:
        counts = {**counts, "states without a usable reflection (left out; a re-run asks again)": missing,
                  "unfinished items": unfinished}
    print(f"[{step}] " + ", ".join(f"{name}: {value}" for name, value in counts.items()))
