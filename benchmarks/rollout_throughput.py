"""Rollout throughput: the batched two-player rollout vs one episode at a time.

    python -m benchmarks.rollout_throughput [--load_dir P --reflect_load_dir R] [--reflect_max_new_tokens 40]

DangerousTaxi (full task) with reflection on, at batch 1, 8 and 32: the same episodes
(seeds) are played once with all of them in parallel (one batched ``generate`` and one
batched policy forward per step) and once sequentially. Printed: env steps/s, tokens/s
(policy prompt + reflection prompt + generated tokens) and the batched/sequential ratio.
Without checkpoints the untrained tiny-gpt2 players are used; their reflections always
run to ``--reflect_max_new_tokens``, the worst case.
"""

import sys
import time

import numpy as np
import torch

from envs import make_env
from envs.taxi import FULL
from experiment_args import run_script
from rollout import EpisodeStart, TwoPlayerRollout

BATCHES = (1, 8, 32)


def play(rollout: TwoPlayerRollout, starts: list[EpisodeStart], batch: int) -> tuple[float, int, int]:
    """Seconds, decisions and tokens to play ``starts`` in groups of ``batch``."""
    envs = [make_env("taxi", horizon=10, labels=rollout.labels) for _ in range(batch)]
    before = (rollout.stats.decisions, rollout.stats.policy_tokens + rollout.stats.reflection_prompt_tokens
              + rollout.stats.reflection_new_tokens)
    tic = time.perf_counter()
    for first in range(0, len(starts), batch):
        chunk = starts[first:first + batch]
        rollout.run(envs[:len(chunk)], chunk, np.random.default_rng(first))
    seconds = time.perf_counter() - tic
    after = (rollout.stats.decisions, rollout.stats.policy_tokens + rollout.stats.reflection_prompt_tokens
             + rollout.stats.reflection_new_tokens)
    return seconds, after[0] - before[0], after[1] - before[1]


@torch.no_grad()  # a scoped switch: the caller's grad mode comes back on return
def main(args) -> int:
    rollout = TwoPlayerRollout.load(args, args.load_dir, args.reflect_load_dir, reflect=True, shrink_head=True)
    play(rollout, [EpisodeStart(seed=499, options={"curriculum": FULL})], 1)  # warm-up, not timed
    rows = []
    for batch in BATCHES:
        starts = [EpisodeStart(seed=500 + i, options={"curriculum": FULL}) for i in range(batch)]
        batched = play(rollout, starts, batch)
        sequential = play(rollout, starts, 1)
        rows.append((batch, batched, sequential))
    print(f"\nmodel {args.model_name}, Taxi with reflection (<= {args.reflect_max_new_tokens} new tokens), "
          "the same episodes both ways\n")
    print("| episodes | batched steps/s | batched tokens/s | sequential steps/s | sequential tokens/s | speed-up |")
    print("|---:|---:|---:|---:|---:|---:|")
    for batch, (b_s, b_steps, b_tokens), (s_s, s_steps, s_tokens) in rows:
        print(f"| {batch} | {b_steps / b_s:.1f} | {b_tokens / b_s:.0f} | {s_steps / s_s:.1f} | {s_tokens / s_s:.0f} | "
              f"{(b_steps / b_s) / (s_steps / s_s):.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m benchmarks.rollout_throughput",
                        defaults=("--model_name=tiny-gpt2", "--reflect_max_new_tokens=40")))
