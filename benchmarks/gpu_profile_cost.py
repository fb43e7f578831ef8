"""What the GPU profile's SFT costs a step on this CPU, per column, and the GPU window it implies.

    python -m benchmarks.gpu_profile_cost [--columns taxi_pickup auto_explore alfworld] [--steps 7]
        [--data_dir DIR] [--data_episodes 40] [--cpu_batch 2] [--out FILE.json]

For each column: its GPU profile's data steps (``recipes/<column>.py``, ``on_gpu_profile``) with the profile's model
(SmolLM2-135M-Instruct) into ``--data_dir/<column>`` (kept, and reused when there; Taxi and ALFWorld at
``--data_episodes`` episodes), then for the reflector's and the policy's SFT texts: how many there are, their length in
the model's tokens (as SFT cuts them), and the seconds of ``--steps`` SFT steps, in bfloat16 where this CPU computes it
natively (else float32), with the scripts' own loader (``benchmarks.sft_step``): at ``--cpu_batch`` texts a step (a CPU's
memory holds few of the longest at once), scaled to the profile's batch in proportion.

The GPU estimate scales each step by an SFT step measured on both machines, the one nearest in text length
(:data:`CALIBRATIONS`: the Taxi reflector's short texts and ALFWorld's long policy texts, each measured on an H200 with
two other SFTs sharing it, 2026-11-28, docs/gpu.md, and here in the same run). It is an estimate, not a measurement: a
GPU's advantage over a CPU changes with the text's length between the two points, and five SFTs share a GPU where those
shared it with two.
"""

import dataclasses
import math
import statistics
import sys
from pathlib import Path

from benchmarks.rows import own_flags, print_table, save
from benchmarks.sft_step import train_steps
from experiment_args import one_line_usage_errors, parse_args

PROG = "python -m benchmarks.gpu_profile_cost"
# The SFT steps measured on an H200, three SFTs sharing it (2026-11-28), each measured here too in every run: a GPU's
# advantage grows with the text's length, so each role is scaled by the one nearest its texts' mean length.
CALIBRATIONS = {("taxi_pickup", "reflector"): 0.21,  # 16 texts of ~140 tokens: 400 steps in 85 s
                ("alfworld", "policy"): 0.30}  # 8 texts of ~800 tokens (cut at 1,024): about 450 steps in 135 s
ROLES = ("reflector", "policy")  # one of each kind of text (the other roles' files are alike)


def column_data(recipe, folder: Path, episodes: int) -> None:
    """The column's data at the profile's settings, unless ``folder`` holds it."""
    from runner.stages import call

    if all((folder / recipe.sft[role].file).is_file() for role in ROLES):
        return
    if "data_episodes" in recipe.extra:
        recipe = dataclasses.replace(recipe, extra={**recipe.extra, "data_episodes": episodes})
    for main, argv in recipe.data(recipe, 0, folder):
        call(main, argv)


def lengths(model_name: str, task_file: Path, limit: int) -> list[int]:
    """Each text's length in the model's tokens, cut at ``limit`` as SFT cuts it."""
    from transformers import AutoTokenizer

    from supervised_pretrain import read_texts
    from utils.model_paths import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model_name))
    return [min(limit, len(tokenizer(text)["input_ids"])) for text in read_texts(str(task_file))]


def measure(recipe, role: str, folder: Path, steps: int, native_bf16: bool, cpu_batch: int) -> dict:
    """A role's texts and their SFT step on this CPU, at ``cpu_batch`` texts (a CPU's memory holds few of the longest
    at once: 8 AutoExplore texts of up to 1,024 tokens took more than 24 GB in bfloat16), scaled to the profile's
    batch in proportion."""
    spec = recipe.sft[role]
    argv = [*recipe.model, *recipe.sft_flags, *spec.flags, f"--task_file={folder / spec.file}", f"--max_steps={steps}",
            f"--learning_rate={spec.learning_rate}", "--seed=0", *(["--cpu_bf16"] if native_bf16 else [])]
    args = parse_args(argv, prog=PROG)
    found = lengths(args.model_name, folder / spec.file, args.max_seq_length)
    batch = min(cpu_batch, args.per_device_train_batch_size)
    trained = train_steps([*argv, f"--per_device_train_batch_size={batch}"])
    return {"texts": len(found), "tokens_mean": statistics.fmean(found), "tokens_median": statistics.median(found),
            "tokens_max": max(found), "batch": args.per_device_train_batch_size, "cpu_batch": batch,
            # the median of the steps after the first: a step with new shapes (oneDNN's kernels made for them) or a
            # busy moment of a shared machine costs several times a steady one
            "cpu_s_per_step": statistics.median(trained["seconds"][1:]) * args.per_device_train_batch_size / batch,
            "profile_steps": spec.steps}


def main(argv: list[str]) -> int:
    own, argv = own_flags(argv, PROG, __doc__, {
        "--columns": {"nargs": "+", "default": ["taxi_pickup", "auto_explore", "alfworld"]},
        "--steps": {"type": int, "default": 7}, "--data_dir": {"default": "results/gpu_profile_cost"},
        "--data_episodes": {"type": int, "default": 40}, "--cpu_batch": {"type": int, "default": 2}})
    from recipes import RECIPES, gpu
    from utils.cpu import cpu_native_bf16

    asked = parse_args(argv, prog=PROG)  # --help ends here, before anything runs
    model = asked.model_name if any(a.startswith("--model_name") for a in argv) else gpu.default_model()
    native = bool(cpu_native_bf16())
    columns = list(dict.fromkeys([*(column for column, _ in CALIBRATIONS), *own.columns]))
    results = []
    for name in columns:
        recipe = RECIPES[name].gpu(model)
        folder = Path(own.data_dir) / name
        column_data(recipe, folder, own.data_episodes)
        for role in ROLES:
            results.append({"column": name, "role": role,
                            **measure(recipe, role, folder, own.steps, native, own.cpu_batch)})
    points = [(next(r for r in results if (r["column"], r["role"]) == key), gpu_s) for key, gpu_s in CALIBRATIONS.items()]
    for result in results:
        point, gpu_s = min(points, key=lambda p: abs(math.log(p[0]["tokens_mean"] / result["tokens_mean"])))
        result["calibrated_on"] = f"{point['column']} {point['role']}"
        result["gpu_s_per_step_estimate"] = result["cpu_s_per_step"] * gpu_s / point["cpu_s_per_step"]
        result["gpu_sft_seconds_estimate"] = result["gpu_s_per_step_estimate"] * result["profile_steps"]
    said = "; ".join(f"{p['column']} {p['role']}: {gpu_s} s there, {p['cpu_s_per_step']:.2f} s here" for p, gpu_s in points)
    print(f"\nThe GPU profile's SFT on this CPU ({'bfloat16' if native else 'float32'}), {own.steps} steps a role, and "
          f"the H200 estimate, scaled by the step measured on both nearest in length ({said})\n")
    print_table(["column", "role", "texts", "tokens (mean / median / max)", "batch", "CPU s / step", "H200 s / step "
                 "(estimate)", "steps", "H200 SFT s (estimate)"], ["---", "---", "---:", "---:", "---:", "---:", "---:",
                                                                  "---:", "---:"],
                [[r["column"], r["role"], str(r["texts"]), f"{r['tokens_mean']:.0f} / {r['tokens_median']:.0f} / "
                  f"{r['tokens_max']}", str(r["batch"]), f"{r['cpu_s_per_step']:.2f}",
                  f"{r['gpu_s_per_step_estimate']:.3f}", str(r["profile_steps"]), f"{r['gpu_sft_seconds_estimate']:.0f}"]
                 for r in results])
    save(own.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(one_line_usage_errors(PROG, main, sys.argv[1:]))
