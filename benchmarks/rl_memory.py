"""Peak memory of one RL iteration (rollout with reflection, the PG learner's update) per batch size.

    python -m benchmarks.rl_memory [--model_name tiny-gpt2] [--reflect_max_new_tokens 40] [--batches 1 8 32]
        [--reuse_rollout_pass]

Each batch size (``--batches``, parallel Taxi episodes; default 1, 8 and 32) runs in a fresh
process, so peaks do not mix. On CUDA the figure is ``torch.cuda.max_memory_allocated``; on a CPU it is the
growth of the process's peak resident memory during the iteration (after the models are
loaded). Printed as a table, with the size of the loaded models for reference.
"""

import multiprocessing
import resource
import sys

from benchmarks.rows import own_flags, refuse

PROG = "python -m benchmarks.rl_memory"
BATCHES = (1, 8, 32)


def _iteration(argv: list[str], batch: int, queue) -> None:
    """A worker process: its row, or the bad input (a model that is not there, say) for the parent to say."""
    from utils.errors import UsageError

    try:
        queue.put(_measure(argv, batch))
    except UsageError as error:
        queue.put(error)


def _measure(argv: list[str], batch: int) -> tuple:
    import functools

    import numpy as np
    import torch
    from accelerate import Accelerator

    import rl_finetune
    from envs import make_env
    from envs.taxi import taxi_curriculum
    from experiment_args import parse_args
    from rl_algorithms import LEARNERS, LearnerSettings
    from rollout import TwoPlayerRollout
    from utils import models

    args = parse_args([*argv, f"--per_device_eval_batch_size={batch}", "--env=taxi"])
    rollout = TwoPlayerRollout.load(args, args.load_dir, args.reflect_load_dir, reflect=args.use_reflection,
                                    trainable=True)
    learner = LEARNERS["pg"](LearnerSettings.from_args(args), rollout.scorer, Accelerator(cpu=not torch.cuda.is_available()))
    policy, reflector = rollout.scorer.policy, rollout.reflector
    play = functools.partial(rollout.run, [make_env("taxi", horizon=10, labels=rollout.labels) for _ in range(batch)],
                             keep_passes=args.keep_rollout_passes)  # the update's memory, as rl_finetune.py plays
    curriculum = taxi_curriculum(1)
    rng = np.random.default_rng(0)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    episodes = play(rl_finetune.episode_starts(curriculum, 2, batch, rng), rng)
    learner.update(episodes, play, rng)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - baseline
    model_mib = sum(p.numel() * p.element_size() for m in (policy, reflector) for p in m.parameters()) / 2**20
    decisions = sum(len(e.decisions) for e in episodes)
    return (batch, torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_kib / 1024, model_mib, decisions,
            models.device().type)


def _result(queue, worker, batch: int):
    """The worker's row; an error (not a hang) if the worker dies first."""
    import queue as queues

    while True:
        try:
            row = queue.get(timeout=5)
        except queues.Empty:
            if not worker.is_alive():
                raise RuntimeError(f"the worker for {batch} episodes exited with code {worker.exitcode} "
                                   "before reporting (its traceback is above)") from None
        else:
            if isinstance(row, Exception):
                raise row
            return row


def main(argv: list[str]) -> int:
    from experiment_args import parse_args

    options, argv = own_flags(argv, PROG, __doc__, {"--batches": dict(
        type=int, nargs="+", default=list(BATCHES), metavar="N",
        help=f"episodes in parallel of each row, one RL iteration each (default: {' '.join(map(str, BATCHES))})")},
        out=False)
    if min(options.batches) < 1:
        refuse(PROG, f"--batches: each at least 1, got {options.batches}")
    parse_args([*argv, "--env=taxi"], prog=PROG)  # the other flags checked here, not in each worker
    context = multiprocessing.get_context("spawn")
    rows = []
    for batch in options.batches:
        queue = context.Queue()
        worker = context.Process(target=_iteration, args=(argv, batch, queue))
        worker.start()
        rows.append(_result(queue, worker, batch))
        worker.join()
    device = rows[0][4]
    what = "peak allocated (CUDA)" if device == "cuda" else "peak RSS growth (CPU)"
    print(f"\nOne RL iteration on Taxi with reflection; {what}; models: {rows[0][2]:.1f} MiB of weights\n")
    print("| episodes in parallel | decisions | peak memory (MiB) |\n|---:|---:|---:|")
    for batch, peak, _, decisions, _ in rows:
        print(f"| {batch} | {decisions} | {peak:.1f} |")
    return 0


if __name__ == "__main__":
    from experiment_args import one_line_usage_errors

    defaults = ["--model_name=tiny-gpt2", "--reflect", "--reflect_max_new_tokens=40"]
    sys.exit(one_line_usage_errors(PROG, main, [*defaults, *sys.argv[1:]]))
