"""RLFT entry point: online RL of the policy, helped by the frozen reflection model.

    python rl_finetune.py --env=taxi --load_dir=<POLICY_DIR> --reflect_load_dir=<REFLECT_DIR> \
        --taxi_curriculum --save_steps=50

The loop in :func:`main` reads top to bottom: load the two players, the learner
(``--trainer``, see ``rl_algorithms/``) and the curriculum; then each iteration rolls out
``per_device_eval_batch_size`` episodes in parallel (``rollout/``), hands them to
``learner.update``, logs, and checkpoints. ``--resume_from CHECKPOINT`` continues a run
exactly where it stopped; under ``accelerate launch`` ranks roll out different episodes,
gradients are averaged, and only rank 0 writes.
"""

import dataclasses
import functools
import json
import logging
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from envs import EnvSettings, check_inputs, env_kwargs, make_env, training_curriculum
from envs.curriculum import Curriculum
from evaluation.evaluate import HeldOutPanel
from experiment_args import check_resume, run_script
from rl_algorithms import LEARNERS, Learner, LearnerSettings, UpdateResult
from rollout import Episode, EpisodeStart, RolloutStats, TwoPlayerRollout
from utils import checkpoints, complete, distributed, metrics, seeding
from utils.io import AGAIN, on_full_disk

logger = logging.getLogger(__name__)
SCRIPT = "rl_finetune"


def main(args) -> int:
    accelerator = distributed.start()  # under accelerate launch: the process group, made after what would hold it
    env_settings = EnvSettings.from_args(args)  # what the environments read of the flags
    # a bad task file or data root stops the run here, before a model loads or a run folder is made
    check_inputs(env_settings)
    seeding.set_seed(args.seed)  # the same on every rank: a new LoRA must start identical everywhere
    if args.resume_from:
        check_resume(args)
    rollout = TwoPlayerRollout.load(args, args.resume_from or args.load_dir, args.reflect_load_dir,
                                    reflect=args.use_reflection, trainable=True,
                                    flags=("--resume_from" if args.resume_from else "--load_dir", "--reflect_load_dir"))
    learner = LEARNERS[args.trainer](LearnerSettings.from_args(args), rollout.scorer, accelerator)
    curriculum = training_curriculum(env_settings)
    rng = np.random.default_rng([args.seed, accelerator.process_index])  # each rank draws its own episodes
    progress = resume(args, learner, rng, accelerator) if args.resume_from else Progress()
    recorder = Recorder(args, accelerator, progress)
    envs = [make_env(args.env, **env_kwargs(env_settings, run_dir=recorder.run_dir, labels=rollout.labels))
            for _ in range(args.per_device_eval_batch_size)]
    play = functools.partial(rollout.run, envs, keep_passes=args.keep_rollout_passes)
    panel = HeldOutPanel(args, recorder.run_dir, rollout.labels) if args.eval_steps else None
    if panel is not None and progress.iteration == 0:
        recorder.log_heldout(0, panel.evaluate(rollout))  # where the policy starts

    # a full disk anywhere in the loop is said in one line, with the checkpoint to resume from
    with on_full_disk(recorder.run_dir or args.ckpt_path, then=recorder.resume_hint):
        for iteration in recorder.iterations(progress.iteration):
            tic, before = time.time(), dataclasses.replace(rollout.stats)
            level = curriculum.level_at(iteration)

            # --- rollout
            episodes = play(episode_starts(curriculum, level, args.per_device_eval_batch_size, rng, args.group_size), rng)

            # --- update: returns, loss and optimiser steps belong to the learner
            result = learner.update(episodes, play, rng)
            if not result.applied:
                progress.nan_skips += 1
                logger.warning("iteration %d: non-finite loss or gradient (%s); update skipped", iteration + 1,
                               result.loss)

            # --- log/checkpoint
            progress.iteration = iteration + 1
            record = iteration_metrics(accelerator, episodes, result, before, rollout.stats, progress)
            record.update(seconds=time.time() - tic, level=curriculum.levels[level].name, level_index=level)
            if panel is not None and progress.iteration % args.eval_steps == 0:  # after the figures above,
                record.update(panel.evaluate(rollout))  # so the panel's tokens never count as training's
            recorder.log(progress.iteration, record, episodes)
            if progress.iteration % args.save_steps == 0 or progress.iteration == args.max_steps:
                recorder.checkpoint(progress, rollout, learner, rng, level)
        recorder.close(progress)
    for env in envs + (panel.envs if panel is not None else []):
        env.close()
    distributed.end(accelerator)  # every rank tears the group down in order (a rank left with gloo running may abort)
    return 0


# --- setup ----------------------------------------------------------------------------------------

def episode_starts(curriculum: Curriculum, level_index: int, count: int, rng,
                   group_size: int = 1) -> list[EpisodeStart]:
    """``count`` episode starts on the level: ``count / group_size`` random ones, each ``group_size`` times in a
    row with one ``group`` number (``--group_size``; 1: every start once, no groups)."""
    level = curriculum.levels[level_index]
    starts = []
    for group in range(count // group_size):
        options = level.options[int(rng.integers(len(level.options)))]
        seed = int(rng.integers(2**31 - 1))
        starts += [EpisodeStart(seed=seed, options=options, level=level.name,
                                group=group if group_size > 1 else None) for _ in range(group_size)]
    return starts


@dataclass
class Progress:
    """What the loop carries from one iteration to the next, and across a resume."""

    iteration: int = 0  # iterations done
    nan_skips: int = 0  # updates skipped for a non-finite loss or gradient
    truncated: int = 0  # prompts cut at --max_seq_length since the run began, all ranks


def resume(args, learner: Learner, rng: np.random.Generator, accelerator) -> Progress:
    """Restore optimiser, RNG states, this rank's episode generator and the learner's state."""
    restored = checkpoints.load_checkpoint(args.resume_from, learner.optimizer)
    state = restored["state"]
    if len(state["ranks"]) != accelerator.num_processes:
        raise ValueError(f"--resume_from: {args.resume_from} was written by {len(state['ranks'])} processes; "
                         f"resume it with as many, not {accelerator.num_processes}")
    mine = state["ranks"][accelerator.process_index]
    rng.bit_generator.state = mine["rng"]
    learner.load_state_dict(mine["learner"])
    return Progress(restored["step"], state["nan_skips"], state["truncated"])


# --- metrics ----------------------------------------------------------------------------------------

def iteration_metrics(accelerator, episodes: list[Episode], result: UpdateResult, before: RolloutStats,
                      after: RolloutStats, progress: Progress) -> dict:
    """The iteration's figures over all ranks; updates ``progress.truncated``."""
    totals = torch.tensor([
        sum(e.success for e in episodes), sum(e.cost for e in episodes), sum(len(e.decisions) for e in episodes),
        len(episodes), sum(d.entropy for e in episodes for d in e.decisions),
        after.prompt_tokens - before.prompt_tokens, after.truncated - before.truncated,
        after.episodes - before.episodes], dtype=torch.float64)
    if accelerator.num_processes > 1:
        totals = accelerator.reduce(totals.to(accelerator.device), reduction="sum").cpu()
    successes, cost, length, count, entropy, tokens, truncated, played = totals.tolist()
    progress.truncated += int(truncated)
    return {
        "success": successes / count, "cost": cost / count, "loss": result.loss,
        "entropy": entropy / max(length, 1), "episode_length": length / count, "tokens": int(tokens),
        "episodes_played": int(played),  # the batch and any the learner played besides (REFUEL's branches)
        "truncated_prompts": int(truncated), "truncated_prompts_total": progress.truncated,
        "nan_skips": progress.nan_skips,
        # this process's wall-clock in the two players' calls (the learner's own episodes included); the rest
        # of the iteration's "seconds" is the update and the games
        "reflect_seconds": after.reflect_seconds - before.reflect_seconds,
        "policy_seconds": after.policy_seconds - before.policy_seconds, **result.metrics,
    }


def episode_log(episode: Episode, iteration: int) -> dict:
    """A compact record of an episode for the checkpoint's episodes.jsonl."""
    return {
        "iteration": iteration, "seed": episode.seed, "level": episode.level, "success": episode.success,
        "cost": episode.cost, "group": episode.group,
        "steps": [{"label": d.action, "reward": d.reward, "logprob": d.logprob, "reflection": d.reflection,
                   "oracle": d.oracle, "state": d.state} for d in episode.decisions],
    }


class Recorder:
    """The run directory, metric log, progress bar and checkpoints. Only rank 0 writes."""

    def __init__(self, args, accelerator, progress: Progress):
        self.args, self.accelerator = args, accelerator
        self.is_main = accelerator.is_main_process
        self.run_dir = checkpoints.make_run_dir(args, SCRIPT) if self.is_main else None
        self.metric_log = metrics.MetricLogger(self.run_dir) if self.is_main else None
        self.window: list[dict] = []  # episodes since the last checkpoint
        self.bar = None
        if self.is_main:
            print(f"[rl_finetune] run directory: {self.run_dir}", flush=True)
            if args.resume_from:
                self._carry_metrics(Path(args.resume_from).parent, progress.iteration)

    def iterations(self, start: int):
        self.bar = tqdm(range(start, self.args.max_steps), initial=start, total=self.args.max_steps, desc="RL",
                        disable=not self.is_main)
        return self.bar

    def log(self, iteration: int, record: dict, episodes: list[Episode]) -> None:
        self.window += [episode_log(e, iteration) for e in episodes]
        if self.is_main:
            self.metric_log.log(iteration, record)
            self.bar.set_postfix(success=f"{record['success']:.2f}", cost=f"{record['cost']:.2f}",
                                 loss=f"{record['loss']:.3f}", level=record["level"])

    def log_heldout(self, iteration: int, figures: dict) -> None:
        if self.is_main:
            self.metric_log.log(iteration, figures)

    def checkpoint(self, progress: Progress, rollout: TwoPlayerRollout, learner: Learner, rng, level: int) -> None:
        from accelerate.utils import gather_object

        rank_state = {"rng": rng.bit_generator.state, "learner": learner.state_dict()}
        ranks, logs = [rank_state], self.window
        if self.accelerator.num_processes > 1:
            check_in_sync(learner.params)
            ranks, logs = gather_object([rank_state]), gather_object(self.window)
        if self.is_main:
            checkpoints.save_checkpoint(
                self.run_dir / f"checkpoint-{progress.iteration}", model=rollout.scorer.policy,
                tokenizer=rollout.scorer.tokenizer, args=self.args, step=progress.iteration,
                optimizer=learner.optimizer,
                state={"ranks": ranks, "nan_skips": progress.nan_skips, "truncated": progress.truncated,
                       "level": level},
                files={"episodes.jsonl": "".join(json.dumps(e) + "\n" for e in logs)})
            checkpoints.prune_checkpoints(self.run_dir, self.args.save_total_limit)
        self.window = []

    def resume_hint(self) -> str:
        """What to do after a full disk stopped the run: resume from its newest whole checkpoint."""
        return complete.resume_hint(self.run_dir) if self.run_dir is not None else AGAIN

    def close(self, progress: Progress) -> None:
        if self.is_main:
            self.metric_log.close()
            print(f"[rl_finetune] done: {self.run_dir} ({progress.nan_skips} skipped updates; {metrics.peak_memory()})",
                  flush=True)

    def _carry_metrics(self, previous_run: Path, upto: int) -> None:
        """Copy the resumed run's metrics up to the checkpoint, so the new run holds the whole curve."""
        source = previous_run / metrics.MetricLogger.FILE
        if not source.is_file():
            logger.warning("no %s in %s: the new run's curve starts at iteration %d", source.name, previous_run,
                           upto)
            return
        for record in metrics.read_metrics(previous_run):
            if record["step"] <= upto:
                step = record.pop("step")
                self.metric_log.log(step, record)
        shutil.copy2(previous_run / checkpoints.SETTINGS_FILE, self.run_dir / "resumed_from_setting.yml")


def check_in_sync(params) -> None:
    """Every rank must hold the same weights after averaged updates; fail loudly if not."""
    from accelerate.utils import gather_object

    checksum = float(sum(p.detach().double().sum() for p in params))
    sums = gather_object([checksum])
    if len(set(sums)) != 1:
        raise RuntimeError(f"ranks diverged: parameter checksums {sums}")


if __name__ == "__main__":
    sys.exit(run_script(main, "rl_finetune.py"))
