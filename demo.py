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

Independent stages run side by side in ``--workers`` processes (2; runner/stages.py), each stage's output in ``seed-N/logs/``; a
stage starts once the stages it reads have finished (``Stage.needs``), so an RL run may start beside an SFT
it does not read (``Recipe.overlap``). ``--check_reflectors`` trains nothing: it judges SFT reflectors on
validation episodes, to choose a reflector's SFT without a held-out episode.
A seed that finished with the same settings is read back from its ``finished.json`` instead of run again,
so ``--seeds 0 1 2`` after ``--seed 0`` runs two seeds. Otherwise (other settings, or a seed that stopped
part-way) each step decides for itself, by its key (runner/stages.py): its command, its other inputs, the
numerical path and a token of each step whose output it reads. A step that finished with its key
(``logs/<stage>.done.json``) is kept, so a changed RL flag runs that RL run and the evaluation of its row again,
a changed SFT budget that SFT and what reads it, changed data settings everything. A step that runs afresh
moves what a run of another key left (its folder, markers, a seed's ``finished.json``) to ``seed-N/superseded/``
and says what changed in its key; one that was cut short continues with the same key, an SFT or RL stage from its
newest whole checkpoint (``--resume_from``; ``Recipe.save_every`` makes checkpoints to resume from). A model
file and the results folder are named by their absolute paths in every key, however ``--model_name`` and
``--ckpt_path`` spell them.

The tiny-gpt2 columns compute on the reference numerical path (utils/cpu.py), set before torch starts, so that one
seed gives one table on any x86 CPU with AVX2 (``--native_numerics``: the CPU's own path; a pretrained model always
takes it).

Everything lands in ``results/demo/`` (Taxi pickup) or ``results/demo/<task>/`` (``--ckpt_path DIR``:
``DIR/demo/...``): ``seed-N/`` per seed, and ``results.md`` over the seeds. The model is the offline
``tiny-gpt2``: random weights, trained in full (``--no_use_peft``) because LoRA adapters over random
weights learn too slowly for a CPU budget; on a real model the same commands use LoRA (see the README).
"""

import argparse
import json
import sys
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

import torch  # noqa: E402

from experiment_args import one_line_usage_errors, parse_args  # noqa: E402
from recipes import DEFAULT, RECIPES, gpu, learners  # noqa: E402
from recipes.base import Recipe  # noqa: E402
from recipes.paper_table import markdown as beside_the_paper  # noqa: E402
from runner.markers import difference, say, set_aside  # noqa: E402
from runner.report import seeds_report  # noqa: E402
from runner.seed import evaluation_argv, run_seed, sft_checkpoint_of  # noqa: E402
from runner.stages import WORKERS, numerics_setting  # noqa: E402
from utils import models  # noqa: E402
from utils.arg_groups import SEEDS, output_folders  # noqa: E402
from utils.arg_words import unknown_words  # noqa: E402
from utils.errors import UsageError  # noqa: E402
from utils.io import write_json, write_text_atomic  # noqa: E402
from utils.model_paths import canonical_model_name  # noqa: E402
from utils.paths import RESULTS_DIR  # noqa: E402

SEED = 0
# --profile: the recipes' budgets; every stage at a few steps (Recipe.smoke); the column on one GPU (Recipe.gpu:
# recipes/gpu.py); that at a few steps (its plumbing, checked on a CPU with --model_name tiny-gpt2)
PROFILES = ("full", "smoke", "gpu", "gpu-smoke")
ALL = "all"  # --task all: every recipe, and the paper's table over them
FINISHED = "finished.json"  # in a seed's folder: its results and the settings they were made with


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
    cli.add_argument("--rows", nargs="+", metavar="ROW",
                     help="only these rows of the column's table (names as the table gives them, e.g. 'SFT only' "
                          "Reflect-RL), and only the stages they read; a later run of every row in the same folder "
                          "keeps those stages, and the report still gives every other row whose stages an earlier run "
                          "finished under the same keys")
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
    top = Path(options.ckpt_path).expanduser().resolve() / "demo"  # one spelling in every key, as the model
    recipes = list(RECIPES.values()) if options.task == ALL else [RECIPES[options.task]]
    if options.profile in GPU_PROFILES:
        lacking = [recipe.name for recipe in recipes if recipe.gpu is None]
        if lacking:
            cli.error(f"--profile {options.profile}: no GPU profile in {', '.join(lacking)} yet")
        try:  # a model that cannot be found fails here, not in the first stage that reads it
            model = canonical_model_name(options.model_name or gpu.default_model())
            models.resolve_model_path(model)
        except UsageError as error:
            cli.error(str(error))
        recipes = [recipe.gpu(model) for recipe in recipes]
    elif options.model_name is not None:
        lacking = [recipe.name for recipe in recipes if recipe.pretrained is None]
        if lacking:
            cli.error(f"--model_name: no recipe for a pretrained model in {', '.join(lacking)} yet "
                      f"(those that have one: {', '.join(r.name for r in RECIPES.values() if r.pretrained)})")
        model = canonical_model_name(options.model_name)
        try:  # a model that cannot be found fails here, not in the first stage that reads it
            models.resolve_model_path(model)
        except UsageError as error:
            cli.error(str(error))
        recipes = [recipe.pretrained(model) for recipe in recipes]
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
    if options.rows is not None:
        if options.learners is not None:
            cli.error("--rows: not with --learners (a comparison of learners has rows of its own)")
        try:
            recipes = [recipe.only(options.rows) for recipe in recipes]
        except ValueError as error:
            cli.error(str(error))
    if options.check_reflectors is not None:
        if len(recipes) != 1 or len(seeds) != 1:
            cli.error("--check_reflectors: one --task and one --seed")
        (recipe,) = recipes
        folder = column_dir(top, recipe.name) / f"seed-{seeds[0]}"
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
        root = column_dir(top, recipe.name)
        workers = options.workers or recipe.workers or WORKERS
        # a comparison of learners reads the data and SFT models of its column's seed (Recipe.shares)
        runs = {seed: finished_or_run(recipe, seed, root / f"seed-{seed}", workers, cores,
                                      column_dir(top, recipe.shares) / f"seed-{seed}" if recipe.shares else None)
                for seed in seeds}
        report = seeds_report(recipe.whole or recipe, runs)  # every row an earlier run left standing too
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
    elif options.model_name is not None and options.profile == "full" and options.learners is None:
        name, table = pretrained_table(top, options.model_name)
        write_text_atomic(top / name, table)
        say(f"the paper's table beside ours on {Path(options.model_name).name}, every column of it finished so far "
            f"({top / name}):\n\n{table}")
    return 0


def pretrained_table(top: Path, model_name: str) -> tuple[str, str]:
    """The paper's table on the pretrained ``model_name``: its file name, and the table over every column whose
    recipe for that model has finished seeds under ``top`` (their ``results.json``; the others are "not run"), so
    that columns run one at a time, in different sessions, make one table (docs/results/)."""
    done = []
    for recipe in RECIPES.values():
        if recipe.pretrained is None:
            continue
        column = recipe.pretrained(model_name)
        saved = column_dir(top, column.name) / "results.json"
        if saved.is_file():
            runs = json.loads(saved.read_text(encoding="utf-8"))
            done.append((column, {int(seed): run for seed, run in runs.items()}))
    label = Path(model_name).name
    return f"paper_table-{label}.md", beside_the_paper(done, model=f"{label} under LoRA", where="CPU")


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


def column_dir(top: Path, name: str) -> Path:
    """Where the seeds and tables of the column (recipe) ``name`` go: ``top`` itself for the default one (``make
    demo``), else a folder."""
    return top if name == DEFAULT else top / name


def finished_or_run(recipe: Recipe, seed: int, folder: Path, workers: int, cores: int | None = None,
                    home: Path | None = None) -> dict:
    """A seed's results: read back from ``folder/finished.json`` if an earlier run of the same
    settings finished them (so ``--seeds 0 1 2`` after ``--seed 0`` runs seeds 1 and 2 only), else run, in the
    same folder: each step keeps what finished with its key (:func:`runner.seed.run_seed`; ``home``: the seed
    folder whose data and SFT models it reads and, where they have not finished, makes). A recipe cut down to some
    rows (``--rows``) always runs: its report gives the other rows as their stages stand now, which its settings
    do not say; what it keeps takes seconds to read."""
    done = folder / FINISHED
    settings = {**recipe.settings(seed, (home or folder) / "data"), "numerics": numerics_setting(cores)}
    settings = json.loads(json.dumps(settings))
    if done.is_file():
        saved = json.loads(done.read_text(encoding="utf-8"))
        if saved.get("settings") == settings and recipe.whole is None:
            say(f"seed {seed}: finished earlier with the same settings, results read from {done}")
            return saved["run"]
        # the folder's steps no longer all stand behind those results: set aside, never deleted
        aside = set_aside(folder, [done])
        say(f"seed {seed}: {done} was made with other settings ({difference(saved.get('settings'), settings)}); "
            f"it is moved to {aside}, and the steps they change run again" if recipe.whole is None else
            f"seed {seed}: some rows (--rows); what stands is kept, and {done} is moved to {aside}")
    folder.mkdir(parents=True, exist_ok=True)
    run = run_seed(recipe, seed, folder, workers, cores, home)
    write_json(done, {"settings": settings, "run": run})
    return run


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


if __name__ == "__main__":
    sys.exit(one_line_usage_errors("demo.py", main, sys.argv[1:]))
