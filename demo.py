"""`make demo`: the paper's pipeline on DangerousTaxi (pickup), offline, on a CPU.

    python demo.py                 # one training seed (0), as `make demo`
    python demo.py --seed 2        # the whole pipeline with training seed 2
    python demo.py --seeds 0 1 2   # every seed, then one table: each row's mean and range

Per training seed:

1. data: "oracle + random 0.5" Taxi episodes with reflections from the offline oracle
   writer, each state labelled with the action taken (the paper's labels, ``--sft_label``;
   the paper's random share is 0.9, see ``DATA_RANDOM_PROB``);
2. SFT: the reflection model beside the policy that reads reflections and a policy without;
3. RLFT three ways, Reflect-RL beside SFT+RLFT without reflection and RLFT only, each
   playing a fixed held-out panel every ``PANEL_EVERY`` iterations (the curves' held-out
   success);
4. evaluation of those and of the SFT-only models on one fixed set of held-out episodes
   (disjoint from every training seed's episodes, the same for every seed), and the
   reflector's accuracy per step against the oracle;
5. a results table shaped like the paper's, and a plot of the RL curves.

Independent stages run side by side in ``--workers`` processes (2), each stage's output in ``seed-N/logs/``.
A seed that finished with the same settings is read back from its ``finished.json`` instead of run again,
so ``--seeds 0 1 2`` after ``--seed 0`` runs two seeds.

Everything lands in ``results/demo/`` (``--ckpt_path DIR``: ``DIR/demo/``): ``seed-N/`` per seed,
and ``results.md`` over the seeds. The model is the offline ``tiny-gpt2``: random weights, trained in
full here (``--no_use_peft``) because LoRA adapters over random weights learn too slowly for a CPU
budget; on a real model the same commands use LoRA (see the README). Every setting that departs from
the paper's is a constant below, with its reason.
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
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import data_gen.taxi.gen_sft
import data_gen.taxi.reflection
from envs import env_kwargs, make_env
from envs.taxi import CURRICULA as TAXI_LEVELS
from evaluation import evaluate
from experiment_args import parse_args
from utils import checkpoints, models
from utils.io import write_json
from utils.paths import RESULTS_DIR
from visualization import plot

# --- the demo's budget (2 CPU cores, under 20 minutes) and where it departs from the paper --------
DATA_EPISODES = 3000
# "oracle + random 0.5": the paper's Taxi recipe takes a random action with p = 0.9. Its SFT
# label carries almost no sign of the reflection's advice (0.25 against 0.15 for each other
# action), which a randomly initialised model cannot pick up in a CPU budget; at 0.5 it can.
DATA_RANDOM_PROB = 0.5
SFT_STEPS = {"reflector": 1000, "policy": 600, "plain": 600}
SFT_LEARNING_RATE = {"reflector": 2e-3, "policy": 1e-3, "plain": 1e-3}
# The reflector's accuracy caps what following it can win: a decaying rate lifts it from about
# 0.7 to about 0.9 at the same step count. The policies keep the paper's constant rate.
SFT_SCHEDULE = {"reflector": "cosine", "policy": "constant", "plain": "constant"}
RL_ITERATIONS = {"Reflect-RL": 120, "SFT+RLFT w/o reflection": 120, "RLFT only": 120}
RL_BATCH = 16  # episodes per iteration, plus up to 8 replayed successes
RL_REPLAY = 8
RL_LEARNING_RATE = 1e-4
# The paper's REINFORCE has no baseline; with a hundred iterations on a CPU, the variance a
# batch-mean baseline removes decides whether RL improves at all.
RL_BASELINE = "mean"
RL_ENTROPY_COEF = 0.0  # the paper's: no entropy bonus
# Greedy reflections (--top_k 1; the paper samples them at temperature 1): sampling costs a
# small reflector a tenth of its accuracy. The policy still samples its action.
REFLECT_TOP_K = 1
EVAL_EPISODES = 200
EVAL_SEED = 0  # sampling randomness of the final evaluation: the same for every training seed
PANEL_EVERY, PANEL_EPISODES = 20, 40  # the held-out curve: 40 fixed episodes every 20 iterations
ACCURACY_EPISODES = 50  # held-out episodes on which the reflector's advice is checked against the oracle
SEED = 0
# Pickup takes at most 9 moves. With the default horizon of 20, running out of time costs
# 1.0 and crashing only 0.5, so RL learns to crash early; at 10 both cost 0.5.
HORIZON = 10
WORKERS = 2  # processes for independent stages (the SFTs, the RL runs), each with its share of the threads
LEVEL = 0  # pickup
# The first pickup's reward of the README table's runs: +20 on top of the move's -1 (0.95); the paper's
# environment (the default now) pays 1.0 instead (README, "Parity with the paper's code").
PICKUP_REWARD = "add"
TASK = ["--env=taxi", "--taxi_curriculum", f"--curriculum_index={LEVEL}", f"--horizon={HORIZON}",
        f"--pickup_reward={PICKUP_REWARD}"]
ROWS = ("SFT only", "SFT only, with reflection", "RLFT only", "SFT+RLFT w/o reflection", "Reflect-RL")
FINISHED = "finished.json"  # in a seed's folder: its results and the budget they were made with
SFT_ROLES = {"reflector": "sft_reflection.jsonl", "policy": "sft_policy.jsonl", "plain": "sft.jsonl"}


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
class Stage:
    """One script run of the pipeline: ``module.main`` on ``argv``, its output in ``log``."""

    name: str
    module: str
    argv: list[str]
    log: Path


def _run_stages(stages: list[Stage], threads: int) -> dict[str, float]:
    """Run ``stages`` one after the other in this (worker) process; their seconds by name.

    Each stage's output (progress bars, warnings, library messages) goes to its log file, so
    that stages running side by side do not interleave on the terminal.
    """
    torch.set_num_threads(threads)
    seconds = {}
    for stage in stages:
        tic = time.time()
        with _output_to(stage.log):
            call(importlib.import_module(stage.module).main, stage.argv)
        seconds[stage.name] = time.time() - tic
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


def run_side_by_side(streams: list[list[Stage]], workers: int) -> dict[str, float]:
    """Run each stream (stages in order) in its own process, ``workers`` streams at a time."""
    for stage in (stage for stream in streams for stage in stream):
        say(f"{stage.name}: queued (log: {stage.log})")
    seconds: dict[str, float] = {}
    if workers <= 1:
        for stream in streams:
            seconds.update(_run_stages(stream, torch.get_num_threads()))
    else:
        threads = max(1, (os.cpu_count() or 1) // workers)
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited torch threads or locks
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            for done in [pool.submit(_run_stages, stream, threads) for stream in streams]:
                seconds.update(done.result())
    for name, s in seconds.items():
        say(f"{name}: done in {s:.0f} s")
    return seconds


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="demo.py", description=__doc__.split("\n\n")[0])
    cli.add_argument("--seed", type=int, default=SEED, help="training seed of the whole pipeline")
    cli.add_argument("--seeds", type=int, nargs="+", help="several training seeds, one table over them")
    cli.add_argument("--ckpt_path", default=str(RESULTS_DIR), help="results go to CKPT_PATH/demo/")
    cli.add_argument("--workers", type=int, default=WORKERS,
                     help="independent stages run in this many processes at once (1: all in this one)")
    options = cli.parse_args(list(argv or []))
    seeds = options.seeds if options.seeds is not None else [options.seed]
    if len(set(seeds)) != len(seeds):
        cli.error(f"--seeds: each seed once, got {seeds}")
    if options.workers < 1:
        cli.error(f"--workers: at least 1, got {options.workers}")
    root = Path(options.ckpt_path) / "demo"
    runs = {seed: finished_or_run(seed, root / f"seed-{seed}", options.workers) for seed in seeds}
    report = seeds_report(runs)
    (root / "results.md").write_text(report, encoding="utf-8")
    (root / "results.json").write_text(json.dumps({str(s): r for s, r in runs.items()}, indent=2) + "\n")
    say(f"results over seeds {seeds} ({root / 'results.md'}):\n\n{report}")
    return 0


def budget() -> dict:
    """Every setting of the demo's pipeline: a seed's finished results are reused only under the same."""
    names = ("DATA_EPISODES", "DATA_RANDOM_PROB", "SFT_STEPS", "SFT_LEARNING_RATE", "SFT_SCHEDULE", "RL_ITERATIONS",
             "RL_BATCH", "RL_REPLAY", "RL_LEARNING_RATE", "RL_BASELINE", "RL_ENTROPY_COEF", "REFLECT_TOP_K",
             "EVAL_EPISODES", "EVAL_SEED", "PANEL_EVERY", "PANEL_EPISODES", "ACCURACY_EPISODES", "HORIZON")
    return {name: globals()[name] for name in names}


def finished_or_run(seed: int, folder: Path, workers: int) -> dict:
    """A seed's results: read back from ``folder/finished.json`` if an earlier run of the same
    budget finished them (so ``--seeds 0 1 2`` after ``--seed 0`` runs seeds 1 and 2 only), else run."""
    done = folder / FINISHED
    if done.is_file():
        saved = json.loads(done.read_text(encoding="utf-8"))
        if saved["budget"] == json.loads(json.dumps(budget())):
            say(f"seed {seed}: finished earlier with the same settings, results read from {done}")
            return saved["run"]
        say(f"seed {seed}: {done} was made with other settings; running the seed again")
    if folder.exists():
        shutil.rmtree(folder)  # a half-finished or outdated seed starts clean: no stale runs mix in
    run = run_seed(seed, folder, workers)
    write_json(done, {"budget": budget(), "run": run})
    return run


def run_seed(seed: int, folder: Path, workers: int = WORKERS) -> dict:
    """The whole pipeline with training seed ``seed``; its report in ``folder/results.md``."""
    data, runs, logs = folder / "data", folder / "runs", folder / "logs"
    model = ["--model_name=tiny-gpt2", "--no_use_peft"]
    timings: dict[str, float] = {}
    started = time.time()

    def timed(name: str, work) -> None:
        tic = time.time()
        say(f"seed {seed}: {name} ...")
        work()
        timings[name] = time.time() - tic
        say(f"seed {seed}: {name}: done in {timings[name]:.0f} s")

    # --- 1. data
    timed("data generation (oracle writer)", lambda: (
        call(data_gen.taxi.reflection.main, [*TASK, "--api=oracle", f"--num_episodes={DATA_EPISODES}",
                                             f"--random_prob={DATA_RANDOM_PROB}", f"--output_dir={data}",
                                             f"--seed={seed}"]),
        call(data_gen.taxi.gen_sft.main, ["--env=taxi", "--model_name=tiny-gpt2",
                                          f"--task_file={data / 'data_reflection.json'}"]),
    ))

    # --- 2. SFT, the reflector beside the two policies
    def sft_stage(role: str) -> Stage:
        return Stage(f"SFT of the {role} ({SFT_ROLES[role]})", "supervised_pretrain", [
            *model, f"--ckpt_path={runs / f'sft-{role}'}", f"--seed={seed}", f"--task_file={data / SFT_ROLES[role]}",
            f"--max_steps={SFT_STEPS[role]}", f"--save_steps={SFT_STEPS[role]}", "--logging_steps=50",
            "--per_device_train_batch_size=16", f"--learning_rate={SFT_LEARNING_RATE[role]}",
            f"--lr_scheduler_type={SFT_SCHEDULE[role]}"], logs / f"sft-{role}.log")

    tic = time.time()
    timings.update(run_side_by_side([[sft_stage("reflector")], [sft_stage("policy"), sft_stage("plain")]], workers))
    timings["SFT (wall)"] = time.time() - tic
    sft_dirs = {role: latest_run(runs / f"sft-{role}", "supervised_pretrain") / f"checkpoint-{SFT_STEPS[role]}"
                for role in SFT_ROLES}

    # --- 3. RLFT three ways, Reflect-RL beside the two without reflection
    rl_common = [*model, *TASK, f"--seed={seed}", "--shrink_head", f"--per_device_eval_batch_size={RL_BATCH}",
                 f"--replay_batch_size={RL_REPLAY}", "--per_device_train_batch_size=32",
                 f"--learning_rate={RL_LEARNING_RATE}", f"--baseline={RL_BASELINE}",
                 f"--entropy_coef={RL_ENTROPY_COEF}", f"--eval_steps={PANEL_EVERY}", f"--eval_panel={PANEL_EPISODES}"]
    variants = {
        "Reflect-RL": [f"--load_dir={sft_dirs['policy']}", f"--reflect_load_dir={sft_dirs['reflector']}",
                       f"--top_k={REFLECT_TOP_K}"],
        "SFT+RLFT w/o reflection": [f"--load_dir={sft_dirs['plain']}"],
        "RLFT only": [],
    }
    rl_runs = {name: runs / f"rl-{slug(name)}" for name in variants}

    def rl_stage(name: str) -> Stage:
        steps = RL_ITERATIONS[name]
        return Stage(f"RLFT: {name}", "rl_finetune", [*rl_common, *variants[name], f"--ckpt_path={rl_runs[name]}",
                                                        f"--max_steps={steps}", f"--save_steps={steps}"],
                     logs / f"rl-{slug(name)}.log")

    tic = time.time()
    timings.update(run_side_by_side([[rl_stage("Reflect-RL")], [rl_stage("SFT+RLFT w/o reflection"), rl_stage("RLFT only")]],
                                    workers))
    timings["RLFT (wall)"] = time.time() - tic
    rl = {name: latest_run(path, "rl_finetune") for name, path in rl_runs.items()}

    # --- 4. evaluation on the fixed held-out episodes
    configs = [
        {"name": ROWS[0], "load_dir": str(sft_dirs["plain"])},
        {"name": ROWS[1], "load_dir": str(sft_dirs["policy"]), "reflect_load_dir": str(sft_dirs["reflector"])},
        {"name": ROWS[2], "load_dir": str(rl[ROWS[2]] / f"checkpoint-{RL_ITERATIONS[ROWS[2]]}")},
        {"name": ROWS[3], "load_dir": str(rl[ROWS[3]] / f"checkpoint-{RL_ITERATIONS[ROWS[3]]}")},
        {"name": ROWS[4], "load_dir": str(rl[ROWS[4]] / f"checkpoint-{RL_ITERATIONS[ROWS[4]]}"),
         "reflect_load_dir": str(sft_dirs["reflector"])},
    ]
    eval_args = parse_args([*model, f"--ckpt_path={runs}", *TASK, f"--seed={EVAL_SEED}", "--shrink_head",
                            f"--eval_reps={EVAL_EPISODES}", "--per_device_eval_batch_size=50",
                            f"--top_k={REFLECT_TOP_K}"])
    results: list[dict] = []
    accuracy: dict[str, list] = {}
    timed("evaluation", lambda: results.extend(evaluate.run(eval_args, configs).results))
    timed("reflector accuracy", lambda: accuracy.update(reflector_accuracy(eval_args, configs[1])))

    # --- 5. table and plot
    curves = plot.plot([f"{name}={path}" for name, path in rl.items()], folder / "rl_curves.png",
                       title=f"DangerousTaxi pickup, tiny-gpt2 (offline demo, seed {seed})")
    total = time.time() - started
    report = (f"# Reflect-RL demo: DangerousTaxi pickup, tiny-gpt2, offline, training seed {seed}\n\n"
              f"{paper_table(results)}\n{EVAL_EPISODES} held-out episodes per row (the same for every row and "
              f"seed); actions sampled at temperature 1, reflections greedy.\n\n{accuracy_table(accuracy)}\n"
              f"Training curves: {curves}\n\n"
              f"Wall time: {total / 60:.1f} min (" + ", ".join(f"{k}: {v:.0f} s" for k, v in timings.items()) + ")\n")
    (folder / "results.md").write_text(report, encoding="utf-8")
    say(f"seed {seed} ({folder / 'results.md'}):\n\n{report}")
    return {"results": results, "reflector_accuracy": accuracy, "timings": timings}


def slug(name: str) -> str:
    """A folder name for a table row: 'SFT+RLFT w/o reflection' -> 'sft-rlft-w-o-reflection'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def reflector_accuracy(eval_args, config: dict) -> dict[str, list]:
    """How often the SFT reflector advises the oracle's move, per step of held-out episodes."""
    labels = models.policy_labels(eval_args)
    envs = [make_env("taxi", **env_kwargs(eval_args, evaluation=True, labels=labels))
            for _ in range(eval_args.per_device_eval_batch_size)]
    try:
        starts = evaluate.test_episodes(eval_args, envs[0], ACCURACY_EPISODES)
        episodes = evaluate.evaluate_config(eval_args, config, envs, starts)
    finally:
        for env in envs:
            env.close()
    right: dict[int, list[bool]] = {}
    for episode in episodes:
        for step, decision in enumerate(episode.decisions):
            oracle = re.search(rf"^{re.escape(labels[decision.oracle])}\. (.+)$", decision.obs, re.M).group(1)
            right.setdefault(step, []).append(data_gen.taxi.reflection.advised_command(decision.reflection) == oracle)
    every = [ok for oks in right.values() for ok in oks]
    return {"steps": [[step, float(np.mean(oks)), len(oks)] for step, oks in sorted(right.items())],
            "all": [float(np.mean(every)), len(every)]}


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


def paper_table(results: list[dict]) -> str:
    lines = ["| model / method | Taxi pickup success (± 95% interval) | avg cost | episodes |", "|---|---:|---:|---:|"]
    for result in results:
        figure = result["levels"][TAXI_LEVELS[LEVEL]]
        p, n = figure["success"], figure["episodes"]
        lines.append(f"| {result['name']} | {100 * p:.1f}% ± {100 * interval(p, n):.1f} | {figure['cost']:.3f} | {n} |")
    return "\n".join(lines) + "\n"


def seeds_report(runs: dict[int, dict]) -> str:
    """Each row's success per seed, its mean and range, then every seed's own table."""
    seeds = list(runs)
    success = {row: [] for row in ROWS}
    for run in runs.values():
        for result in run["results"]:
            success[result["name"]].append(100 * result["levels"][TAXI_LEVELS[LEVEL]]["success"])
    lines = [f"# Reflect-RL demo over training seeds {', '.join(map(str, seeds))}: DangerousTaxi pickup, tiny-gpt2", "",
             "| model / method | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | range |",
             "|---|" + "---:|" * (len(seeds) + 2)]
    for row, values in success.items():
        cells = " | ".join(f"{v:.1f}%" for v in values)
        lines.append(f"| {row} | {cells} | {np.mean(values):.1f}% | {min(values):.1f}–{max(values):.1f} |")
    per_seed = "\n".join(f"## Seed {s}\n\n{paper_table(run['results'])}\n{accuracy_table(run['reflector_accuracy'])}"
                         for s, run in runs.items())
    return "\n".join(lines) + f"\n\n{EVAL_EPISODES} held-out episodes per row and seed (one fixed set).\n\n{per_seed}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
