"""`make demo` and the paper's other columns: the experiment runner, one recipe per column.

    python demo.py                        # Taxi pickup, training seed 0 (`make demo`)
    python demo.py --seed 2               # the whole pipeline with training seed 2
    python demo.py --seeds 0 1 2          # every seed, then one table: each row's mean and range
    python demo.py --task auto_explore    # another column (recipes.RECIPES: taxi_dropoff, alfworld, ...)
    python demo.py --task all --seeds 0 1 2   # every column, then the paper's table beside ours
    python demo.py --learners pg ppo refuel rloo grpo gigpo --seeds 0 1 2   # the RL learners side by side
    python demo.py --task taxi_dropoff --seed 0 --check_reflectors CKPT ...   # reflectors on validation episodes
    python demo.py --profile smoke        # every stage at a few steps: the pipeline end to end in about 25 s

A recipe (``recipes/``) holds a column's budget and its departures from the paper with their
reasons. Per training seed the runner plays it the same way for every column:

1. data: the recipe's data steps (offline writers);
2. SFT of each model the recipe names (the reflector beside the policies);
3. RLFT of each variant, each playing a fixed validation panel every few iterations (the curves);
4. evaluation of every row on the recipe's fixed held-out episodes (disjoint from every training
   seed's and from the validation panel's, the same for every seed), and the reflector's accuracy;
5. a results table shaped like the paper's, a plot of the RL curves, and the recipe's own figures of
   validation curves (e.g. the drop-off column's Figure 4).

Independent stages run side by side in ``--workers`` processes (2), each stage's output in ``seed-N/logs/``; a
stage starts once the stages it reads have finished (``Stage.needs``), so an RL run may start beside an SFT
it does not read (``Recipe.overlap``). ``--check_reflectors`` trains nothing: it judges SFT reflectors on
validation episodes, to choose a reflector's SFT without a held-out episode.
A seed that finished with the same settings is read back from its ``finished.json`` instead of run again,
so ``--seeds 0 1 2`` after ``--seed 0`` runs two seeds. A seed that stopped part-way (killed, or a stage
failed) resumes with the same settings: its data and every stage that finished (``logs/<stage>.done.json``)
are kept, and the rest runs again.

The tiny-gpt2 columns compute on the reference numerical path (utils/cpu.py), set before torch starts, so that one
seed gives one table on any x86 CPU with AVX2 (``--native_numerics``: the CPU's own path; a pretrained model always
takes it).

Everything lands in ``results/demo/`` (Taxi pickup) or ``results/demo/<task>/`` (``--ckpt_path DIR``:
``DIR/demo/...``): ``seed-N/`` per seed, and ``results.md`` over the seeds. The model is the offline
``tiny-gpt2``: random weights, trained in full (``--no_use_peft``) because LoRA adapters over random
weights learn too slowly for a CPU budget; on a real model the same commands use LoRA (see the README).
"""

import argparse
import contextlib
import importlib
import json
import math
import multiprocessing
import os
import re
import shutil
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from utils import cpu

GPU_SMOKE_BATCH = 4  # --profile gpu-smoke: the most episodes an RL iteration or an evaluation batch plays (Recipe.smoke)
GPU_PROFILES = ("gpu", "gpu-smoke")  # the profiles that play a column's GPU recipe (reference_path_asked reads it)


def reference_path_asked(argv: list[str]) -> bool:
    """Whether a command line asks for the reference numerical path (utils/cpu.py): the tiny-gpt2 columns do, unless
    ``--native_numerics``. A pretrained model takes its CPU's own path: bfloat16 where native, which the reference
    path (oneDNN at AVX2) would emulate."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--native_numerics", action="store_true")
    early.add_argument("--model_name")
    early.add_argument("--profile")
    known, _ = early.parse_known_args(argv)
    return (not known.native_numerics and known.model_name in (None, "tiny-gpt2")
            and known.profile not in GPU_PROFILES)


# Whether this process is `python demo.py` on the reference path, set by itself before torch started: only then are
# its threads (and its stage processes') the path's. A run started in another process (a test calling main) keeps
# that process's threads, whatever its environment says.
STARTED_ON_REFERENCE_PATH = False
if __name__ == "__main__" and reference_path_asked(sys.argv[1:]):
    cpu.pin()  # before torch, MKL, oneDNN and NumPy start: they read the path once, when they do
    STARTED_ON_REFERENCE_PATH = True

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from evaluation import evaluate  # noqa: E402
from experiment_args import one_line_usage_errors, parse_args, unknown_words  # noqa: E402
from recipes import DEFAULT, RECIPES, gpu, learners  # noqa: E402
from recipes.base import Evaluation, Recipe  # noqa: E402
from recipes.paper_table import markdown as beside_the_paper  # noqa: E402
from utils import checkpoints, metrics, models  # noqa: E402
from utils.arg_groups import SEEDS, output_folders  # noqa: E402
from utils.errors import UsageError  # noqa: E402
from utils.io import write_json, write_text_atomic  # noqa: E402
from utils.paths import RESULTS_DIR  # noqa: E402
from visualization import plot  # noqa: E402

SEED = 0
WORKERS = 2  # processes for independent stages (the SFTs, the RL runs), each with its share of the threads
# --profile: the recipes' budgets; every stage at a few steps (Recipe.smoke); the column on one GPU (Recipe.gpu:
# recipes/gpu.py); that at a few steps (its plumbing, checked on a CPU with --model_name tiny-gpt2)
PROFILES = ("full", "smoke", "gpu", "gpu-smoke")
ALL = "all"  # --task all: every recipe, and the paper's table over them
FINISHED = "finished.json"  # in a seed's folder: its results and the settings they were made with
STARTED = "started.json"  # in a seed's folder while it runs: the settings it was started with
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


def sft_checkpoint_of(recipe: Recipe, runs: Path, role: str, prefix: str = "") -> LatestRun:
    """The final checkpoint of SFT ``role`` in a seed's ``runs`` folder, found when it is read."""
    return LatestRun(prefix, runs / f"sft-{role}", "supervised_pretrain", f"checkpoint-{recipe.sft[role].steps}")


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


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="demo.py", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    cli.add_argument("--task", default=DEFAULT, choices=[*sorted(RECIPES), ALL],
                     help=f"the column of the paper's table ({ALL}: every recipe, then results/demo/paper_table.md)")
    cli.add_argument("--seed", type=int, default=SEED, help="training seed of the whole pipeline")
    cli.add_argument("--seeds", type=int, nargs="+", help="several training seeds, one table over them")
    cli.add_argument("--ckpt_path", default=str(RESULTS_DIR), help="results go to CKPT_PATH/demo/")
    cli.add_argument("--workers", type=int, default=None,
                     help=f"independent stages run in this many processes at once (1: all in this one; default: "
                          f"{WORKERS}, or the GPU profile's, one per stage of its widest phase)")
    cli.add_argument("--model_name", default=None,
                     help="a pretrained base model (hub id, folder or .gguf file) instead of tiny-gpt2: the column's "
                          "recipe for a pretrained model (LoRA, the paper's data recipe), results in <task>-<model>/")
    cli.add_argument("--learners", nargs="+", metavar="LEARNER",
                     help="compare these RL learners (rl_algorithms.LEARNERS) on the column at the same episode budget: "
                          "its Reflect-RL and w/o-reflection runs once per learner, results in <task>-learners/")
    cli.add_argument("--reflection", default="both", choices=learners.REFLECTION,
                     help="with --learners: each learner's runs with reflection, without, or both")
    cli.add_argument("--profile", default="full", choices=PROFILES,
                     help="full: the recipe's budget; smoke: every stage at a few steps, minutes of CPU (the pipeline "
                          "checked end to end; tests/golden/demo_smoke.md is its table on the reference path); gpu: "
                          "the column on one GPU (recipes/gpu.py: SmolLM2-135M-Instruct unless --model_name, LoRA, bf16, "
                          "every stage of a phase side by side; `make gpu-column`); gpu-smoke: that at a few steps")
    cli.add_argument("--native_numerics", action="store_true",
                     help="compute on each library's fastest path for this CPU. By default the tiny-gpt2 columns take "
                          "the reference numerical path (utils/cpu.py: ATen, MKL, oneDNN and NumPy at AVX2, "
                          f"{cpu.PINNED_CORES} threads shared by the stages that run at once), so that one seed gives "
                          "one table on any x86 CPU with AVX2; a pretrained model (--model_name) takes its CPU's path")
    cli.add_argument("--check_reflectors", nargs="+", metavar="CHECKPOINT",
                     help="train nothing: judge these SFT reflectors on validation episodes, read by the SFT policy of "
                          "--seed's finished (or stopped) run, and print a table (to choose a reflector's SFT budget)")
    options, extra = cli.parse_known_args(list(argv or []))
    if extra:
        cli.error(unknown_words(cli, extra))
    seeds = options.seeds if options.seeds is not None else [options.seed]
    if len(set(seeds)) != len(seeds):
        cli.error(f"--seeds: each seed once, got {seeds}")
    if any(seed not in SEEDS for seed in seeds):  # checked here, not by the first stage that reads it
        cli.error(f"--seed: must be in [0, 2**32 - 1], got {options.seed}" if options.seeds is None else
                  f"--seeds: each in [0, 2**32 - 1], got {seeds}")
    if options.workers is not None and options.workers < 1:
        cli.error(f"--workers: at least 1, got {options.workers}")
    try:
        output_folders(options, "ckpt_path")  # the scripts' own check: not a file, nor under one
    except ValueError as error:
        cli.error(str(error))
    top = Path(options.ckpt_path) / "demo"
    recipes = list(RECIPES.values()) if options.task == ALL else [RECIPES[options.task]]
    if options.profile in GPU_PROFILES:
        lacking = [recipe.name for recipe in recipes if recipe.gpu is None]
        if lacking:
            cli.error(f"--profile {options.profile}: no GPU profile in {', '.join(lacking)} yet")
        try:  # a model that cannot be found fails here, not in the first stage that reads it
            model = options.model_name or gpu.default_model()
            models.resolve_model_path(model)
        except UsageError as error:
            cli.error(str(error))
        recipes = [recipe.gpu(model) for recipe in recipes]
    elif options.model_name is not None:
        lacking = [recipe.name for recipe in recipes if recipe.pretrained is None]
        if lacking:
            cli.error(f"--model_name: no recipe for a pretrained model in {', '.join(lacking)} yet "
                      f"(those that have one: {', '.join(r.name for r in RECIPES.values() if r.pretrained)})")
        try:  # a model that cannot be found fails here, not in the first stage that reads it
            models.resolve_model_path(options.model_name)
        except UsageError as error:
            cli.error(str(error))
        recipes = [recipe.pretrained(options.model_name) for recipe in recipes]
    if options.profile in ("smoke", "gpu-smoke"):
        recipes = [recipe.smoke(batch=GPU_SMOKE_BATCH if options.profile == "gpu-smoke" else None) for recipe in recipes]
    if options.learners is not None:
        if options.task == ALL:
            cli.error("--learners: one column at a time (--task all compares none)")
        try:
            recipes = [learners.compare(recipe, options.learners, options.reflection) for recipe in recipes]
        except ValueError as error:
            cli.error(str(error))
    elif options.reflection != "both":
        cli.error("--reflection: only with --learners")
    if options.check_reflectors is not None:
        if len(recipes) != 1 or len(seeds) != 1:
            cli.error("--check_reflectors: one --task and one --seed")
        (recipe,) = recipes
        folder = column_dir(top, recipe) / f"seed-{seeds[0]}"
        try:
            say(check_reflectors(recipe, folder, options.check_reflectors))
        except ValueError as error:
            cli.error(str(error))
        return 0
    cores = numerics(reference_path_asked(list(argv or [])))
    done = []
    for recipe in recipes:
        if recipe.notice:
            say(f"{recipe.title}, on {recipe.model_label}: {recipe.notice}")
        root = column_dir(top, recipe)
        workers = options.workers or recipe.workers or WORKERS
        runs = {seed: finished_or_run(recipe, seed, root / f"seed-{seed}", workers, cores) for seed in seeds}
        report = seeds_report(recipe, runs)
        write_text_atomic(root / "results.md", report)
        write_json(root / "results.json", {str(s): r for s, r in runs.items()})
        say(f"results over seeds {seeds} ({root / 'results.md'}):\n\n{report}")
        done.append((recipe, runs))
    if options.task == ALL:
        table = beside_the_paper(done, model=done[0][0].model_label,
                                 where="GPU" if options.profile in GPU_PROFILES else "CPU")
        name = "paper_table-gpu.md" if options.profile in GPU_PROFILES else "paper_table.md"
        write_text_atomic(top / name, table)
        say(f"the paper's table beside ours ({top / name}):\n\n{table}")
    return 0


def numerics(asked: bool) -> int | None:
    """The numerical path this run takes, said in one line: the reference one (its fixed thread count, returned) where
    it was ``asked`` for and this process started on it (``python demo.py``: :func:`reference_path_asked`), else
    this CPU's own (None)."""
    say(f"CPU: {cpu.caps().describe()}")
    if asked and STARTED_ON_REFERENCE_PATH and cpu.pinned():
        torch.set_num_threads(cpu.PINNED_CORES)  # this process's own work (the reflector's accuracy) too
        say(f"numerics: the reference path ({', '.join(f'{k}={v}' for k, v in cpu.PINNED.items())}; "
            f"{cpu.PINNED_CORES} threads shared by the stages running at once): one seed, one table on any x86 CPU "
            "with AVX2 (--native_numerics: this CPU's fastest path)")
        return cpu.PINNED_CORES
    if asked:
        say("numerics: this CPU's own path: the reference path is set when `python demo.py` starts, before torch, "
            "and this run was started otherwise (its tables may differ from the README's in the last bits, and so "
            "in their figures)")
    else:
        say("numerics: this CPU's own path (--native_numerics or a pretrained model): tables may differ from another "
            "CPU's")
    return None


def numerics_setting(cores: int | None) -> dict | str:
    """How a seed's numbers were computed, kept with its settings: a seed finished on one path is not read back
    for a run on the other."""
    return {"reference": cpu.PINNED, "cores": cores} if cores else "native"


def column_dir(top: Path, recipe: Recipe) -> Path:
    """Where a column's seeds and tables go: ``top`` itself for the default one (``make demo``), else a folder."""
    return top if recipe.name == DEFAULT else top / recipe.name


def finished_or_run(recipe: Recipe, seed: int, folder: Path, workers: int, cores: int | None = None) -> dict:
    """A seed's results: read back from ``folder/finished.json`` if an earlier run of the same
    settings finished them (so ``--seeds 0 1 2`` after ``--seed 0`` runs seeds 1 and 2 only), else run."""
    done, started = folder / FINISHED, folder / STARTED
    settings = json.loads(json.dumps({**recipe.settings(), "numerics": numerics_setting(cores)}))
    if done.is_file():
        saved = json.loads(done.read_text(encoding="utf-8"))
        if saved.get("settings") == settings:
            say(f"seed {seed}: finished earlier with the same settings, results read from {done}")
            return saved["run"]
        say(f"seed {seed}: {done} was made with other settings; running the seed again")
    elif started.is_file() and json.loads(started.read_text(encoding="utf-8")).get("settings") == settings:
        say(f"seed {seed}: an unfinished run with the same settings is resumed: its finished stages are kept")
        return _run_and_keep(recipe, seed, folder, workers, settings, cores)
    if folder.exists():
        shutil.rmtree(folder)  # an outdated seed, or one of other settings, starts clean: no stale runs mix in
    folder.mkdir(parents=True)
    write_json(started, {"settings": settings})
    return _run_and_keep(recipe, seed, folder, workers, settings, cores)


def _run_and_keep(recipe: Recipe, seed: int, folder: Path, workers: int, settings: dict, cores: int | None) -> dict:
    run = run_seed(recipe, seed, folder, workers, cores)
    write_json(folder / FINISHED, {"settings": settings, "run": run})
    return run


def run_seed(recipe: Recipe, seed: int, folder: Path, workers: int = WORKERS, cores: int | None = None) -> dict:
    """The whole pipeline of ``recipe`` with training seed ``seed``; its report in ``folder/results.md``. ``cores``:
    the threads the stages share (the reference path's fixed count; None: this machine's cores)."""
    data, runs, logs = folder / "data", folder / "runs", folder / "logs"
    budget, model = recipe.budget, list(recipe.model)
    timings: dict[str, float] = {}
    started = time.time()

    def timed(name: str, work, done: tuple[str, list[str]] | None = None) -> None:
        """Run ``work`` and record its seconds; with ``done`` (a marker name, the command), through :func:`once`:
        a resumed seed keeps work that finished, with its earlier seconds."""
        say(f"seed {seed}: {name} ...")
        if done is not None:
            timings[name] = once(logs, *done, work)
        else:
            tic = time.time()
            work()
            timings[name] = time.time() - tic
        say(f"seed {seed}: {name}: done in {timings[name]:.0f} s")

    # --- 1. data
    steps = recipe.data(recipe, seed, data)
    timed("data generation (oracle writer)", lambda: [call(main, argv) for main, argv in steps],
          done=("data", [f"{main.__module__} {' '.join(argv)}" for main, argv in steps]))

    # --- 2. SFT, the reflector beside the policies; 3. RLFT, each variant playing the validation panel
    sft_names = {role: f"SFT of the {role} ({spec.file})" for role, spec in recipe.sft.items()}

    def sft_checkpoint(role: str, prefix: str = "") -> LatestRun:
        return sft_checkpoint_of(recipe, runs, role, prefix)

    def sft_stage(role: str) -> Stage:
        spec = recipe.sft[role]
        return Stage(sft_names[role], "supervised_pretrain", [
            *model, f"--ckpt_path={runs / f'sft-{role}'}", f"--seed={seed}", f"--task_file={data / spec.file}",
            f"--max_steps={spec.steps}", f"--save_steps={spec.steps}", *recipe.sft_flags,
            f"--learning_rate={spec.learning_rate}", f"--lr_scheduler_type={spec.schedule}", *spec.flags],
            logs / f"sft-{role}.log")

    rl_common = [*model, *recipe.task, *recipe.rl_flags(recipe, data), f"--seed={seed}", "--shrink_head",
                 f"--per_device_eval_batch_size={budget['rl_batch']}",
                 f"--per_device_train_batch_size={budget['rl_train_batch']}",
                 f"--learning_rate={budget['rl_learning_rate']}", f"--baseline={budget['rl_baseline']}",
                 f"--entropy_coef={budget['rl_entropy_coef']}", f"--eval_steps={budget['panel_every']}",
                 f"--eval_panel={budget['panel_episodes']}"]
    rl_runs = {name: runs / f"rl-{slug(name)}" for name in recipe.rl}

    def rl_stage(name: str) -> Stage:
        variant = recipe.rl[name]
        starts = [sft_checkpoint(variant.policy, "--load_dir=")] if variant.policy else []
        starts += [f"--replay_batch_size={budget['rl_replay']}"] if variant.trainer == "pg" else []  # PG's replay
        starts += [*variant.flags, *(["--curriculum_steps", *map(str, variant.level_steps)] if variant.level_steps else [])]
        if variant.reflector:
            starts += [sft_checkpoint(variant.reflector, "--reflect_load_dir="), f"--top_k={budget['reflect_top_k']}"]
        return Stage(f"RLFT: {name}", "rl_finetune", [*rl_common, *starts, f"--ckpt_path={rl_runs[name]}",
                                                        f"--max_steps={variant.iterations}",
                                                        f"--save_steps={variant.iterations}"],
                     logs / f"rl-{slug(name)}.log",
                     needs=tuple(sft_names[role] for role in (variant.policy, variant.reflector) if role))

    sft_streams = [[sft_stage(role) for role in stream] for stream in recipe.sft_streams]
    rl_streams = [[rl_stage(name) for name in stream] for stream in recipe.rl_streams]
    tic = time.time()
    if recipe.overlap:  # RL stream i goes on where SFT stream i ends; a run starts once its SFT models are trained
        timings.update(run_side_by_side([sft + rl for sft, rl in zip(sft_streams, rl_streams)], workers,
                                        cores=cores))
        timings["SFT and RLFT (wall)"] = time.time() - tic
    else:
        timings.update(run_side_by_side(sft_streams, workers, cores=cores))
        timings["SFT (wall)"] = time.time() - tic
        tic = time.time()
        timings.update(run_side_by_side(rl_streams, workers, finished=tuple(sft_names.values()), cores=cores))
        timings["RLFT (wall)"] = time.time() - tic
    sft_dirs = {role: Path(str(sft_checkpoint(role))) for role in recipe.sft}
    rl = {name: latest_run(path, "rl_finetune") for name, path in rl_runs.items()}
    logged = {name: metrics.read_metrics(path) for name, path in rl.items()}
    played = {name: sum(record.get("episodes_played", 0) for record in records)
              for name, records in logged.items()}  # the episode budget each run spent, its learner's own ones included
    # the reflector's generation inside each stage that reflects (seconds of its process; stages run side by side)
    reflecting = {f"RLFT: {name}": sum(record.get("reflect_seconds", 0.0) for record in records)
                  for name, records in logged.items() if recipe.rl[name].reflector}

    # --- 4. evaluation on the fixed held-out episodes
    def policy_dir(row) -> Path:
        kind, _, source = row.policy.partition(":")
        return sft_dirs[source] if kind == "sft" else rl[source] / f"checkpoint-{recipe.rl[source].iterations}"

    configs = [{"name": row.name, "load_dir": str(policy_dir(row)),
                **({"reflect_load_dir": str(sft_dirs[row.reflector])} if row.reflector else {})} for row in recipe.rows]
    results = [dict(config, levels={}) for config in configs]
    accuracy: dict[str, list] = {}
    for index, (name, evaluation) in enumerate(recipe.evaluations.items()):
        eval_argv = evaluation_argv(recipe, evaluation, data)
        eval_args = parse_args([*eval_argv, f"--ckpt_path={runs}"])
        prefix = level_prefix(recipe, name)
        label = "evaluation" if index == 0 else f"evaluation ({name})"

        def evaluate_all(eval_argv=eval_argv, prefix=prefix, label=label, rows=evaluation.rows) -> None:
            playing = [i for i, row in enumerate(recipe.rows) if rows is None or row.name in rows]
            clocks: dict[str, dict] = {}
            found = evaluate_side_by_side(eval_argv, [configs[i] for i in playing], runs, logs, label, workers, cores,
                                          clocks)
            reflecting.update({f"{label}: {name}": clock["reflector"] for name, clock in clocks.items()
                               if recipe.rows[[row.name for row in recipe.rows].index(name)].reflector})
            for i, result in zip(playing, found):
                results[i]["levels"].update({prefix + level: figures for level, figures in result["levels"].items()})

        timed(label, evaluate_all)
        if index == 0 and recipe.accuracy is not None:
            reading = next(config for config, row in zip(configs, recipe.rows) if row.sft_role
                           and row.reflector)
            timed("reflector accuracy", lambda eval_args=eval_args, reading=reading: accuracy.update(
                recipe.accuracy(recipe, eval_args, reading)))

    # --- 5. table and plot
    curves = plot.plot([f"{name}={path}" for name, path in rl.items()], folder / "rl_curves.png",
                       title=f"{recipe.title}, {recipe.model_label} (offline demo, seed {seed})")
    for figure in recipe.figures:
        shift = dict(figure.shift)
        plot.plot_panel([(name, rl[name], shift.get(name, 0)) for name in figure.variants], folder / figure.file,
                        xlabel=figure.xlabel, title=f"{figure.title} (seed {seed})")
    total = time.time() - started
    report = (f"# Reflect-RL demo: {recipe.title}, {recipe.model_label}, offline, training seed {seed}\n\n"
              f"{paper_table(recipe, results)}\n{episodes_note(recipe, results)} per row (the same for every row and seed); "
              f"actions sampled at temperature 1, reflections greedy.\n\n"
              f"{accuracy_table(accuracy) if accuracy else ''}\n"
              "Episodes played in RL training: " + ", ".join(f"{name} {n}" for name, n in played.items()) + "\n\n"
              f"Training curves: {curves}" + "".join(f", {folder / figure.file}" for figure in recipe.figures) + "\n\n"
              f"Wall time: {total / 60:.1f} min (" + ", ".join(f"{k}: {v:.0f} s" for k, v in timings.items()) + ")\n\n"
              "The reflector's generation inside the stages that reflect: "
              + ", ".join(f"{k}: {v:.1f} s" for k, v in reflecting.items()) + "\n")
    (folder / "results.md").write_text(report, encoding="utf-8")
    say(f"seed {seed} ({folder / 'results.md'}):\n\n{report}")
    return {"results": results, "reflector_accuracy": accuracy, "timings": timings, "rl_episodes": played,
            "reflector_seconds": reflecting}


def evaluation_argv(recipe: Recipe, evaluation: Evaluation, data: Path) -> list[str]:
    """The flags ``evaluation`` is played with (the same episodes and sampling for every row and seed)."""
    budget = recipe.budget
    return [*recipe.model, *recipe.task, f"--seed={budget['eval_seed']}", "--shrink_head",
            f"--eval_reps={budget['eval_episodes']}", f"--per_device_eval_batch_size={budget['eval_batch']}",
            f"--eval_level_episodes={budget.get('eval_level_episodes', 0)}", f"--top_k={budget['reflect_top_k']}",
            *evaluation.flags(data)]


def check_reflectors(recipe: Recipe, folder: Path, reflectors: list[str]) -> str:
    """Each of ``reflectors`` (SFT checkpoints) judged on the validation episodes of the recipe's main evaluation:
    the seed's (``folder``) SFT policy plays them reading it, and its advice is compared with the oracle's move
    (``Recipe.accuracy``). A table, to choose a reflector's SFT (its budget, its rate) without a held-out episode."""
    if recipe.accuracy is None:
        raise ValueError(f"--check_reflectors: recipe {recipe.name} has no reflector accuracy (its advice names no move)")
    row = next(row for row in recipe.rows if row.sft_role and row.reflector)
    try:
        policy = str(sft_checkpoint_of(recipe, folder / "runs", row.sft_role))
    except RuntimeError as missing:  # no such run yet
        raise ValueError(f"--check_reflectors: no SFT {row.sft_role} in {folder / 'runs'}: run the seed first") from missing
    for reflector in map(Path, reflectors):
        if not reflector.is_dir():
            raise ValueError(f"--check_reflectors: {reflector} is not a checkpoint folder")
    evaluation = next(iter(recipe.evaluations.values()))
    eval_args = parse_args([*evaluation_argv(recipe, evaluation, folder / "data"), f"--ckpt_path={folder / 'runs'}"])
    lines = [f"Reflectors on {recipe.budget['accuracy_episodes']} validation episodes a unit, read by {policy}:", "",
             "| reflector | advice right | states | episodes right throughout | episodes |", "|---|---:|---:|---:|---:|"]
    for reflector in reflectors:
        found = recipe.accuracy(recipe, eval_args, {"name": row.name, "load_dir": policy,
                                                     "reflect_load_dir": str(reflector)}, split="validation")
        (right, states), (whole, episodes) = found["all"], found["episodes"]
        lines.append(f"| {reflector} | {right:.3f} | {states} | {whole:.3f} | {episodes} |")
    return "\n".join(lines) + "\n"


def evaluate_side_by_side(argv: list[str], configs: list[dict], runs: Path, logs: Path, label: str,
                          workers: int, cores: int | None = None, clocks: dict | None = None) -> list[dict]:
    """Evaluate the rows ``configs`` on the held-out episodes of ``argv``, shared out over ``workers``
    processes; their results in the order of ``configs`` (``clocks``, if given, gets each row's seconds by name:
    evaluate.SECONDS). A row plays the same episodes with the same sampling randomness wherever it runs
    (evaluation.evaluate seeds each configuration alike)."""
    share = max(1, min(workers, len(configs)))
    parts: list[list[dict]] = [[] for _ in range(share)]
    load = [0] * share
    for config in sorted(configs, key=_evaluation_weight, reverse=True):  # the heaviest rows first, each to
        least = load.index(min(load))                                       # the least loaded process
        parts[least].append(config)
        load[least] += _evaluation_weight(config)
    folders = [runs / f"{slug(label)}-{part + 1}" for part in range(share)]
    streams = []
    for part, (rows, where) in enumerate(zip(parts, folders), 1):
        where.mkdir(parents=True, exist_ok=True)
        listing = where / "rows.yaml"
        listing.write_text(yaml.safe_dump(rows, sort_keys=False), encoding="utf-8")
        streams.append([Stage(f"{label}, rows {part}/{share}", "evaluation.evaluate",
                              [*argv, f"--ckpt_path={where}", f"--eval_load_list={listing}"],
                              logs / f"{where.name}.log", inputs=(listing.read_text(encoding="utf-8"),))])
    run_side_by_side(streams, workers, cores=cores)
    found = {}
    for where in folders:
        run = latest_run(where, evaluate.SCRIPT)
        found.update({result["name"]: result for result in json.loads((run / "results.json").read_text())})
        if clocks is not None:
            clocks.update(json.loads((run / evaluate.SECONDS).read_text(encoding="utf-8")))
    return [found[config["name"]] for config in configs]


def _evaluation_weight(config: dict) -> int:
    """About how long a row's evaluation takes, relatively: a row that reflects writes a reflection per step."""
    return 3 if config.get("reflect_load_dir") else 1


def slug(name: str) -> str:
    """A folder name for a table row: 'SFT+RLFT w/o reflection' -> 'sft-rlft-w-o-reflection'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def accuracy_table(accuracy: dict[str, list]) -> str:
    steps = accuracy["steps"]
    lines = ["The SFT reflector advises the oracle's move (held-out episodes of 'SFT only, with reflection'):", "",
             "| step | " + " | ".join(str(step) for step, _, _ in steps) + " | all |",
             "|---|" + "---:|" * (len(steps) + 1),
             "| accuracy | " + " | ".join(f"{acc:.2f}" for _, acc, _ in steps) + f" | {accuracy['all'][0]:.2f} |",
             "| states | " + " | ".join(str(n) for _, _, n in steps) + f" | {accuracy['all'][1]} |"]
    return "\n".join(lines) + "\n"


def interval(p: float, n: int) -> float:
    """Half-width of the normal-approximation 95% interval of a success rate."""
    return 1.96 * math.sqrt(p * (1 - p) / n) if n else float("nan")


def columns(recipe: Recipe) -> list[tuple[str, str]]:
    """(result level, column name) of every column of the recipe's table, the main evaluation's first."""
    out = []
    for name, evaluation in recipe.evaluations.items():
        prefix = level_prefix(recipe, name)
        out += [(prefix + level, prefix + title) for level, title in evaluation.columns]
    return out


def level_prefix(recipe: Recipe, evaluation: str) -> str:
    """How an evaluation's levels are named in a seed's results: the main (first) one's as they are, the
    others' after their evaluation's name."""
    return "" if evaluation == next(iter(recipe.evaluations)) else f"{evaluation}: "


def paper_table(recipe: Recipe, results: list[dict]) -> str:
    if len(columns(recipe)) == 1:
        ((level, title),) = columns(recipe)
        lines = [f"| model / method | {title} success (± 95% interval) | avg cost | episodes |", "|---|---:|---:|---:|"]
        for result in results:
            figure = result["levels"][level]
            p, n = figure["success"], figure["episodes"]
            lines.append(f"| {result['name']} | {100 * p:.1f}% ± {100 * interval(p, n):.1f} | {figure['cost']:.3f} | {n} |")
        return "\n".join(lines) + "\n"
    lines = ["| model / method | " + " | ".join(f"{title} (± 95%, episodes)" for _, title in columns(recipe)) + " |",
             "|---|" + "---:|" * len(columns(recipe))]
    for result in results:
        cells = []
        for level, _ in columns(recipe):
            figure = result["levels"].get(level)
            if figure is None:
                cells.append("–")
                continue
            p, n = figure["success"], figure["episodes"]
            cells.append(f"{100 * p:.1f}% ± {100 * interval(p, n):.1f} ({n})")
        lines.append(f"| {result['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def seeds_report(recipe: Recipe, runs: dict[int, dict]) -> str:
    """Each row's success per seed, its mean and range (per column), then every seed's own table."""
    seeds = list(runs)
    lines = [f"# Reflect-RL demo over training seeds {', '.join(map(str, seeds))}: {recipe.title}, {recipe.model_label}", ""]
    for level, title in columns(recipe):
        success = {row.name: [] for row in recipe.rows}
        for run in runs.values():
            for result in run["results"]:
                if level in result["levels"]:
                    success[result["name"]].append(100 * result["levels"][level]["success"])
        if len(columns(recipe)) > 1:
            lines += [f"## {title}", ""]
        lines += ["| model / method | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | range |",
                  "|---|" + "---:|" * (len(seeds) + 2)]
        for row, values in success.items():
            if values:
                cells = " | ".join(f"{v:.1f}%" for v in values)
                lines.append(f"| {row} | {cells} | {np.mean(values):.1f}% | {min(values):.1f}–{max(values):.1f} |")
        lines.append("")
    per_seed = "\n".join(f"## Seed {s}\n\n{paper_table(recipe, run['results'])}\n"
                         f"{accuracy_table(run['reflector_accuracy']) if run['reflector_accuracy'] else ''}"
                         for s, run in runs.items())
    first = next(iter(runs.values()))["results"]
    return "\n".join(lines) + f"\n{episodes_note(recipe, first)} per row and seed (one fixed set).\n\n{per_seed}"


def episodes_note(recipe: Recipe, results: list[dict]) -> str:
    """How many held-out episodes stand behind each figure: the recipe's repetitions, or (with a per-level
    minimum) each column's episodes and the distinct tasks they repeat."""
    if not recipe.budget.get("eval_level_episodes"):
        return f"{recipe.budget['eval_episodes']} held-out episodes"
    levels = results[0]["levels"]
    cells = [f"{title}: {levels[level]['episodes']} episodes of {levels[level]['units']} distinct tasks"
             for level, title in columns(recipe) if level in levels]
    return "Held-out episodes (" + "; ".join(cells) + ")"


if __name__ == "__main__":
    sys.exit(one_line_usage_errors("demo.py", main, sys.argv[1:]))
