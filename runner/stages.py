"""The experiment runner's stages (``demo.py``): one script run each (:class:`Stage`), run one after the other in a
stream, the streams side by side in processes of their own (:func:`run_side_by_side`), each stage's output in its
log.

A stage is keyed by what it computes from (:func:`stage_key`): its command, its other inputs, the run's numerical
path, a token of each stage whose output it reads, drawn afresh each time that stage finishes, and the bytes of
each file it names as its own (an SFT's texts: a data step that runs again and writes them alike keeps it). A stage whose done
marker holds its key is kept (:func:`once`), so a changed setting runs again only the stages it reaches; a stage cut
short continues in its folder, from its newest whole checkpoint where its script resumes (``--resume_from``)."""

import contextlib
import hashlib
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
from typing import Any

import torch
import yaml

from experiment_args import RESUME_STATE, parse_args
from runner.markers import done_marker, once, say, step
from utils import checkpoints, cpu
from utils.io import write_text_atomic

WORKERS = 2  # processes for independent stages (the SFTs, the RL runs), each with its share of the threads
NATIVE = "native"  # the numerics of a run on this CPU's own path (numerics_setting)


def latest_run(runs: Path, script: str) -> Path:
    found = checkpoints.run_dirs(runs, script)
    if not found:
        raise RuntimeError(f"no {script} run in {runs}")
    return found[-1]


def numerics_setting(cores: int | None) -> dict | str:
    """How a seed's numbers are computed (``cores``: the reference path's fixed thread count, None: this CPU's own
    path), part of every stage's key and of a finished seed's settings: what was computed on one path is not
    reused for a run on the other."""
    return {"reference": cpu.PINNED, "cores": cores} if cores else NATIVE


def stage_key(command: list[str], numerics: dict | str, inputs: tuple[str, ...] = (),
              reads: dict[str, str] | None = None, files: dict[str, str] | None = None) -> dict:
    """What a stage computes from, as its markers hold it (plain JSON): its ``command`` (the module and the
    arguments as they ran, ``--resume_from`` never among them), the ``inputs`` its command does not name, the
    run's ``numerics`` (:func:`numerics_setting`), the token of each stage it ``reads``, by name, and the digest
    of each of its ``files`` (:func:`file_digests`), by path; a key without files has no such entry."""
    key = {"command": list(command), "inputs": list(inputs), "numerics": numerics,
           "reads": dict(sorted((reads or {}).items())), **({"files": dict(sorted(files.items()))} if files else {})}
    return json.loads(json.dumps(key))


def file_digests(paths: tuple[Path, ...]) -> dict[str, str]:
    """The SHA-256 of each file's bytes, by path; a file another stage should have written and did not is an
    error naming it."""
    digests = {}
    for path in paths:
        if not path.is_file():
            raise RuntimeError(f"a stage reads {path}, which does not exist: did the stage that writes it finish?")
        with path.open("rb") as handle:
            digests[str(path)] = hashlib.file_digest(handle, "sha256").hexdigest()
    return digests


def tokens(markers: dict[str, Path]) -> dict[str, str]:
    """The token of each finished stage's latest finish, by name, read from its done marker (``markers``)."""
    found = {}
    for name, marker in markers.items():
        if not marker.is_file():
            raise RuntimeError(f"stage {name!r} is read before it finished: no {marker}")
        found[name] = json.loads(marker.read_text(encoding="utf-8"))["token"]
    return found


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
class Listing:
    """A YAML list of mappings that a stage reads, written when the stage starts: its values may be
    :class:`LatestRun` items (the checkpoint of a run numbered when it ran), found then. Its text is part of the
    stage's key, as ``Stage.inputs`` are."""

    path: Path
    entries: tuple[tuple[tuple[str, Any], ...], ...]

    def text(self) -> str:
        """Its YAML, each :class:`LatestRun` found now."""
        return yaml.safe_dump([{key: str(value) for key, value in entry} for entry in self.entries], sort_keys=False)

    def write(self) -> str:
        text = self.text()
        write_text_atomic(self.path, text)
        return text


@dataclass(frozen=True)
class Stage:
    """One script run of the pipeline: ``module.main`` on ``argv`` (strings, or :class:`LatestRun` items read
    when it starts), its output in ``log``; ``inputs``: what else it reads that its command does not name (an
    evaluation's list of rows), so that a changed one runs it again; ``needs``: the stages (by name) whose
    output it reads, which must have finished before it starts, and whose tokens are part of its key;
    ``files``: files it reads whose bytes key it in place of the token of the stage that wrote them (that stage
    must have finished before this one is queued);
    ``output``: the folder it writes (its ``--ckpt_path``), its alone: emptied before it runs afresh, so that it
    only ever holds the run of one key and :func:`latest_run` never finds a stale one; ``listing``: a file it reads
    that is written when it starts (:class:`Listing`)."""

    name: str
    module: str
    argv: list
    log: Path
    inputs: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    files: tuple[Path, ...] = ()
    output: Path | None = None
    listing: Listing | None = None

    @property
    def marker(self) -> Path:
        """Its done marker, beside its log."""
        return done_marker(self.log.parent, self.log.stem)


def _run_stages(stages: list[Stage], threads: int, numerics: dict | str = NATIVE,
                markers: dict[str, Path] | None = None) -> dict[str, float]:
    """Run ``stages`` one after the other in this (worker) process; their seconds by name. ``numerics``: the run's
    numerical path; ``markers``: the done marker of every stage they need, by name (their tokens key them).

    Each stage's output (progress bars, warnings, library messages) goes to its log file, so
    that stages running side by side do not interleave on the terminal.
    """
    torch.set_num_threads(threads)
    seconds = {}
    for stage in stages:
        argv = [str(item) for item in stage.argv]
        key = _key_of(stage, argv, numerics, markers or {}, stage.listing.write() if stage.listing else None)
        seconds[stage.name] = once(stage.log.parent, stage.log.stem, key,
                                   lambda resume, stage=stage, argv=argv: _continue(stage, argv, resume),
                                   folder=stage.output, resumable=stage.module in RESUME_STATE)
    return seconds


def _key_of(stage: Stage, argv: list[str], numerics: dict | str, markers: dict[str, Path], listing: str | None) -> dict:
    """``stage``'s key (:func:`stage_key`) run as ``argv`` (its command, found), ``listing`` the text of its listing."""
    inputs = (*stage.inputs, *([listing] if listing is not None else []))
    return stage_key([stage.module, *argv], numerics, inputs, tokens({name: markers[name] for name in stage.needs}),
                     file_digests(stage.files))


def kept(stage: Stage, numerics: dict | str, markers: dict[str, Path]) -> bool:
    """Whether ``stage`` finished with the key it would run under now (``markers``: every stage's done marker, by
    name), checked without running or writing anything; whether the stages it reads stand is the caller's to check."""
    try:
        argv = [str(item) for item in stage.argv]
        key = _key_of(stage, argv, numerics, markers, stage.listing.text() if stage.listing else None)
    except RuntimeError:  # a stage it reads has not finished, or a file or run it names is missing
        return False
    return stage.marker.is_file() and json.loads(stage.marker.read_text(encoding="utf-8")).get("key") == key


def _continue(stage: Stage, argv: list[str], resume: Path | None) -> None:
    """Run ``stage`` on ``argv``, from its checkpoint ``resume`` if one is given: with ``--resume_from`` (a new run
    folder beside the one cut short), or not at all where that is its final checkpoint (``--max_steps``), in its
    latest run (it finished, and was stopped before its marker was written)."""
    if resume is not None and step(resume.name) == _final_step(argv) and \
            resume.parent == checkpoints.run_dirs(resume.parent.parent)[-1]:
        say(f"{stage.name}: its final checkpoint {resume} is whole, nothing left to run")
        return
    if resume is not None:
        say(f"{stage.name}: cut short before; resumes from {resume}, its newest whole checkpoint")
    _run_logged(stage, [*argv, *([f"--resume_from={resume}"] if resume is not None else [])])


def _final_step(argv: list[str]) -> int | None:
    """The step a training command saves last, ``checkpoint-<--max_steps>`` (its last ``--max_steps=``)."""
    steps = [word.split("=", 1)[1] for word in argv if word.startswith("--max_steps=")]
    return int(steps[-1]) if steps else None


def _run_logged(stage: Stage, argv: list[str]) -> None:
    with _output_to(stage.log):
        call(importlib.import_module(stage.module).main, argv)


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


def run_side_by_side(streams: list[list[Stage]], workers: int, finished: dict[str, Path] | None = None,
                     cores: int | None = None, after: list[list[Stage]] = ()) -> dict[str, float]:
    """Run each stream's stages in order, the streams side by side in ``workers`` processes; a stage starts once
    the stages it ``needs`` have finished, in any stream (``finished``: the done markers, by name, of those that
    ran before this call, whose tokens key the stages reading them). A stage is handed to a process only when one
    is free, the streams' in their order first: ``after``'s streams (the evaluations of rows) take a process that
    no stage of ``streams`` can use yet, so that none idles while the longest training stream ends.

    Each process has its share of the cores, fixed by the plan (:func:`stage_threads`; ``cores``: the reference
    path's fixed count, not this machine's; it is the run's numerical path, part of every stage's key): the
    plan of ``streams`` alone for their stages, whatever ``after`` holds, and of all of them for ``after``'s. When a
    stage fails, no other one starts, those running finish, and the failure is raised."""
    finished, first = dict(finished or {}), len(streams)
    streams = [*streams, *after]
    markers = {**finished, **{stage.name: stage.marker for stream in streams for stage in stream}}
    for stage in (stage for stream in streams for stage in stream):
        unknown = sorted(set(stage.needs) - set(markers))
        if unknown:
            raise ValueError(f"stage {stage.name!r} needs {unknown}, which no stream runs")
        say(f"{stage.name}: queued (log: {stage.log})")
    pending = [list(stream) for stream in streams]
    done, seconds = set(finished), {}
    numerics = numerics_setting(cores)

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
            finish(starts[0], _run_stages([pending[starts[0]][0]], threads, numerics, markers))
    else:
        threads = [stage_threads(workers, first if i < first else len(streams), cores) for i in range(len(streams))]
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited torch threads or locks
        # one stage a process: a process that trained a model keeps its peak memory (glibc's heap) until it ends
        with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=exit_with,
                                 initargs=(os.getpid(),), max_tasks_per_child=1) as pool:
            running: dict = {}  # future -> its stream
            while any(pending):
                for i in ready(set(running.values()))[:workers - len(running)]:
                    running[pool.submit(_run_stages, [pending[i][0]], threads[i], numerics, markers)] = i
                if not running:
                    raise stuck()
                for future in wait(running, return_when=FIRST_COMPLETED).done:
                    finish(running.pop(future), future.result())  # a failure: raised when the running ones end
    for name, s in seconds.items():
        say(f"{name}: done in {s:.0f} s")
    return seconds
