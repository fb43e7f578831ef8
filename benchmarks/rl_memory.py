"""Peak memory of one RL iteration (rollout with reflection, PG loss, update) per batch size.

    python -m benchmarks.rl_memory [--model_name tiny-gpt2] [--reflect_max_new_tokens 40]

Each batch size (1, 8, 32 parallel Taxi episodes) runs in a fresh process, so peaks do
not mix. On CUDA the figure is ``torch.cuda.max_memory_allocated``; on a CPU it is the
growth of the process's peak resident memory during the iteration (after the models are
loaded). Printed as a table, with the size of the loaded models for reference.
"""

import multiprocessing
import resource
import sys

BATCHES = (1, 8, 32)


def _iteration(argv: list[str], batch: int, queue) -> None:
    import numpy as np
    import torch

    import models
    import rl_finetune
    from envs import make_env
    from experiment_args import parse_args
    from rollout import TwoPlayerRollout

    args = parse_args([*argv, f"--per_device_eval_batch_size={batch}", "--env=taxi"])
    policy, tokenizer, reflector, reflect_tokenizer = rl_finetune.load_players(args, args.load_dir)
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=args.learning_rate)
    rollout = TwoPlayerRollout.from_args(args, policy, tokenizer, reflector, reflect_tokenizer)
    envs = [make_env("taxi", horizon=10) for _ in range(batch)]
    from envs.curriculum import taxi_curriculum

    curriculum = taxi_curriculum(1)
    rng = np.random.default_rng(0)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    episodes = rollout.run(envs, rl_finetune.episode_starts(curriculum, 2, batch, rng), rng)
    rl_finetune.train_pg(args, rollout.scorer, None, episodes, [])
    optimizer.step()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - baseline
    model_mib = sum(p.numel() * p.element_size() for m in (policy, reflector) for p in m.parameters()) / 2**20
    decisions = sum(len(e.decisions) for e in episodes)
    queue.put((batch, torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_kib / 1024, model_mib,
               decisions, models.device().type))


def main(argv: list[str]) -> int:
    context = multiprocessing.get_context("spawn")
    rows = []
    for batch in BATCHES:
        queue = context.Queue()
        worker = context.Process(target=_iteration, args=(argv, batch, queue))
        worker.start()
        rows.append(queue.get(timeout=1800))
        worker.join()
    device = rows[0][4]
    what = "peak allocated (CUDA)" if device == "cuda" else "peak RSS growth (CPU)"
    print(f"\nOne RL iteration on Taxi with reflection; {what}; models: {rows[0][2]:.1f} MiB of weights\n")
    print("| episodes in parallel | decisions | peak memory (MiB) |\n|---:|---:|---:|")
    for batch, peak, _, decisions, _ in rows:
        print(f"| {batch} | {decisions} | {peak:.1f} |")
    return 0


if __name__ == "__main__":
    defaults = ["--model_name=tiny-gpt2", "--reflect", "--reflect_max_new_tokens=40"]
    sys.exit(main([*defaults, *sys.argv[1:]]))
