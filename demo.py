"""`make demo`: the paper's pipeline on DangerousTaxi (pickup), offline, on a CPU.

    python demo.py                 # one training seed (0), as `make demo`
    python demo.py --seed 2        # the whole pipeline with training seed 2
    python demo.py --seeds 0 1 2   # every seed, then one table: each row's mean and range

Per training seed:

1. data: "oracle + random 0.9" Taxi episodes with reflections from the offline oracle
   writer, each state labelled with the action taken (the paper's recipe, ``--sft_label``);
2. SFT: the reflection model, the policy that reads reflections, and a policy without;
3. RLFT three ways: Reflect-RL, SFT+RLFT without reflection, RLFT only, each playing a
   fixed held-out panel every ``PANEL_EVERY`` iterations (the curves' held-out success);
4. evaluation of those and of the SFT-only models on one fixed set of held-out episodes
   (disjoint from every training seed's episodes, the same for every seed), and the
   reflector's accuracy per step against the oracle;
5. a results table shaped like the paper's, and a plot of the RL curves.

Everything lands in ``results/demo/`` (``--ckpt_path DIR`` moves it to ``DIR/demo/``):
``seed-N/`` per seed, and ``results.md`` over the seeds. The model is the offline
``tiny-gpt2``: random weights, trained in full here (``--no_use_peft``) because LoRA
adapters over random weights learn too slowly for a CPU budget; on a real model the same
commands use LoRA (see the README).
"""

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

import numpy as np

import checkpoints
import data_gen.taxi.gen_sft
import data_gen.taxi.reflection
import rl_finetune
import supervised_pretrain
from envs import env_kwargs, make_env
from envs.taxi import CURRICULA as TAXI_LEVELS
from evaluation import evaluate
from experiment_args import parse_args
from paths import RESULTS_DIR
from prompts import LABELS
from visualization import plot

# --- the demo's budget (2 CPU cores, under 20 minutes) and where it departs from the paper --------
DATA_EPISODES = 3000
DATA_RANDOM_PROB = 0.9  # "oracle + random 0.9", as the paper
SFT_STEPS = {"reflector": 600, "policy": 300, "plain": 300}
SFT_LEARNING_RATE = {"reflector": 2e-3, "policy": 1e-3, "plain": 1e-3}
RL_ITERATIONS = {"Reflect-RL": 100, "SFT+RLFT w/o reflection": 200, "RLFT only": 200}
RL_BATCH = 8  # episodes per iteration, plus as many replayed successes
RL_LEARNING_RATE = 2e-4
# The paper's REINFORCE has no baseline; with a few hundred iterations on a CPU, the
# variance a batch-mean baseline removes decides whether RL improves at all.
RL_BASELINE = "mean"
RL_ENTROPY_COEF = 0.0  # the paper's: no entropy bonus
EVAL_EPISODES = 200
EVAL_SEED = 0  # sampling randomness of the final evaluation: the same for every training seed
PANEL_EVERY, PANEL_EPISODES = 20, 40  # the held-out curve: 40 fixed episodes every 20 iterations
ACCURACY_EPISODES = 50  # held-out episodes on which the reflector's advice is checked against the oracle
SEED = 0
# Pickup takes at most 9 moves. With the default horizon of 20, running out of time costs
# 1.0 and crashing only 0.5, so RL learns to crash early; at 10 both cost 0.5.
HORIZON = 10

LEVEL = 0  # pickup
TASK = ["--env=taxi", "--taxi_curriculum", f"--curriculum_index={LEVEL}", f"--horizon={HORIZON}"]
ROWS = ("SFT only", "SFT only, with reflection", "RLFT only", "SFT+RLFT w/o reflection", "Reflect-RL")


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


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="demo.py", description=__doc__.split("\n\n")[0])
    cli.add_argument("--seed", type=int, default=SEED, help="training seed of the whole pipeline")
    cli.add_argument("--seeds", type=int, nargs="+", help="several training seeds, one table over them")
    cli.add_argument("--ckpt_path", default=str(RESULTS_DIR), help="results go to CKPT_PATH/demo/")
    options = cli.parse_args(list(argv or []))
    seeds = options.seeds if options.seeds is not None else [options.seed]
    if len(set(seeds)) != len(seeds):
        cli.error(f"--seeds: each seed once, got {seeds}")
    root = Path(options.ckpt_path) / "demo"
    runs = {seed: run_seed(seed, root / f"seed-{seed}") for seed in seeds}
    report = seeds_report(runs)
    (root / "results.md").write_text(report, encoding="utf-8")
    (root / "results.json").write_text(json.dumps({str(s): r for s, r in runs.items()}, indent=2) + "\n")
    say(f"results over seeds {seeds} ({root / 'results.md'}):\n\n{report}")
    return 0


def run_seed(seed: int, folder: Path) -> dict:
    """The whole pipeline with training seed ``seed``; its report in ``folder/results.md``."""
    data, runs = folder / "data", folder / "runs"
    model = ["--model_name=tiny-gpt2", "--no_use_peft", f"--ckpt_path={runs}"]
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
        call(data_gen.taxi.gen_sft.main, ["--env=taxi", f"--task_file={data / 'data_reflection.json'}"]),
    ))

    # --- 2. SFT
    sft = {}
    for role, file in (("reflector", "sft_reflection.jsonl"), ("policy", "sft_policy.jsonl"), ("plain", "sft.jsonl")):
        def train(role=role, file=file):
            call(supervised_pretrain.main, [*model, f"--seed={seed}", f"--task_file={data / file}",
                                            f"--max_steps={SFT_STEPS[role]}", f"--save_steps={SFT_STEPS[role]}",
                                            "--logging_steps=50", "--per_device_train_batch_size=16",
                                            f"--learning_rate={SFT_LEARNING_RATE[role]}"])
            sft[role] = latest_run(runs, "supervised_pretrain") / f"checkpoint-{SFT_STEPS[role]}"
        timed(f"SFT of the {role} ({file})", train)

    # --- 3. RLFT three ways
    rl_common = [*model, *TASK, f"--seed={seed}", "--shrink_head", f"--per_device_eval_batch_size={RL_BATCH}",
                 f"--replay_batch_size={RL_BATCH}", "--per_device_train_batch_size=32",
                 f"--learning_rate={RL_LEARNING_RATE}", f"--baseline={RL_BASELINE}",
                 f"--entropy_coef={RL_ENTROPY_COEF}", f"--eval_steps={PANEL_EVERY}", f"--eval_panel={PANEL_EPISODES}"]
    variants = {
        "Reflect-RL": [f"--load_dir={sft['policy']}", f"--reflect_load_dir={sft['reflector']}"],
        "SFT+RLFT w/o reflection": [f"--load_dir={sft['plain']}"],
        "RLFT only": [],
    }
    rl = {}
    for name, extra in variants.items():
        def train(name=name, extra=extra):
            steps = RL_ITERATIONS[name]
            call(rl_finetune.main, [*rl_common, *extra, f"--max_steps={steps}", f"--save_steps={steps}"])
            rl[name] = latest_run(runs, "rl_finetune")
        timed(f"RLFT: {name}", train)

    # --- 4. evaluation on the fixed held-out episodes
    configs = [
        {"name": ROWS[0], "load_dir": str(sft["plain"])},
        {"name": ROWS[1], "load_dir": str(sft["policy"]), "reflect_load_dir": str(sft["reflector"])},
        {"name": ROWS[2], "load_dir": str(rl[ROWS[2]] / f"checkpoint-{RL_ITERATIONS[ROWS[2]]}")},
        {"name": ROWS[3], "load_dir": str(rl[ROWS[3]] / f"checkpoint-{RL_ITERATIONS[ROWS[3]]}")},
        {"name": ROWS[4], "load_dir": str(rl[ROWS[4]] / f"checkpoint-{RL_ITERATIONS[ROWS[4]]}"),
         "reflect_load_dir": str(sft["reflector"])},
    ]
    eval_args = parse_args([*model, *TASK, f"--seed={EVAL_SEED}", "--shrink_head", f"--eval_reps={EVAL_EPISODES}",
                            "--per_device_eval_batch_size=50"])
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
              f"seed); sampling at temperature 1.\n\n{accuracy_table(accuracy)}\nTraining curves: {curves}\n\n"
              f"Wall time: {total / 60:.1f} min (" + ", ".join(f"{k}: {v:.0f} s" for k, v in timings.items()) + ")\n")
    (folder / "results.md").write_text(report, encoding="utf-8")
    say(f"seed {seed} ({folder / 'results.md'}):\n\n{report}")
    return {"results": results, "reflector_accuracy": accuracy, "timings": timings}


def reflector_accuracy(eval_args, config: dict) -> dict[str, list]:
    """How often the SFT reflector advises the oracle's move, per step of held-out episodes."""
    envs = [make_env("taxi", **env_kwargs(eval_args, evaluation=True)) for _ in range(eval_args.per_device_eval_batch_size)]
    try:
        starts = evaluate.test_episodes(eval_args, envs[0], ACCURACY_EPISODES)
        episodes = evaluate.evaluate_config(eval_args, config, envs, starts)
    finally:
        for env in envs:
            env.close()
    right: dict[int, list[bool]] = {}
    for episode in episodes:
        for step, decision in enumerate(episode.decisions):
            oracle = re.search(rf"^{re.escape(LABELS[decision.oracle])}\. (.+)$", decision.obs, re.M).group(1)
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
