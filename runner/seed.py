"""One training seed of a recipe (``demo.py``): data, SFT and RLFT side by side, every row evaluated on the held-out
episodes, the reflector's accuracy, then the seed's report (:func:`run_seed`). Each step is keyed by what it
computes from (:mod:`runner.stages`): an SFT by the bytes of its texts, the data step's token every other stage
(they read its folder), an SFT's the RL runs and evaluations that read its checkpoint, an RL run's the evaluations
of its rows."""

import json
import re
import time
from pathlib import Path

import yaml

from evaluation import evaluate
from experiment_args import parse_args
from prompts import LABEL_FILE
from recipes.base import Evaluation, Recipe
from rl_algorithms.defaults import replays
from runner import stages
from runner.report import accuracy_table, episodes_note, level_prefix, paper_table
from runner.stages import (
    WORKERS,
    LatestRun,
    Stage,
    done_marker,
    latest_run,
    numerics_setting,
    once,
    remembered,
    run_side_by_side,
    say,
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
    read, or run, there, under the same keys, so that a comparison of learners trains no model its column has."""
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
    sft_names = {role: f"SFT of the {role} ({spec.file})" for role, spec in recipe.sft.items()}

    def sft_checkpoint(role: str, prefix: str = "") -> LatestRun:
        return sft_checkpoint_of(recipe, sft_runs, role, prefix)

    def sft_stage(role: str) -> Stage:
        spec = recipe.sft[role]
        return Stage(sft_names[role], "supervised_pretrain", [
            *model, f"--ckpt_path={sft_runs / f'sft-{role}'}", f"--seed={seed}", f"--task_file={data / spec.file}",
            f"--max_steps={spec.steps}", f"--save_steps={recipe.save_every or spec.steps}", *recipe.sft_flags,
            f"--learning_rate={spec.learning_rate}", f"--lr_scheduler_type={spec.schedule}", *spec.flags],
            # keyed by the bytes of its texts (and the labels they were written with), not the data step's token: a
            # data step run again that writes this role's texts alike keeps its model
            sft_logs / f"sft-{role}.log", output=sft_runs / f"sft-{role}",
            files=(data / spec.file, *[path for path in (data / LABEL_FILE,) if path.is_file()]))

    rl_common = [*model, *recipe.task, *recipe.rl_flags(recipe, data), f"--seed={seed}", "--shrink_head",
                 f"--per_device_eval_batch_size={budget['rl_batch']}",
                 f"--per_device_train_batch_size={budget['rl_train_batch']}",
                 f"--learning_rate={budget['rl_learning_rate']}", f"--baseline={budget['rl_baseline']}",
                 f"--entropy_coef={budget['rl_entropy_coef']}", f"--eval_steps={budget['panel_every']}",
                 f"--eval_panel={budget['panel_episodes']}"]
    rl_runs = {name: runs / f"rl-{slug(name)}" for name in recipe.rl}
    rl_names = {name: f"RLFT: {name}" for name in recipe.rl}

    def rl_stage(name: str) -> Stage:
        variant = recipe.rl[name]
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
    tic = time.time()
    if recipe.overlap:  # RL stream i goes on where SFT stream i ends; a run starts once its SFT models are trained
        timings.update(run_side_by_side([sft + rl for sft, rl in zip(sft_streams, rl_streams)], workers,
                                        finished=markers, cores=cores))
        timings["SFT and RLFT (wall)"] = time.time() - tic
    else:
        timings.update(run_side_by_side(sft_streams, workers, finished=markers, cores=cores))
        timings["SFT (wall)"] = time.time() - tic
        tic = time.time()
        timings.update(run_side_by_side(rl_streams, workers, cores=cores, finished={
            **markers, **{stage.name: stage.marker for stream in sft_streams for stage in stream}}))
        timings["RLFT (wall)"] = time.time() - tic
    markers.update({stage.name: stage.marker for stream in sft_streams + rl_streams for stage in stream})
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

    def read_by(row) -> dict[str, Path]:
        """The done markers of the steps whose output a row reads: the data, its policy's and its reflector's."""
        kind, _, source = row.policy.partition(":")
        names = [DATA, sft_names[source] if kind == "sft" else rl_names[source],
                 *([sft_names[row.reflector]] if row.reflector else [])]
        return {name: markers[name] for name in names}

    reflecting_rows = {row.name for row in recipe.rows if row.reflector}
    configs = [{"name": row.name, "load_dir": str(policy_dir(row)),
                **({"reflect_load_dir": str(sft_dirs[row.reflector])} if row.reflector else {})} for row in recipe.rows]
    reads = {row.name: read_by(row) for row in recipe.rows}
    results = [dict(config, levels={}) for config in configs]
    accuracy: dict[str, list] = {}
    for index, (name, evaluation) in enumerate(recipe.evaluations.items()):
        eval_argv = evaluation_argv(recipe, evaluation, data)
        eval_args = parse_args([*eval_argv, f"--ckpt_path={runs}"])
        prefix = level_prefix(recipe, name)
        label = "evaluation" if index == 0 else f"evaluation ({name})"

        def evaluate_all(eval_argv=eval_argv, prefix=prefix, label=label, rows=evaluation.rows) -> float:
            tic = time.time()
            playing = [i for i, row in enumerate(recipe.rows) if rows is None or row.name in rows]
            clocks: dict[str, dict] = {}
            found = evaluate_side_by_side(eval_argv, [configs[i] for i in playing], runs, logs, label, workers, cores,
                                          clocks, reads)
            reflecting.update({f"{label}: {name}": clock["reflector"] for name, clock in clocks.items()
                               if name in reflecting_rows})
            for i, result in zip(playing, found):
                results[i]["levels"].update({prefix + level: figures for level, figures in result["levels"].items()})
            return time.time() - tic

        timed(label, evaluate_all)
        if index == 0 and recipe.accuracy is not None:
            row, reading = next((row, config) for config, row in zip(configs, recipe.rows) if row.sft_role
                                and row.reflector)
            # in this process: keyed as a stage is, by its command, the row it reads, and its players' tokens
            key = stage_key([*eval_argv, f"--ckpt_path={runs}"], numerics, (json.dumps(
                {"row": reading, "accuracy_episodes": budget["accuracy_episodes"]}, sort_keys=True),),
                tokens(read_by(row)))

            def measured(eval_args=eval_args, reading=reading, key=key) -> float:
                found, seconds = remembered(logs / ACCURACY, key, lambda: recipe.accuracy(recipe, eval_args, reading))
                accuracy.update(found)
                return seconds

            timed("reflector accuracy", measured)

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




def evaluate_side_by_side(argv: list[str], configs: list[dict], runs: Path, logs: Path, label: str,
                          workers: int, cores: int | None = None, clocks: dict | None = None,
                          reads: dict[str, dict[str, Path]] | None = None) -> list[dict]:
    """Evaluate the rows ``configs`` on the held-out episodes of ``argv``, shared out over ``workers``
    processes; their results in the order of ``configs`` (``clocks``, if given, gets each row's seconds by name:
    evaluate.SECONDS). A row plays the same episodes with the same sampling randomness wherever it runs
    (evaluation.evaluate seeds each configuration alike). ``reads``: by row name, the done markers of the stages
    whose output the row reads, so that a process's evaluation runs again when one of its rows' models does."""
    reads = reads or {}
    share = max(1, min(workers, len(configs)))
    parts: list[list[dict]] = [[] for _ in range(share)]
    load = [0] * share
    for config in sorted(configs, key=_evaluation_weight, reverse=True):  # the heaviest rows first, each to
        least = load.index(min(load))                                       # the least loaded process
        parts[least].append(config)
        load[least] += _evaluation_weight(config)
    folders = [runs / f"{slug(label)}-{part + 1}" for part in range(share)]
    streams, finished = [], {}
    for part, (rows, where) in enumerate(zip(parts, folders), 1):
        listing = logs / f"{where.name}.rows.yaml"  # beside its log: the stage empties its folder when it runs afresh
        listing.parent.mkdir(parents=True, exist_ok=True)
        listing.write_text(yaml.safe_dump(rows, sort_keys=False), encoding="utf-8")
        read = {name: marker for row in rows for name, marker in reads.get(row["name"], {}).items()}
        finished.update(read)
        streams.append([Stage(f"{label}, rows {part}/{share}", "evaluation.evaluate",
                              [*argv, f"--ckpt_path={where}", f"--eval_load_list={listing}"],
                              logs / f"{where.name}.log", inputs=(listing.read_text(encoding="utf-8"),),
                              needs=tuple(read), output=where)])
    run_side_by_side(streams, workers, finished=finished, cores=cores)
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
