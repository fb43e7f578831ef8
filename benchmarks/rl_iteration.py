"""Seconds per RL iteration with each rollout optimisation switched on in turn, side by side in one run.

    python -m benchmarks.rl_iteration [--model_name tiny-gpt2 | --model_name <SmolLM2 .gguf>]
        [--load_dir P --reflect_load_dir R] [--max_steps 6] [--out FILE.json] [--emulated_bf16] [--count_flops]
        [--rows N ...]

Every row plays the same RL iterations: Taxi pickup with reflection, ``--per_device_eval_batch_size``
(16) episodes per iteration, greedy reflections (``--top_k 1``), and the PG learner's update after each
iteration, from the same starting weights (loaded afresh for each row) and the same seeds. The first row
has every optimisation off; the next two are what a user gets with no flag (the defaults, in float32 and with
``--cpu_bf16``); each row after them adds one optimisation to the row before (:data:`ROWS`). The CPU's capabilities
(utils/cpu.py) are printed with the table and kept with each row. Printed per row: seconds per
iteration (the mean over the iterations after the first, which warms caches up) and the speed-up over the
first row; how those seconds split (the reflector's generation, the policy's scoring pass, and the rest: the
update and the games; ``RolloutStats.reflect_seconds`` / ``policy_seconds``); seconds and speed-up per policy
decision (rows in another arithmetic play other episodes, of other lengths); the reflection memo's hit rate,
the share of drafted reflection tokens accepted, and how far the episodes equal the first row's: byte for
byte (the memo must keep that), the same actions and reflections with log-probs equal to rounding (the
shared-prefix cache, the contiguous head input, argmax and drafted reflections must keep that), or not at all
(bf16 computes in another arithmetic). The exit status is 1 if a row broke its promise. Without checkpoints
the untrained players are used, whose reflections run to ``--reflect_max_new_tokens``.

On a CPU without native bfloat16 (no ``avx512_bf16`` or ``amx_bf16``) bfloat16 is emulated (a 2-core AVX2 EPYC
multiplied SmolLM2's matrices at 1.2 GFLOP/s in bf16 against 148 in float32), so its rows would time the emulation,
for hours. There the rows about bf16 itself (bf16, eager attention for bf16 training, bf16 LoRA products) are skipped
and said to be, and the later ones run in float32, named so: the table is then what a float32 machine gets.
``--emulated_bf16`` runs every row as it is.

``--count_flops`` says how far each row is from what the machine's arithmetic allows. Each row's first iteration
(the warm-up, which the means leave out) is played under torch's ``FlopCounterMode``, which counts the floating-point
operations of the matrix products and attention, forward and backward; the products' peak is measured once per
dtype, on a product of the policy's own shapes (2,048 rows). Printed per row: GFLOP per decision, the share of the
peak the row's arithmetic ran at (its GFLOP per decision at the peak, over its measured seconds per decision), and
the bound it sets: the first row's seconds per decision over this row's GFLOP per decision at the peak, the speed-up
this row would give if every operation ran at the peak, which none does (attention, norms, the token-by-token
generation of reflections).
"""

import contextlib
import dataclasses
import functools
import json
import sys
import time

import numpy as np
import torch

from benchmarks.rows import own_flags, print_table, save, steady, steady_mean
from envs import make_env
from envs.taxi import taxi_curriculum
from experiment_args import one_line_usage_errors, parse_args
from rollout import TwoPlayerRollout
from utils import cpu
from utils.cpu import cpu_native_bf16
from utils.cuda import cuda_available
from utils.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    flags: tuple[str, ...]  # on top of the command line's
    # what must equal the first row's episodes: "bytes" (every field), "choices" (each action and reflection;
    # log-probs equal to rounding) or "nothing" (another arithmetic, bf16)
    exact: str
    # Where the CPU has no native bfloat16: whether the row still measures something in float32 (then it runs
    # without --cpu_bf16, named so), or is about bf16 itself (then it is skipped)
    in_float32: bool = True

    def on_float32(self) -> "Row":
        """This row as a CPU without native bfloat16 runs it: in float32."""
        flags = tuple(flag for flag in self.flags if flag != "--cpu_bf16")
        return self if flags == self.flags else dataclasses.replace(self, name=f"{self.name} (float32)", flags=flags)


OFF = ("--no_reflection_memo", "--no_prefix_cache", "--no_contiguous_head", "--no_argmax_top1", "--draft_tokens=0",
       "--no_packed_weights", "--static_cache=false", "--adapter_autocast=false", "--reuse_rollout_pass=false")
# Each row adds one optimisation to the row before it; the last tries the static cache, which turns drafts off.
ROWS = (
    Row("everything off", OFF, "bytes"),
    # what a user gets with no flag: every exact optimisation on (the same choices, log-probs to rounding), float32
    Row("the defaults", (), "choices"),
    Row("the defaults with --cpu_bf16", ("--cpu_bf16",), "nothing", in_float32=False),
    Row("+ reflection memo", OFF[1:], "bytes"),
    Row("+ shared-prefix KV cache", OFF[2:], "choices"),
    # the head's product by another kernel: float32 rounds it differently, bfloat16 gave the same logits
    Row("+ contiguous LM-head input", OFF[3:], "choices"),
    # the same tokens but at exact ties of the top logits, which float32 all but never has
    Row("+ argmax for top-1 reflections", OFF[4:], "choices"),
    # several tokens a forward pass: other matrix shapes, summed in another order
    Row("+ drafted reflections (--draft_tokens)", OFF[5:], "choices"),
    # the reflector's products by oneDNN's kernel on weights laid out once: float32 rounds them differently
    Row("+ packed reflector weights (--packed_weights)", OFF[6:], "choices"),
    Row("+ bf16 (--cpu_bf16)", ("--static_cache=false", "--adapter_autocast=false", "--reuse_rollout_pass=false",
                                "--cpu_bf16", "--attn_implementation=sdpa"), "nothing", in_float32=False),
    # --attn_implementation=auto: eager attention for the trained policy in bf16 on a CPU, sdpa for the reflector
    Row("+ eager attention for the trained policy",
        ("--static_cache=false", "--adapter_autocast=false", "--reuse_rollout_pass=false", "--cpu_bf16"), "nothing",
        in_float32=False),  # float32 loads sdpa: the row above
    # the update's gradient from the rollout's own passes, kept with their graphs (the same to rounding: tests/
    # test_learners.py); the policy's prompts are then read whole
    Row("+ the update reads the rollout's passes (--reuse_rollout_pass, on by default on a CPU)",
        ("--static_cache=false", "--adapter_autocast=false", "--cpu_bf16", "--reuse_rollout_pass"), "nothing"),
    # LoRA's products in bf16 on float32 weights (with LoRA; on a model trained in full it changes nothing)
    Row("+ bf16 LoRA products (--adapter_autocast, off by default)",
        ("--static_cache=false", "--cpu_bf16", "--reuse_rollout_pass", "--adapter_autocast"), "nothing",
        in_float32=False),  # over a float32 base it changes nothing
    Row("+ static KV cache instead of drafts (off by default)",
        ("--static_cache", "--cpu_bf16", "--reuse_rollout_pass", "--adapter_autocast"), "nothing"),
)


def _choices(episode: str) -> list:
    return [(d["action"], d["reflection"]) for d in json.loads(episode)["decisions"]]


def play_iterations(argv: list[str], count_flops: bool = False) -> dict:
    """Play ``--max_steps`` RL iterations as ``rl_finetune`` does (rollout, then the learner's update);
    returns the seconds of each, the episodes (as JSON) and the rollout's figures. With ``count_flops``, the
    first iteration is played under torch's ``FlopCounterMode`` (its seconds are then not a measurement) and the
    result has its ``flops`` and the products' ``peak_gflops`` in the base model's dtype (:func:`product_peak`)."""
    from accelerate import Accelerator

    import rl_finetune
    from rl_algorithms import LEARNERS, LearnerSettings
    from utils import seeding

    args = parse_args(argv, prog="python -m benchmarks.rl_iteration")
    if count_flops and args.max_steps < 2:
        raise UsageError(f"--count_flops counts the first iteration and times the later ones: it needs --max_steps "
                         f"2 or more, got {args.max_steps}")
    seeding.set_seed(args.seed)
    rollout = TwoPlayerRollout.load(args, args.load_dir, args.reflect_load_dir, reflect=True, trainable=True)
    learner = LEARNERS[args.trainer](LearnerSettings.from_args(args), rollout.scorer,
                                     Accelerator(cpu=not torch.cuda.is_available()))
    play = functools.partial(rollout.run, [make_env("taxi", horizon=args.horizon or 10, labels=rollout.labels)
                                           for _ in range(args.per_device_eval_batch_size)],
                             keep_passes=args.keep_rollout_passes)
    curriculum = taxi_curriculum(args.max_steps).only(0)  # pickup
    rng = np.random.default_rng(args.seed)
    seconds, counts, episodes, reflector, policy = [], [], [], [], []
    counter = flop_counter() if count_flops else None
    for iteration in range(args.max_steps):
        tic, before = time.perf_counter(), dataclasses.replace(rollout.stats)
        with counter if counter is not None and iteration == 0 else contextlib.nullcontext():
            batch = play(rl_finetune.episode_starts(curriculum, 0, args.per_device_eval_batch_size, rng), rng)
            learner.update(batch, play, rng)
        seconds.append(time.perf_counter() - tic)
        reflector.append(rollout.stats.reflect_seconds - before.reflect_seconds)
        policy.append(rollout.stats.policy_seconds - before.policy_seconds)
        counts.append(sum(len(e.decisions) for e in batch))
        episodes += [json.dumps(e.to_dict(), sort_keys=True) for e in batch]
    played = {"seconds": seconds, "reflect_seconds": reflector, "policy_seconds": policy,
              "decisions_per_iteration": counts, "episodes": episodes,
              "hit_rate": rollout.stats.reflection_hit_rate,
              "decisions": rollout.stats.decisions, "draft_acceptance": rollout.stats.drafts.acceptance,
              "draft_passes": rollout.stats.drafts.passes}
    if counter is not None:
        played["flops"] = counter.get_total_flops()
        model = rollout.scorer.policy
        weight = model.get_input_embeddings().weight  # the dtype the products compute in
        played["peak_gflops"] = product_peak(model.config, weight.dtype, weight.device)
    return played


def flop_counter():
    """Torch's ``FlopCounterMode``, told the CPU's fused attention kernels too: it counts the matrix products and the
    GPU's attention kernels, and without this would leave out every attention of a model on sdpa on a CPU. The
    formulas are torch's own for the other sdpa kernels, whose arguments begin alike."""
    from torch.utils import flop_counter as counting

    aten = torch.ops.aten
    return counting.FlopCounterMode(display=False, custom_mapping={
        aten._scaled_dot_product_flash_attention_for_cpu: counting.sdpa_flop.__wrapped__,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: counting.sdpa_backward_flop.__wrapped__})


def product_peak(config, dtype: torch.dtype, device: torch.device) -> float:
    """GFLOP/s of one matrix product of the model's shapes (2,048 tokens by the hidden size, times the hidden size
    by the MLP's width) in ``dtype``: what a forward pass's largest products run at on this machine now."""
    hidden = config.hidden_size
    width = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    return _product_peak(hidden, width, dtype, device)


@functools.cache
def _product_peak(hidden: int, width: int, dtype: torch.dtype, device: torch.device, rows: int = 2048,
                  seconds: float = 1.0) -> float:
    """The best of the timings of one product, repeated for about ``seconds``; measured once per shape and dtype."""
    a = torch.randn(rows, hidden, dtype=dtype, device=device)
    b = torch.randn(hidden, width, dtype=dtype, device=device)
    best, spent = float("inf"), 0.0
    while spent < seconds:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        tic = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        took = time.perf_counter() - tic
        best, spent = min(best, took), spent + took
    return 2 * rows * hidden * width / best / 1e9


def main(argv: list[str]) -> int:
    own, argv = own_flags(argv, "python -m benchmarks.rl_iteration", __doc__, {
        "--emulated_bf16": dict(action="store_true", help="run the rows about bf16 even where the CPU emulates it "
                                "(no avx512_bf16 or amx_bf16): they then time the emulation, for hours"),
        "--count_flops": dict(action="store_true", help="count each row's floating-point operations in its first "
                              "iteration (which the means leave out; it runs slower under the counter) and print how "
                              "near the machine's product peak each row runs, and the speed-up that peak bounds"),
        "--rows": dict(nargs="+", type=int, metavar="N", help="play only these rows, numbered from 1 as in ROWS (1: "
                       "everything off, 2: the defaults, 3: the defaults with --cpu_bf16, then one optimisation added "
                       "at a time); row 1 is always played, the others are measured against it")})
    out = own.out
    skip_bf16 = not (own.emulated_bf16 or cuda_available() or cpu_native_bf16())
    defaults = ["--model_name=tiny-gpt2", "--env=taxi", "--shrink_head", "--top_k=1", "--reflect_max_new_tokens=40",
                "--per_device_eval_batch_size=16", "--max_steps=6", "--no_use_peft", "--learning_rate=1e-4",
                "--baseline=mean"]
    chosen = sorted({1, *(own.rows or range(1, len(ROWS) + 1))})
    if chosen[0] < 1 or chosen[-1] > len(ROWS):
        raise UsageError(f"--rows: each between 1 and {len(ROWS)}, got {own.rows}")
    results, first, skipped = [], None, []
    for row in (ROWS[n - 1] for n in chosen):
        if skip_bf16 and not row.in_float32:
            skipped.append(row.name)
            continue
        row = row.on_float32() if skip_bf16 else row
        played = play_iterations([*defaults, *argv, *row.flags], count_flops=own.count_flops)
        first = first or played
        result = {"row": row.name, "exact": row.exact, "cpu": cpu.caps().describe(),
                  "s_per_iteration": steady_mean(played["seconds"]),
                  "s_per_decision": per_decision(played["seconds"], played["decisions_per_iteration"]),
                  "seconds": played["seconds"], "decisions_per_iteration": played["decisions_per_iteration"],
                  "reflect_s_per_iteration": steady_mean(played["reflect_seconds"]),
                  "policy_s_per_iteration": steady_mean(played["policy_seconds"]),
                  "reflect_seconds": played["reflect_seconds"], "policy_seconds": played["policy_seconds"],
                  "hit_rate": played["hit_rate"], "decisions": played["decisions"],
                  "draft_acceptance": played["draft_acceptance"], "draft_passes": played["draft_passes"],
                  "identical_bytes": played["episodes"] == first["episodes"],
                  "identical_choices": list(map(_choices, played["episodes"])) == list(map(_choices, first["episodes"]))}
        if own.count_flops:
            result |= arithmetic(played, result["s_per_decision"], (results or [result])[0]["s_per_decision"])
        results.append(result)
    base = results[0]["s_per_iteration"]
    print(f"\nRL iterations on Taxi pickup with reflection ({' '.join(argv) or 'tiny-gpt2'}); the mean over "
          f"iterations 2 and after; CPU: {cpu.caps().describe()}\n")
    per_decision_base = results[0]["s_per_decision"]
    print_table(["row", "s / iteration", "speed-up", "of which: reflector", "policy pass", "update, games",
                 "s / decision", "speed-up per decision", "reflection memo hits",
                 "drafted tokens accepted", "episodes as row 1's"],
                ["---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---"],
                [[r["row"], f"{r['s_per_iteration']:.2f}", f"{base / r['s_per_iteration']:.2f}x",
                  f"{r['reflect_s_per_iteration']:.2f}", f"{r['policy_s_per_iteration']:.2f}",
                  f"{r['s_per_iteration'] - r['reflect_s_per_iteration'] - r['policy_s_per_iteration']:.2f}",
                  f"{r['s_per_decision']:.3f}", f"{per_decision_base / r['s_per_decision']:.2f}x",
                  f"{100 * r['hit_rate']:.0f}%", f"{100 * r['draft_acceptance']:.0f}%" if r["draft_passes"] else "-",
                  _sameness(r)] for r in results])
    if own.count_flops:
        print_arithmetic(results)
    if skipped:
        print(f"\nNo native bfloat16 was found on this CPU ({cpu.caps().describe()}; utils/cpu.py): the later "
              f"rows ran in float32, named so, and those about bf16 itself were skipped (--emulated_bf16 runs every "
              f"row as it is): {'; '.join(skipped)}")
    save(out, [*results, *({"row": name, "skipped": SKIPPED_BF16} for name in skipped)])
    return 0 if all(_kept(r) for r in results) else 1


def arithmetic(played: dict, s_per_decision: float, first_s_per_decision: float) -> dict:
    """A row's counted arithmetic (``--count_flops``): its GFLOP per decision (the counted first iteration's), the
    product peak, the share of that peak the row ran at, and the speed-up over the first row that its arithmetic
    allows at the peak."""
    gflop = played["flops"] / 1e9 / played["decisions_per_iteration"][0]
    at_peak = gflop / played["peak_gflops"]  # seconds per decision if every operation ran at the peak
    return {"gflop_per_decision": gflop, "peak_gflops": played["peak_gflops"],
            "share_of_peak": at_peak / s_per_decision, "speedup_bound": first_s_per_decision / at_peak}


def print_arithmetic(results: list[dict]) -> None:
    """The rows' :func:`arithmetic`, as a table."""
    print("\nArithmetic (--count_flops; each row's first iteration counted by torch's FlopCounterMode: matrix "
          "products and attention, forward and backward), against one product of the policy's shapes\n")
    print_table(["row", "GFLOP / decision", "product peak (GFLOP/s)", "share of the peak it ran at",
                 "speed-up at the peak (a bound)"], ["---", "---:", "---:", "---:", "---:"],
                [[r["row"], f"{r['gflop_per_decision']:.1f}", f"{r['peak_gflops']:.0f}",
                  f"{100 * r['share_of_peak']:.0f}%", f"{r['speedup_bound']:.2f}x"] for r in results])


SKIPPED_BF16 = "no native bfloat16 on this CPU: emulated, the row would measure the emulation"


def per_decision(seconds: list[float], decisions: list[int]) -> float:
    """Seconds per policy decision over the :func:`steady` iterations. Rows in another arithmetic play other
    episodes, longer or shorter; per decision, their work is compared on a like footing."""
    return sum(steady(seconds)) / max(sum(steady(decisions)), 1)


def _kept(result: dict) -> bool:
    """Whether a row kept what it promises of the first row's episodes."""
    return {"bytes": result["identical_bytes"], "choices": result["identical_choices"]}.get(result["exact"], True)


def _sameness(result: dict) -> str:
    said = ("identical" if result["identical_bytes"] else
            "same choices and reflections" if result["identical_choices"] else "different")
    return said if _kept(result) else f"{said}: NO, this row must keep the {result['exact']}"


if __name__ == "__main__":
    sys.exit(one_line_usage_errors("python -m benchmarks.rl_iteration", main, sys.argv[1:]))
