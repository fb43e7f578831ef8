"""`make demo`: the paper's pipeline on DangerousTaxi (pickup), offline, on a CPU.

1. data: "oracle + random" Taxi episodes with reflections from the offline oracle writer;
2. SFT: the reflection model, the policy that reads reflections, and a policy without;
3. RLFT three ways: Reflect-RL, SFT+RLFT without reflection, RLFT only;
4. evaluation of those and of the SFT-only models on the same held-out seeds;
5. a results table shaped like the paper's, and a plot of the RL training curves.

Everything lands in ``results/demo/`` (``--ckpt_path DIR`` moves it to ``DIR/demo/``). The model is the
offline ``tiny-gpt2``: random weights, trained in full here (``--no_use_peft``) because
LoRA adapters over random weights learn too slowly for a CPU budget; on a real model
the same commands use LoRA (see the README).
"""

import json
import math
import sys
import time
from pathlib import Path

import checkpoints
import data_gen.taxi.gen_sft
import data_gen.taxi.reflection
import rl_finetune
import supervised_pretrain
from envs.taxi import CURRICULA as TAXI_LEVELS
from evaluation import evaluate
from experiment_args import parse_args
from visualization import plot

# --- the demo's budget (2 CPU cores, under 20 minutes) -----------------------------------------
DATA_EPISODES = 3000  # "oracle + random 0.9", as the paper
SFT_STEPS = {"reflector": 600, "policy": 300, "plain": 300}
SFT_LEARNING_RATE = {"reflector": 2e-3, "policy": 1e-3, "plain": 1e-3}
RL_ITERATIONS = {"Reflect-RL": 100, "SFT+RLFT w/o reflection": 200, "RLFT only": 200}
RL_BATCH = 8  # episodes per iteration, plus as many replayed successes
RL_LEARNING_RATE = 2e-4
# The paper's REINFORCE has no baseline; with a few hundred iterations on a CPU, the
# variance a batch-mean baseline removes decides whether RL improves at all.
RL_BASELINE = "mean"
EVAL_EPISODES = 200
SEED = 0
# Pickup takes at most 9 moves. With the default horizon of 20, running out of time costs
# 1.0 and crashing only 0.5, so RL learns to crash early; at 10 both cost 0.5.
HORIZON = 10

LEVEL = 0  # pickup
TASK = ["--env=taxi", "--taxi_curriculum", f"--curriculum_index={LEVEL}", f"--horizon={HORIZON}"]


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
    options = parse_args(list(argv or []), prog="demo.py")
    root = Path(options.ckpt_path) / "demo"
    data, runs = root / "data", root / "runs"
    model = ["--model_name=tiny-gpt2", "--no_use_peft", f"--seed={SEED}", f"--ckpt_path={runs}"]
    timings: dict[str, float] = {}
    started = time.time()

    def timed(name: str, work) -> None:
        tic = time.time()
        say(f"{name} ...")
        work()
        timings[name] = time.time() - tic
        say(f"{name}: done in {timings[name]:.0f} s")

    # --- 1. data
    timed("data generation (oracle writer)", lambda: (
        call(data_gen.taxi.reflection.main, [*TASK, "--api=oracle", f"--num_episodes={DATA_EPISODES}",
                                             f"--output_dir={data}", f"--seed={SEED}"]),
        call(data_gen.taxi.gen_sft.main, [f"--task_file={data / 'data_reflection.json'}"]),
    ))

    # --- 2. SFT
    sft = {}
    for role, file in (("reflector", "sft_reflection.jsonl"), ("policy", "sft_policy.jsonl"), ("plain", "sft.jsonl")):
        def train(role=role, file=file):
            call(supervised_pretrain.main, [*model, f"--task_file={data / file}", f"--max_steps={SFT_STEPS[role]}",
                                            f"--save_steps={SFT_STEPS[role]}", "--logging_steps=50",
                                            "--per_device_train_batch_size=16",
                                            f"--learning_rate={SFT_LEARNING_RATE[role]}"])
            sft[role] = latest_run(runs, "supervised_pretrain") / f"checkpoint-{SFT_STEPS[role]}"
        timed(f"SFT of the {role} ({file})", train)

    # --- 3. RLFT three ways
    rl_common = [*model, *TASK, "--shrink_head", f"--per_device_eval_batch_size={RL_BATCH}",
                 f"--replay_batch_size={RL_BATCH}", "--per_device_train_batch_size=32",
                 f"--learning_rate={RL_LEARNING_RATE}", f"--baseline={RL_BASELINE}"]
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

    # --- 4. evaluation on the same held-out seeds
    configs = [
        {"name": "SFT only", "load_dir": str(sft["plain"])},
        {"name": "SFT only, with reflection", "load_dir": str(sft["policy"]), "reflect_load_dir": str(sft["reflector"])},
        {"name": "RLFT only", "load_dir": str(rl["RLFT only"] / f"checkpoint-{RL_ITERATIONS['RLFT only']}")},
        {"name": "SFT+RLFT w/o reflection", "load_dir": str(
            rl["SFT+RLFT w/o reflection"] / f"checkpoint-{RL_ITERATIONS['SFT+RLFT w/o reflection']}")},
        {"name": "Reflect-RL", "load_dir": str(rl["Reflect-RL"] / f"checkpoint-{RL_ITERATIONS['Reflect-RL']}"),
         "reflect_load_dir": str(sft["reflector"])},
    ]
    results: list[dict] = []

    def evaluate_all():
        eval_args = parse_args([*model, *TASK, "--shrink_head", f"--eval_reps={EVAL_EPISODES}",
                                "--per_device_eval_batch_size=50"])
        results.extend(evaluate.run(eval_args, configs).results)
    timed("evaluation", evaluate_all)

    # --- 5. table and plot
    table = paper_table(results)
    curves = plot.plot([f"{name}={path}" for name, path in rl.items()], root / "rl_curves.png",
                       title="DangerousTaxi pickup, tiny-gpt2 (offline demo)")
    total = time.time() - started
    report = (f"# Reflect-RL demo: DangerousTaxi pickup, tiny-gpt2, offline\n\n{table}\n"
              f"{EVAL_EPISODES} held-out episodes per row (the same seeds for every row); sampling at temperature 1.\n"
              f"Training curves: {curves}\n\nWall time: {total / 60:.1f} min ("
              + ", ".join(f"{k}: {v:.0f} s" for k, v in timings.items()) + ")\n")
    (root / "results.md").write_text(report, encoding="utf-8")
    (root / "results.json").write_text(json.dumps({"results": results, "timings": timings}, indent=2) + "\n")
    say(f"results ({root / 'results.md'}):\n\n{report}")
    return 0


def paper_table(results: list[dict]) -> str:
    lines = ["| model / method | Taxi pickup success (± 95% interval) | avg cost | episodes |", "|---|---:|---:|---:|"]
    for result in results:
        figure = result["levels"][TAXI_LEVELS[LEVEL]]
        p, n = figure["success"], figure["episodes"]
        half = 1.96 * math.sqrt(p * (1 - p) / n) if n else float("nan")  # normal approximation
        lines.append(f"| {result['name']} | {100 * p:.1f}% ± {100 * half:.1f} | {figure['cost']:.3f} | {n} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
