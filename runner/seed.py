"""One training seed of a recipe (``demo.py``): data, SFT and RLFT side by side, every row evaluated on the held-out
episodes (a stage a row, started once its models are trained, beside the runs still training), the reflector's
accuracy, then the seed's report (:func:`run_seed`). Each step is keyed by what it
computes from (:mod:`runner.stages`): an SFT by the bytes of its texts, the data step's token every other stage
(they read its folder), an SFT's the RL runs and evaluations that read its checkpoint, an RL run's the evaluations
of its rows."""

import functools
import json
import re
import time
from pathlib import Path

from evaluation import evaluate
from experiment_args import parse_args
from prompts import LABEL_FILE
from recipes.base import Evaluation, Recipe
from rl_algorithms.defaults import replays
from runner import stages
from runner.markers import done_marker, once, recalled, remembered, say
from runner.report import accuracy_table, episodes_note, level_prefix, paired_gaps, paper_table
from runner.stages import (
    WORKERS,
    LatestRun,
    Listing,
    Stage,
    kept,
    latest_run,
    numerics_setting,
    run_side_by_side,
    stage_key,
    tokens,
)
from utils import metrics
from visualization import plot

DATA = "data"  # the data step's name among the stages (its marker: logs/data.done.json); RL and evaluation read its folder
ACCURACY = "reflector-accuracy.json"  # in a seed's logs: the reflector's accuracy, with the key it was measured under


def sft_checkpoint_of(recipe: Recipe, runs: Path, role: str, prefix: str = "") -> LatestRun:
    """The final checkpoint of SFT ``role`` in a seed's ``runs`` folder, found when it is read: in its latest run,
    the one that continued it where the SFT was cut short and resumed."""
    return LatestRun(prefix, runs / f"sft-{role}", "supervised_pretrain", f"checkpoint-{recipe.sft[role].steps}")


def run_seed(recipe: Recipe, seed: int, folder: Path, workers: int = WORKERS, cores: int | None = None,
             home: Path | None = None) -> dict:
    """The whole pipeline of ``recipe`` with training seed ``seed``; its report in ``folder/results.md``. ``cores``:
    the threads the stages share (the reference path's fixed count; None: this machine's cores), and so the
    numerical path every step is keyed by. A step that finished with its key is kept, whatever else changed.
    ``home``: the seed folder of the column whose data and SFT stages this one shares (``Recipe.shares``): they are
    read, or run, there, under the same keys, so that a comparison of learners trains no model its column has.

    A recipe cut down to some of its rows (``Recipe.only``) runs only their stages, and its report also gives each
    other row of the recipe it was cut from (``Recipe.whole``) whose evaluation finished under the key it would run
    with now (:func:`runner.stages.kept`), as does the reflector's accuracy: an earlier run of every row, then
    ``--rows`` of one, still reports them all."""
    full = recipe.whole or recipe  # the stages' commands are its own: a cut-down recipe runs some of them
    runs, logs = folder / "runs", folder / "logs"
    home = home or folder
    data, sft_runs, sft_logs = home / "data", home / "runs", home / "logs"
    budget, model = recipe.budget, list(recipe.model)
    numerics = numerics_setting(cores)
    timings: dict[str, float] = {}
    started = time.time()

    def timed(name: str, work) -> None:
        """Run ``work`` (its seconds, or a kept step's earlier ones, returned) and record its seconds."""
        say(f"seed {seed}: {name} ...")
        timings[name] = work()
        say(f"seed {seed}: {name}: done in {timings[name]:.0f} s")

    # --- 1. data: its folder emptied when its key changed (its steps keep journals, of one key only)
    steps = recipe.data(recipe, seed, data)
    data_key = stage_key(recipe.data_commands(seed, data), numerics)
    timed("data generation (oracle writer)", lambda: once(
        sft_logs, DATA, data_key, lambda _: [stages.call(main, argv) for main, argv in steps], folder=data))
    markers = {DATA: done_marker(sft_logs, DATA)}  # every finished step's done marker, by name, as the stages read them

    # --- 2. SFT, the reflector beside the policies; 3. RLFT, each variant playing the validation panel
    sft_names = {role: f"SFT of the {role} ({spec.file})" for role, spec in full.sft.items()}

    def sft_checkpoint(role: str, prefix: str = "") -> LatestRun:
        return sft_checkpoint_of(full, sft_runs, role, prefix)

    def sft_stage(role: str) -> Stage:
        spec = full.sft[role]
        return Stage(sft_names[role], "supervised_pretrain", [
            *model, f"--ckpt_path={sft_runs / f'sft-{role}'}", f"--seed={seed}", f"--task_file={data / spec.file}",
            f"--max_steps={spec.steps}", f"--save_steps={recipe.save_every or spec.steps}", *recipe.sft_flags,
            f"--learning_rate={spec.learning_rate}", f"--lr_scheduler_type={spec.schedule}", *spec.flags],
            # keyed by the bytes of its texts (and the labels they were written with), not the data step's token: a
            # data step run again that writes this role's texts alike keeps its model
            sft_logs / f"sft-{role}.log", output=sft_runs / f"sft-{role}",
            files=(data / spec.file, *[path for path in (data / LABEL_FILE,) if path.is_file()]))

    rl_common = [*model, *recipe.task, *recipe.rl_flags(recipe, data), f"--seed={seed}", *recipe.policy_flags,
                 f"--per_device_eval_batch_size={budget['rl_batch']}",
                 f"--per_device_train_batch_size={budget['rl_train_batch']}",
                 f"--learning_rate={budget['rl_learning_rate']}", f"--baseline={budget['rl_baseline']}",
                 f"--entropy_coef={budget['rl_entropy_coef']}", f"--eval_steps={budget['panel_every']}",
                 f"--eval_panel={budget['panel_episodes']}"]
    rl_runs = {name: runs / f"rl-{slug(name)}" for name in full.rl}
    rl_names = {name: f"RLFT: {name}" for name in full.rl}

    def rl_stage(name: str) -> Stage:
        variant = full.rl[name]
        starts = [sft_checkpoint(variant.policy, "--load_dir=")] if variant.policy else []
        # the recipe's replay for every learner that replays successes by default (PG's, and the group learners')
        starts += [f"--replay_batch_size={budget['rl_replay']}"] if replays(variant.trainer) else []
        starts += [*variant.flags, *(["--curriculum_steps", *map(str, variant.level_steps)] if variant.level_steps else [])]
        if variant.reflector:
            starts += [sft_checkpoint(variant.reflector, "--reflect_load_dir="), f"--top_k={budget['reflect_top_k']}"]
        save_every = recipe.rl_save_every or recipe.save_every or variant.iterations
        return Stage(rl_names[name], "rl_finetune", [*rl_common, *starts, f"--ckpt_path={rl_runs[name]}",
                                                     f"--max_steps={variant.iterations}", f"--save_steps={save_every}"],
                     logs / f"rl-{slug(name)}.log", output=rl_runs[name],
                     needs=(DATA, *(sft_names[role] for role in (variant.policy, variant.reflector) if role)))

    sft_streams = [[sft_stage(role) for role in stream] for stream in recipe.sft_streams]
    rl_streams = [[rl_stage(name) for name in stream] for stream in recipe.rl_streams]

    # --- 4. evaluation on the fixed held-out episodes: a stage a row and evaluation, queued with the RL runs, so that
    # a process no RL run can use yet plays the rows whose models are trained (the heaviest first)
    def config_of(row) -> dict:
        """A row's entry in its evaluation's list, its checkpoints found when the evaluation starts."""
        variant = row.rl_variant
        policy = sft_checkpoint(row.sft_role) if variant is None else LatestRun(
            "", rl_runs[variant], "rl_finetune", f"checkpoint-{full.rl[variant].iterations}")
        return {"name": row.name, "load_dir": policy,
                **({"reflect_load_dir": sft_checkpoint(row.reflector)} if row.reflector else {})}

    def read_by(row) -> tuple[str, ...]:
        """The steps whose output a row reads: the data, its policy's and its reflector's."""
        return (DATA, sft_names[row.sft_role] if row.rl_variant is None else rl_names[row.rl_variant],
                *([sft_names[row.reflector]] if row.reflector else []))

    def eval_stage(label: str, evaluation: Evaluation, row) -> Stage:
        """Row ``row`` playing ``evaluation`` (``label``: as the stages name it), in its folder."""
        where = runs / f"{slug(label)}-{slug(row.name)}"
        listing = Listing(logs / f"{where.name}.rows.yaml", (tuple(config_of(row).items()),))
        return Stage(f"{label}: {row.name}", "evaluation.evaluate", [
            *evaluation_argv(full, evaluation, data), f"--ckpt_path={where}", f"--eval_load_list={listing.path}"],
            logs / f"{where.name}.log", needs=read_by(row), output=where, listing=listing)

    def played_by(evaluation: Evaluation, rows) -> list:
        return [row for row in rows if evaluation.rows is None or row.name in evaluation.rows]

    labels = {name: "evaluation" if index == 0 else f"evaluation ({name})"
              for index, name in enumerate(full.evaluations)}
    playing = {}  # by evaluation label: its level prefix, and each row it plays now, by row name
    eval_streams = []
    for name, evaluation in recipe.evaluations.items():
        rows = played_by(evaluation, recipe.rows)
        playing[labels[name]] = (level_prefix(full, name), {row.name: row for row in rows})
        # a row that reflects is the longer to play
        eval_streams += [[eval_stage(labels[name], evaluation, row)] for row in
                         sorted(rows, key=lambda row: row.reflector is None)]

    tic = time.time()
    if recipe.overlap:  # RL stream i goes on where SFT stream i ends; a run starts once its SFT models are trained
        timings.update(run_side_by_side([sft + rl for sft, rl in zip(sft_streams, rl_streams)], workers,
                                        finished=markers, cores=cores, after=eval_streams))
        timings["SFT, RLFT and evaluation (wall)"] = time.time() - tic
    else:
        timings.update(run_side_by_side(sft_streams, workers, finished=markers, cores=cores))
        timings["SFT (wall)"] = time.time() - tic
        tic = time.time()
        timings.update(run_side_by_side(rl_streams, workers, cores=cores, after=eval_streams, finished={
            **markers, **{stage.name: stage.marker for stream in sft_streams for stage in stream}}))
        timings["RLFT and evaluation (wall)"] = time.time() - tic
    # every stage of the whole recipe, those not run now included (found on disk where an earlier run made them)
    every = {stage.name: stage for stage in [*map(sft_stage, full.sft), *map(rl_stage, full.rl)]}
    markers.update({name: stage.marker for name, stage in every.items()})
    here = {stage.name for stream in sft_streams + rl_streams for stage in stream}

    def reads_standing(stage: Stage) -> bool:
        """Whether every stage ``stage`` reads stands (the data step ran now)."""
        return all(standing(name) for name in stage.needs if name in every)

    @functools.cache
    def standing(name: str) -> bool:
        """Whether stage ``name`` ran now, or finished earlier under the key it would run with now, as did every
        stage it reads in turn: a later run would keep it."""
        return name in here or (reads_standing(every[name]) and kept(every[name], numerics, markers))

    for name, evaluation in full.evaluations.items():  # the rows not played now whose evaluations stand
        _, rows = playing.setdefault(labels[name], (level_prefix(full, name), {}))
        for row in played_by(evaluation, full.rows):
            stage = eval_stage(labels[name], evaluation, row)
            if row.name not in rows and reads_standing(stage) and kept(stage, numerics, markers):
                rows[row.name] = row
                timings[stage.name] = json.loads(stage.marker.read_text(encoding="utf-8"))["seconds"]
    reported = [row for row in full.rows if any(row.name in rows for _, rows in playing.values())]
    rl = {name: latest_run(path, "rl_finetune") for name, path in rl_runs.items()
          if standing(rl_names[name])}
    logged = {name: metrics.read_metrics(path) for name, path in rl.items()}
    played = {name: sum(record.get("episodes_played", 0) for record in records)
              for name, records in logged.items()}  # the episode budget each run spent, its learner's own ones included
    # the reflector's generation inside each stage that reflects (seconds of its process; stages run side by side)
    reflecting = {f"RLFT: {name}": sum(record.get("reflect_seconds", 0.0) for record in records)
                  for name, records in logged.items() if full.rl[name].reflector}

    configs = [{key: str(value) for key, value in config_of(row).items()} for row in reported]
    results = [dict(config, levels={}) for config in configs]
    for label, (prefix, shown) in playing.items():
        timings[label] = sum(timings[f"{label}: {name}"] for name in shown)  # its processes' seconds
        for result, row in zip(results, reported):
            if row.name in shown:
                run = latest_run(runs / f"{slug(label)}-{slug(row.name)}", evaluate.SCRIPT)
                (found,) = json.loads((run / "results.json").read_text(encoding="utf-8"))
                result["levels"].update({prefix + level: figures for level, figures in found["levels"].items()})
                if row.reflector:
                    clock = json.loads((run / evaluate.SECONDS).read_text(encoding="utf-8"))[row.name]
                    reflecting[f"{label}: {row.name}"] = clock["reflector"]

    # --- the reflector's accuracy, on the held-out evaluation's episodes
    accuracy: dict[str, list] = {}
    row = next((row for row in full.rows if row.sft_role and row.reflector), None)
    # measured where this run trains the row's models; else read back where it was, from models that still stand
    if full.accuracy is not None and full.evaluations and row is not None and (
            recipe.accuracy is not None or all(standing(name) for name in read_by(row) if name in every)):
        evaluation = next(iter(full.evaluations.values()))
        eval_argv = evaluation_argv(full, evaluation, data)
        reading = {key: str(value) for key, value in config_of(row).items()}
        # in this process: keyed as a stage is, by its command, the row it reads, and its players' tokens
        key = stage_key([*eval_argv, f"--ckpt_path={runs}"], numerics, (json.dumps(
            {"row": reading, "accuracy_episodes": budget["accuracy_episodes"]}, sort_keys=True),),
            tokens({name: markers[name] for name in read_by(row)}))
        if recipe.accuracy is not None:
            eval_args = parse_args([*eval_argv, f"--ckpt_path={runs}"])

            def measured() -> float:
                found, seconds = remembered(logs / ACCURACY, key, lambda: recipe.accuracy(recipe, eval_args, reading))
                accuracy.update(found)
                return seconds

            timed("reflector accuracy", measured)
        elif (found := recalled(logs / ACCURACY, key)) is not None:
            accuracy.update(found[0])

    # --- 5. table and plot
    curves = plot.plot([f"{name}={path}" for name, path in rl.items()], folder / "rl_curves.png",
                       title=f"{recipe.title}, {recipe.model_label} (offline demo, seed {seed})")
    for figure in recipe.figures:
        shift = dict(figure.shift)
        plot.plot_panel([(name, rl[name], shift.get(name, 0)) for name in figure.variants], folder / figure.file,
                        xlabel=figure.xlabel, title=f"{figure.title} (seed {seed})")
    total = time.time() - started
    report = (f"# Reflect-RL demo: {recipe.title}, {recipe.model_label}, offline, training seed {seed}\n\n"
              f"{paper_table(full, results)}\n{episodes_note(full, results)} per row (the same for every row and seed); "
              f"actions sampled at temperature 1, reflections greedy.\n\n{paired_gaps(full, results)}"
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
    return [*recipe.model, *recipe.task, f"--seed={budget['eval_seed']}", *recipe.policy_flags,
            f"--eval_reps={budget['eval_episodes']}", f"--per_device_eval_batch_size={budget['eval_batch']}",
            f"--eval_level_episodes={budget.get('eval_level_episodes', 0)}", f"--top_k={budget['reflect_top_k']}",
            *evaluation.flags(data)]


def slug(name: str) -> str:
    """A folder name for a table row: 'SFT+RLFT w/o reflection' -> 'sft-rlft-w-o-reflection'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
