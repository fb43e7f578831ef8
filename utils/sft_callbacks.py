"""The SFT run's hooks into HF's Trainer (``supervised_pretrain.py``): skipping a step of non-finite gradient,
and the run's files (metrics; settings, labels and role in each checkpoint, which is then marked whole). Apart from the entry point, which
imports them once its flags are parsed: transformers' Trainer takes 6 s to import."""

import logging
from pathlib import Path

from transformers import TrainerCallback

from prompts import write_label_file
from utils import checkpoints, complete, metrics, models

logger = logging.getLogger(__name__)


class SkipNonFiniteSteps(TrainerCallback):
    """Skips an optimiser step whose gradient holds a NaN or an infinity (a loss that overflowed in bfloat16,
    a rate that diverged), as RL's learners skip such an update: the gradients are dropped before the
    optimiser reads them, so the weights and the optimiser's state stay as they were. The Trainer alone
    would apply them: every later step then reads NaN weights and the checkpoints hold them, while its log
    shows a finite loss (it leaves non-finite losses out of the average, and a window of them logs 0.0).
    The gradients are the same on every process (reduced before this hook), so every process skips alike.
    With ``--fp16`` the loss scaler skips such steps itself, and lowers its scale."""

    def __init__(self):
        self.skipped = 0  # steps skipped in this run

    def on_pre_optimizer_step(self, training_args, state, control, optimizer=None, **kwargs):
        if training_args.fp16:
            return
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not models.finite_gradients(params):
            for p in params:
                p.grad = None  # an optimiser steps no parameter without a gradient
            self.skipped += 1
            logger.warning("step %d: non-finite loss or gradient; the step is skipped (weights unchanged)",
                           state.global_step + 1)


class RunFiles(TrainerCallback):
    """Logs to the run's metrics.jsonl/TensorBoard (with ``nan_skips``, the steps skipped so far for a
    non-finite loss or gradient); saves setting.yml, the choice labels (``labels.json``) and what the
    checkpoint is (``role.json``: the reflector or the policy, as the data's texts say) into each checkpoint."""

    def __init__(self, args, run_dir: Path, labels: tuple[str, ...], role: checkpoints.CheckpointRole,
                 guard: SkipNonFiniteSteps):
        self.args, self.run_dir, self.labels, self.role, self.guard = args, run_dir, labels, role, guard
        self.metrics = metrics.MetricLogger(run_dir)
        self.steps_done = 0  # optimiser steps taken by this process (a resumed run starts later)
        self.last_record = (0, 0)  # (step, steps skipped so far) at the last record with a loss

    def on_train_begin(self, training_args, state, control, **kwargs):
        self.last_record = (state.global_step, 0)  # a resumed run starts at its checkpoint's step

    def on_epoch_begin(self, training_args, state, control, **kwargs):
        # a resumed run logs and saves at its own --logging_steps/--save_steps: the Trainer restores the
        # checkpoint's from its trainer_state.json after on_train_begin, and only warns that they differ
        state.compute_steps(training_args, state.max_steps)

    def on_step_end(self, training_args, state, control, **kwargs):
        self.steps_done += 1

    def on_log(self, training_args, state, control, logs=None, **kwargs):
        if not (state.is_world_process_zero and logs):
            return
        record = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
        if "loss" in record:
            step, skipped = self.last_record
            if self.guard.skipped - skipped >= state.global_step - step > 0:
                record["loss"] = float("nan")  # every step since the last record was skipped: no loss to show
            self.last_record = (state.global_step, self.guard.skipped)
            record["nan_skips"] = self.guard.skipped
        self.metrics.log(state.global_step, record)

    def on_save(self, training_args, state, control, **kwargs):
        """The Trainer has written its files: add ours, mark the checkpoint whole, and only then prune the older
        ones (``--save_total_limit``; the Trainer's own pruning, which ran before these files and could leave
        no whole checkpoint after a kill, is off)."""
        if state.is_world_process_zero:
            checkpoint = self.run_dir / f"checkpoint-{state.global_step}"
            write_label_file(checkpoint, self.labels, self.args.model_name)
            checkpoints.write_role(checkpoint, self.role)
            checkpoints.save_settings(checkpoint, self.args)
            complete.mark(checkpoint)
            checkpoints.prune_checkpoints(self.run_dir, self.args.save_total_limit)

    def on_train_end(self, training_args, state, control, **kwargs):
        self.metrics.close()
