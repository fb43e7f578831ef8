"""The experiment runner's stages (``demo.py``): one script run each (:class:`Stage`), run one after the other in a
stream, the streams side by side in processes of their own (:func:`run_side_by_side`), each stage's output in its
log, a finished stage remembered by its marker (:func:`once`) so that a resumed seed keeps it."""

import contextlib
import importlib
import json
import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import torch

from experiment_args import parse_args
from utils import checkpoints
from utils.io import write_json

WORKERS = 2  # processes for independent stages (the SFTs, the RL runs), each with its share of the threads
DONE = ".done.json"  # logs/<stage>.done.json: the stage finished (its command and seconds)


def say(message: str) -> None:
    print(f"\n[demo] {message}", flush=True)


def latest_run(runs: Path, script: str) -> Path:
    found = checkpoints.run_dirs(runs, script)
    if not found:
        raise RuntimeError(f"no {script} run in {runs}")
    return found[-1]


def call(main, argv: list[str]) -> None:
    code = main(parse_args(argv))
    if code != 0:
        raise RuntimeError(f"{main.__module__} exited with {code}: {' '.join(argv)}")


@dataclass(frozen=True)
class LatestRun:
    """An argument naming another stage's output, found when its stage starts (a run's folder is numbered when it
    runs, so a stage queued before that run cannot know it): ``prefix`` + the latest ``script`` run under ``runs``
    + ``/`` + ``tail``."""

    prefix: str
    runs: Path
    script: str
    tail: str

    def __str__(self) -> str:
        return f"{self.prefix}{latest_run(self.runs, self.script) / self.tail}"


@dataclass(frozen=True)
class Stage:
    """One script run of the pipeline: ``module.main`` on ``argv`` (strings, or :class:`LatestRun` items read
    when it starts), its output in ``log``; ``inputs``: what else it reads that its command does not name (an
    evaluation's list of rows), so that a changed one runs it again; ``needs``: the stages (by name) whose
    output it reads, which must have finished before it starts."""

    name: str
    module: str
    argv: list
    log: Path
    inputs: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()


def _run_stages(stages: list[Stage], threads: int) -> dict[str, float]:
    """Run ``stages`` one after the other in this (worker) process; their seconds by name.

    Each stage's output (progress bars, warnings, library messages) goes to its log file, so
    that stages running side by side do not interleave on the terminal.
    """
    torch.set_num_threads(threads)
    seconds = {}
    for stage in stages:
        argv = [str(item) for item in stage.argv]
        seconds[stage.name] = once(stage.log.parent, stage.log.stem, [stage.module, *argv, *stage.inputs],
                                   lambda stage=stage, argv=argv: _run_logged(stage, argv))
    return seconds


def _run_logged(stage: Stage, argv: list[str]) -> None:
    with _output_to(stage.log):
        call(importlib.import_module(stage.module).main, argv)


def once(logs: Path, name: str, what: list[str], work) -> float:
    """Run ``work`` unless its marker ``logs/<name>.done.json`` says that the same ``what`` (a stage's
    command) finished before; its seconds, then or now. The marker is written when ``work`` returns (with when it
    started and in which process: what ran side by side), so a stage that was killed or failed runs again when its
    seed resumes."""
    marker = logs / f"{name}{DONE}"
    if marker.is_file():
        done = json.loads(marker.read_text(encoding="utf-8"))
        if done.get("what") == what:
            say(f"{name}: finished by an earlier run ({done['seconds']:.0f} s), kept")
            return float(done["seconds"])
    tic = time.time()
    work()
    seconds = time.time() - tic
    write_json(marker, {"what": what, "seconds": seconds, "started": tic, "process": os.getpid()})
    return seconds


@contextlib.contextmanager
def _output_to(path: Path):
    """Send this process's stdout and stderr to ``path``: Python's streams and the file
    descriptors beneath them, so that libraries writing to either land there too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with open(path, "w", encoding="utf-8") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                    yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def exit_with(parent: int, every: float = 1.0) -> None:
    """End this stage process when the demo that started it, ``parent``, is gone (killed, say): a stage
    process is not the demo's to clean up once the demo is dead, and without this it would train on, unseen,
    for the rest of its budget, taking the cores from whatever runs next. Checked every ``every`` seconds."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-demo", daemon=True).start()


def stage_threads(workers: int, streams: int, cores: int | None = None) -> int:
    """The torch threads of each stage process when ``streams`` streams run ``workers`` at a time: the cores
    shared among the processes that run at once, so a lone stream gets them all. Fixed by the plan, never by
    which stream happens to finish first: gradients differ in their last bits between thread counts (forward
    passes do not), so a count switched mid-run would make a seed's training depend on timing."""
    return max(1, (cores or os.cpu_count() or 1) // max(1, min(workers, streams)))


def run_side_by_side(streams: list[list[Stage]], workers: int, finished: tuple[str, ...] = (),
                     cores: int | None = None) -> dict[str, float]:
    """Run each stream's stages in order, the streams side by side in ``workers`` processes; a stage starts once
    the stages it ``needs`` have finished, in any stream (``finished``: stages run before this call).

    Each process has its share of the cores, fixed by the plan (:func:`stage_threads`; ``cores``: the reference
    path's fixed count, not this machine's). When a stage fails, no other one starts, those running finish, and the
    failure is raised."""
    known = {stage.name for stream in streams for stage in stream} | set(finished)
    for stage in (stage for stream in streams for stage in stream):
        unknown = sorted(set(stage.needs) - known)
        if unknown:
            raise ValueError(f"stage {stage.name!r} needs {unknown}, which no stream runs")
        say(f"{stage.name}: queued (log: {stage.log})")
    pending = [list(stream) for stream in streams]
    done, seconds = set(finished), {}

    def ready(busy: set[int]) -> list[int]:
        """The streams whose next stage can start now."""
        return [i for i, stream in enumerate(pending) if stream and i not in busy and set(stream[0].needs) <= done]

    def finish(i: int, result: dict[str, float]) -> None:
        seconds.update(result)
        done.add(pending[i].pop(0).name)

    def stuck() -> RuntimeError:
        waiting = {stream[0].name: sorted(set(stream[0].needs) - done) for stream in pending if stream}
        return RuntimeError(f"stages wait on each other and none can start: {waiting}")

    if workers <= 1:
        threads = cores or torch.get_num_threads()
        while any(pending):
            starts = ready(set())
            if not starts:
                raise stuck()
            finish(starts[0], _run_stages([pending[starts[0]][0]], threads))
    else:
        threads = stage_threads(workers, len(streams), cores)
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited torch threads or locks
        with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=exit_with,
                                 initargs=(os.getpid(),)) as pool:
            running: dict = {}  # future -> its stream
            while any(pending):
                for i in ready(set(running.values())):
                    running[pool.submit(_run_stages, [pending[i][0]], threads)] = i
                if not running:
                    raise stuck()
                for future in wait(running, return_when=FIRST_COMPLETED).done:
                    finish(running.pop(future), future.result())  # a failure: raised when the running ones end
    for name, s in seconds.items():
        say(f"{name}: done in {s:.0f} s")
    return seconds
