"""RLFT entry point: online RL of the policy, helped by the frozen reflection model.

    python rl_finetune.py --env=taxi --load_dir=<POLICY_DIR> --reflect_load_dir=<REFLECT_DIR> \
        --taxi_curriculum --save_steps=50

Each iteration rolls out ``per_device_eval_batch_size`` episodes in parallel
(``rollout.py``), turns costs into costs-to-go, and updates the policy's LoRA adapter
with the chosen learner (``--trainer pg|ppo|refuel``; losses in ``rl_algorithms.py``).
The loop reads top to bottom: setup, then per iteration rollout → returns → loss →
update → log/checkpoint. ``--resume_from CHECKPOINT`` continues exactly where a run
stopped; under ``accelerate launch`` ranks roll out different episodes, gradients are
averaged, and only rank 0 writes.
"""

import json
import logging
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

import checkpoints
import metrics
import models
import seeding
from envs import env_kwargs, make_env
from envs.curriculum import Curriculum, curriculum_from_args
from experiment_args import parse_args
from rl_algorithms import ReplayBuffer, ValueHead, cost_to_go, pg_loss, ppo_loss, refuel_loss, value_loss
from rollout import Episode, EpisodeStart, PolicyScorer, TwoPlayerRollout

logger = logging.getLogger(__name__)
SCRIPT = "rl_finetune"


# --- setup helpers -------------------------------------------------------------------------------

# Flags a resumed run must share with the run it continues, or it would not continue it.
RESUME_MUST_MATCH = ("env", "trainer", "model_name", "use_peft", "shrink_head", "per_device_eval_batch_size",
                     "taxi_curriculum", "depth_curriculum", "merge_first_two", "merge_after_first_k",
                     "curriculum_index", "baseline", "seed", "task_file", "first_step", "max_steps")


def check_resume(args) -> None:
    saved = checkpoints.load_settings(args.resume_from)
    different = [f"--{key}={saved.get(key)!r} there, {getattr(args, key)!r} here"
                 for key in RESUME_MUST_MATCH if saved.get(key) != getattr(args, key)]
    if different:
        raise ValueError(f"--resume_from: {args.resume_from} was trained with other settings: " + "; ".join(different))


def load_players(args, adapter_dir: str | None):
    """The trainable policy (with the label head if asked) and the frozen reflector (or None)."""
    policy, tokenizer = models.load_model_and_tokenizer(args, adapter_dir=adapter_dir, shrink_head=args.shrink_head)
    policy.eval()  # no dropout: the log-probs of the update equal those of the rollout
    reflector, reflect_tokenizer = None, None
    if args.use_reflection:
        if args.reflect_load_dir is None:
            logger.warning("--reflect without --reflect_load_dir: reflections come from the untuned base model")
        reflector, reflect_tokenizer = models.load_model_and_tokenizer(
            args, model_name=args.reflect_model_name, adapter_dir=args.reflect_load_dir, trainable=False)
    return policy, tokenizer, reflector, reflect_tokenizer


def episode_rng(args, rank: int) -> np.random.Generator:
    """Each rank draws its own episodes (distinct seeds) from the run's seed."""
    return np.random.default_rng([args.seed, rank])


def episode_starts(curriculum: Curriculum, level_index: int, count: int, rng) -> list[EpisodeStart]:
    level = curriculum.levels[level_index]
    starts = []
    for _ in range(count):
        options = level.options[int(rng.integers(len(level.options)))]
        starts.append(EpisodeStart(seed=int(rng.integers(2**31 - 1)), options=options, level=level.name))
    return starts


def flat_decisions(episodes: list[Episode]):
    """Every decision of ``episodes`` with its cost-to-go."""
    decisions, q = [], []
    for episode in episodes:
        decisions += episode.decisions
        q += cost_to_go(episode.costs())
    return decisions, torch.tensor(q, dtype=torch.float32)


def score(scorer: PolicyScorer, decisions, batch_size: int, critic=None):
    """Current log-probs of the decisions' actions (with gradient), in minibatches; also values."""
    for start in range(0, len(decisions), batch_size):
        chunk = decisions[start:start + batch_size]
        logp, hidden, _, tokens = scorer.logprobs([d.prompt for d in chunk], [d.valid for d in chunk],
                                                  with_hidden=critic is not None)
        chosen = logp.gather(1, torch.tensor([[d.action] for d in chunk], device=logp.device)).squeeze(1)
        values = critic(hidden.detach()) if critic is not None else None
        yield start, chunk, chosen, values, tokens


# --- the learners: each accumulates gradients and returns (loss, extra metrics) --------------------

def baseline_for(args, q: torch.Tensor, values: torch.Tensor | None) -> torch.Tensor | float:
    if args.baseline == "mean":
        return q.mean()
    if args.baseline == "critic":
        return values.detach()
    return 0.0


def train_pg(args, scorer, critic, episodes, replayed) -> tuple[float, dict]:
    batch = episodes + replayed
    decisions, q = flat_decisions(batch)
    total, critic_total = 0.0, 0.0
    for start, chunk, logp, values, _ in score(scorer, decisions, args.per_device_train_batch_size, critic):
        q_chunk = q[start:start + len(chunk)].to(logp.device)
        loss = pg_loss(logp, q_chunk, baseline_for(args, q.to(logp.device), values), len(batch))
        if critic is not None:
            critic_loss = value_loss(values, q_chunk) * len(chunk) / len(decisions)
            critic_total += critic_loss.item()
            loss = loss + critic_loss
        loss.backward()
        total += loss.item()
    return total, {"replayed": len(replayed), "critic_loss": critic_total}


def train_ppo_epoch(args, scorer, critic, episodes) -> tuple[float, dict]:
    decisions, q = flat_decisions(episodes)
    old = torch.tensor([d.logprob for d in decisions])
    total, ratios = 0.0, []
    for start, chunk, logp, values, _ in score(scorer, decisions, args.per_device_train_batch_size, critic):
        q_chunk = q[start:start + len(chunk)].to(logp.device)
        old_chunk = old[start:start + len(chunk)].to(logp.device)
        loss = ppo_loss(logp, old_chunk, q_chunk, baseline_for(args, q.to(logp.device), values),
                        args.ppo_clip, len(episodes))
        if critic is not None:
            loss = loss + value_loss(values, q_chunk) * len(chunk) / len(decisions)
        loss.backward()
        total += loss.item()
        ratios += torch.exp(logp.detach() - old_chunk).tolist()
    return total, {"ppo_ratio_max": max(ratios, default=1.0)}


def refuel_pairs(episodes: list[Episode], branches: list[Episode], steps: list[int]):
    """(decision in τ, decision in τ', G_h, G'_h) for branches whose action differs at h."""
    pairs = []
    for episode, branch, h in zip(episodes, branches, steps):
        if branch.decisions[h].action == episode.decisions[h].action:
            continue
        returns = -cost_to_go(episode.costs())[h]
        branch_returns = -cost_to_go(branch.costs())[h]
        pairs.append((episode.decisions[h], branch.decisions[h], returns, branch_returns))
    return pairs


def train_refuel(args, scorer, pairs) -> tuple[float, dict]:
    if not pairs:
        return 0.0, {"refuel_pairs": 0}
    total = 0.0
    for start in range(0, len(pairs), args.per_device_train_batch_size):
        chunk = pairs[start:start + args.per_device_train_batch_size]
        first, second = [p[0] for p in chunk], [p[1] for p in chunk]
        logp, _, _, _ = scorer.logprobs([d.prompt for d in first + second], [d.valid for d in first + second])
        actions = torch.tensor([[d.action] for d in first + second], device=logp.device)
        chosen = logp.gather(1, actions).squeeze(1)
        old = torch.tensor([d.logprob for d in first + second], device=logp.device)
        returns = torch.tensor([p[2] for p in chunk], device=logp.device)
        branch_returns = torch.tensor([p[3] for p in chunk], device=logp.device)
        n = len(chunk)
        loss = refuel_loss(chosen[:n], old[:n], chosen[n:], old[n:], returns, branch_returns, args.refuel_eta)
        (loss * n / len(pairs)).backward()
        total += loss.item() * n / len(pairs)
    return total, {"refuel_pairs": len(pairs)}


# --- update ---------------------------------------------------------------------------------------

def apply_update(params, optimizer, accelerator, max_grad_norm: float, loss: float) -> bool:
    """Average gradients over ranks, then clip and step; skip (and say so) on a NaN/inf."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if accelerator.num_processes > 1:
        for p in params:
            p.grad = accelerator.reduce(p.grad, reduction="mean")
    finite = torch.tensor(float(math.isfinite(loss) and all(bool(torch.isfinite(p.grad).all()) for p in params)))
    if accelerator.num_processes > 1:
        finite = accelerator.reduce(finite.to(accelerator.device), reduction="min").cpu()
    if not bool(finite):
        optimizer.zero_grad(set_to_none=True)
        return False
    torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return True


def check_in_sync(params) -> None:
    """Every rank must hold the same weights after averaged updates; fail loudly if not."""
    from accelerate.utils import gather_object

    checksum = float(sum(p.detach().double().sum() for p in params))
    sums = gather_object([checksum])
    if len(set(sums)) != 1:
        raise RuntimeError(f"ranks diverged: parameter checksums {sums}")


# --- the loop -------------------------------------------------------------------------------------

def main(args) -> int:
    from accelerate import Accelerator
    from accelerate.utils import gather_object

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    rank, is_main = accelerator.process_index, accelerator.is_main_process
    seeding.set_seed(args.seed)  # the same on every rank: a new LoRA must start identical everywhere
    if args.resume_from:
        check_resume(args)
    adapter_dir = args.resume_from or args.load_dir
    policy, tokenizer, reflector, reflect_tokenizer = load_players(args, adapter_dir)
    critic = None
    if args.baseline == "critic":
        critic = ValueHead(models.base_model(policy).config.hidden_size).to(models.device())
    params = [p for p in policy.parameters() if p.requires_grad] + (list(critic.parameters()) if critic else [])
    optimizer = torch.optim.Adam(params, lr=args.learning_rate, weight_decay=args.weight_decay)
    curriculum = curriculum_from_args(args)
    replay = ReplayBuffer(args.replay_buffer_size if args.trainer == "pg" else 0)
    rng = episode_rng(args, rank)
    start_iteration, nan_skips = 0, 0
    if args.resume_from:
        restored = checkpoints.load_checkpoint(args.resume_from, optimizer)
        if len(restored["state"]["ranks"]) != accelerator.num_processes:
            raise ValueError(f"--resume_from: {args.resume_from} was written by {len(restored['state']['ranks'])} "
                             f"processes; resume it with as many, not {accelerator.num_processes}")
        state = restored["state"]["ranks"][rank]
        rng.bit_generator.state = state["rng"]
        replay.load_state_dict(state["replay"])
        if critic is not None:
            critic.load_state_dict(state["critic"])
        start_iteration, nan_skips = restored["step"], restored["state"]["nan_skips"]

    run_dir = checkpoints.make_run_dir(args, SCRIPT) if is_main else None
    metric_log = metrics.MetricLogger(run_dir) if is_main else None
    if is_main:
        print(f"[rl_finetune] run directory: {run_dir}", flush=True)
        if args.resume_from:
            carry_metrics(Path(args.resume_from).parent, start_iteration, metric_log)
    envs = [make_env(args.env, **env_kwargs(args, run_dir=run_dir)) for _ in range(args.per_device_eval_batch_size)]
    rollout = TwoPlayerRollout.from_args(args, policy, tokenizer, reflector, reflect_tokenizer)
    scorer = rollout.scorer
    window: list[dict] = []
    bar = tqdm(range(start_iteration, args.max_steps), initial=start_iteration, total=args.max_steps,
               desc="RL", disable=not is_main)
    for iteration in bar:
        tic = time.time()
        level = curriculum.level_at(iteration)
        tokens_before = rollout.stats.policy_tokens + rollout.stats.reflection_prompt_tokens

        # --- rollout
        starts = episode_starts(curriculum, level, args.per_device_eval_batch_size, rng)
        episodes = rollout.run(envs, starts, rng)
        extra: dict = {}

        # --- returns, loss (gradients accumulate in the learner)
        if args.trainer == "pg":
            replayed = [Episode.from_dict(e) for e in replay.sample(args.replay_batch_size, rng)]
            loss, extra = train_pg(args, scorer, critic, episodes, replayed)
            updated = apply_update(params, optimizer, accelerator, args.max_grad_norm, loss)
        elif args.trainer == "ppo":
            updated, loss = True, 0.0
            for _ in range(args.ppo_epochs):
                loss, extra = train_ppo_epoch(args, scorer, critic, episodes)
                updated = apply_update(params, optimizer, accelerator, args.max_grad_norm, loss) and updated
        else:
            steps = [int(rng.integers(len(e.decisions))) for e in episodes]
            branch_starts = [EpisodeStart(seed=e.seed, options=e.options, level=e.level,
                                          replay=e.decisions[:h + 1]) for e, h in zip(episodes, steps)]
            branches = rollout.run(envs, branch_starts, rng)
            loss, extra = train_refuel(args, scorer, refuel_pairs(episodes, branches, steps))
            updated = apply_update(params, optimizer, accelerator, args.max_grad_norm, loss)
        if not updated:
            nan_skips += 1
            logger.warning("iteration %d: non-finite loss or gradient (%s); update skipped", iteration + 1, loss)
        for episode in episodes:
            replay.add(episode.to_dict())

        # --- log/checkpoint
        stats = torch.tensor([sum(e.success for e in episodes), sum(e.cost for e in episodes),
                              sum(len(e.decisions) for e in episodes), len(episodes),
                              sum(d.entropy for e in episodes for d in e.decisions)], dtype=torch.float64)
        if accelerator.num_processes > 1:
            stats = accelerator.reduce(stats.to(accelerator.device), reduction="sum").cpu()
        successes, cost, length, count, entropy = stats.tolist()
        record = {
            "success": successes / count, "cost": cost / count, "loss": loss,
            "entropy": entropy / max(length, 1), "episode_length": length / count,
            "tokens": rollout.stats.policy_tokens + rollout.stats.reflection_prompt_tokens - tokens_before,
            "seconds": time.time() - tic, "level": curriculum.levels[level].name, "level_index": level,
            "nan_skips": nan_skips, "truncated_prompts": rollout.stats.truncated,
            "replay_size": len(replay), **extra,
        }
        window += [episode_log(e, iteration + 1) for e in episodes]
        if is_main:
            metric_log.log(iteration + 1, record)
            bar.set_postfix(success=f"{record['success']:.2f}", cost=f"{record['cost']:.2f}",
                            loss=f"{loss:.3f}", level=record["level"])
        if (iteration + 1) % args.save_steps == 0 or iteration + 1 == args.max_steps:
            rank_state = {"rng": rng.bit_generator.state, "replay": replay.state_dict(),
                          "critic": critic.state_dict() if critic is not None else None}
            ranks, logs = [rank_state], window
            if accelerator.num_processes > 1:
                check_in_sync(params)
                ranks, logs = gather_object([rank_state]), gather_object(window)
            if is_main:
                checkpoints.save_checkpoint(
                    run_dir / f"checkpoint-{iteration + 1}", model=policy, tokenizer=tokenizer, args=args,
                    step=iteration + 1, optimizer=optimizer,
                    state={"ranks": ranks, "nan_skips": nan_skips, "level": level},
                    files={"episodes.jsonl": "".join(json.dumps(e) + "\n" for e in logs)})
            window = []
    if is_main:
        metric_log.close()
        print(f"[rl_finetune] done: {run_dir} ({nan_skips} skipped updates)", flush=True)
    for env in envs:
        env.close()
    # every rank waits for rank 0's last checkpoint, then the process group is torn down cleanly
    # (a rank that simply exits while gloo still runs aborts with SIGABRT)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return 0


def episode_log(episode: Episode, iteration: int) -> dict:
    """A compact record of an episode for the checkpoint's episodes.jsonl."""
    return {
        "iteration": iteration, "seed": episode.seed, "level": episode.level, "success": episode.success,
        "cost": episode.cost,
        "steps": [{"label": d.action, "reward": d.reward, "logprob": d.logprob, "reflection": d.reflection,
                   "oracle": d.oracle} for d in episode.decisions],
    }


def carry_metrics(previous_run: Path, upto: int, metric_log) -> None:
    """Copy the resumed run's metrics up to the checkpoint, so the new run holds the whole curve."""
    source = previous_run / metrics.MetricLogger.FILE
    if not source.is_file():
        logger.warning("no %s in %s: the new run's curve starts at iteration %d", source.name, previous_run, upto)
        return
    for record in metrics.read_metrics(previous_run):
        if record["step"] <= upto:
            step = record.pop("step")
            metric_log.log(step, record)
    shutil.copy2(previous_run / checkpoints.SETTINGS_FILE, Path(metric_log.path).parent / "resumed_from_setting.yml")


if __name__ == "__main__":
    sys.exit(main(parse_args(prog="rl_finetune.py")))
