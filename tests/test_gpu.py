"""The GPU defaults as a user on one CUDA device gets them: the paper's 8-bit base model (bitsandbytes),
bfloat16 compute, LoRA on top, then SFT, RL and evaluation through them. Skipped without CUDA
(the CPU fallback of the same flags is tested in test_args.py and test_models_checkpoints.py)."""

import json
import logging

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _quantised(model, kind: str) -> list[str]:
    """The names of the base model's modules that bitsandbytes replaced (``Linear8bitLt``/``Linear4bit``)."""
    return [name for name, module in model.named_modules() if type(module).__name__ == kind]


def test_the_defaults_load_the_base_in_eight_bits_with_a_bfloat16_lora_on_the_gpu(make_args, caplog):
    from utils import log_filters, models

    args = make_args()
    assert args.load_in_8bit and args.bf16  # kept: a CUDA device is present
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args))
    assert _quantised(model, "Linear8bitLt"), "the base model was not quantised"
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(p.device.type == "cuda" for p in trainable)
    batch = tokenizer(["The taxi is at"], return_tensors="pt").to(models.device())
    for said in logging.getLogger(log_filters.BNB_CAST_LOGGER).filters:  # lines an earlier load said: said again here
        said.said.clear()
    dtype = models.compute_dtype(models.ModelSettings.from_args(args))
    with caplog.at_level(logging.WARNING), torch.autocast("cuda", dtype=dtype):
        for _ in range(3):
            loss = model(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    assert torch.isfinite(loss) and any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable)
    # bitsandbytes says at every 8-bit product that it casts bf16 inputs to float16: once here, not 3 x 8 times
    casts = [r.getMessage() for r in caplog.records if r.name == log_filters.BNB_CAST_LOGGER]
    assert casts and len(casts) == len(set(casts)) <= 2, casts


def test_sft_then_rl_then_evaluation_run_on_the_eight_bit_model(make_args, tmp_path):
    """The chain a user runs, at the paper's GPU defaults: each step reads the one before it."""
    import rl_finetune
    import supervised_pretrain as sft
    from evaluation import evaluate
    from prompts import policy_sft_text
    from tests.test_sft import HEAD, OBS  # the SFT tests' Taxi observation
    from utils import checkpoints, metrics

    task_file = tmp_path / "sft.jsonl"
    task_file.write_text("".join(json.dumps({"text": policy_sft_text(OBS, HEAD, str(i % 3))}) + "\n"
                                 for i in range(16)))
    assert sft.main(make_args(task_file=str(task_file), max_steps=4, save_steps=4, logging_steps=2,
                              per_device_train_batch_size=4, optim="paged_adamw_32bit")) == 0
    (sft_run,) = (tmp_path / "results").glob("*_supervised_pretrain")
    losses = [r["loss"] for r in metrics.read_metrics(sft_run) if "loss" in r]
    assert losses and all(loss == loss for loss in losses)  # finite, not NaN

    assert rl_finetune.main(make_args(env="taxi", taxi_curriculum=True, curriculum_index=0, trainer="ppo",
                                      per_device_eval_batch_size=4, per_device_train_batch_size=4,
                                      max_steps=2, save_steps=2,
                                      load_dir=str(sft_run / "checkpoint-4"))) == 0
    (rl_run,) = checkpoints.run_dirs(tmp_path / "results", "rl_finetune")
    records = metrics.read_metrics(rl_run)
    assert [r["step"] for r in records] == [1, 2] and all(r["nan_skips"] == 0 for r in records)

    run = evaluate.run(make_args(env="taxi", taxi_curriculum=True, curriculum_index=0, eval_reps=4,
                                 per_device_eval_batch_size=4),
                       [{"env": "taxi", "load_dir": str(rl_run / "checkpoint-2"), "name": "8-bit"}])
    (result,) = run.results
    assert result["levels"]["pickup"]["episodes"] == 4


def test_the_update_reads_the_rollouts_own_passes_on_the_eight_bit_model(make_args, tmp_path, monkeypatch):
    """``--reuse_rollout_pass`` at the GPU defaults (8-bit base, bfloat16 autocast, LoRA): every update takes the
    rollout's kept passes (their graphs run back through bitsandbytes' layers), and the run plays the same moves
    as one that reads its prompts again: a pass with gradient computes what one without it does."""
    import rl_finetune
    from rollout import KeptPasses
    from utils import checkpoints, metrics

    taken = []
    take = KeptPasses.take
    monkeypatch.setattr(KeptPasses, "take", lambda self, decisions: taken.append(take(self, decisions)) or taken[-1])
    common = dict(env="taxi", taxi_curriculum=True, curriculum_index=0, trainer="pg", baseline="mean",
                  per_device_eval_batch_size=4, per_device_train_batch_size=4, learning_rate=1e-3,
                  max_steps=2, save_steps=2)
    assert make_args().load_in_8bit and make_args().bf16  # the GPU defaults
    assert rl_finetune.main(make_args(**common)) == 0
    assert len(taken) == 2 and not any(taken)
    taken.clear()
    assert rl_finetune.main(make_args(**common, reuse_rollout_pass=True)) == 0
    assert len(taken) == 2 and all(taken)  # each iteration's fresh decisions, from the rollout's passes
    runs = checkpoints.run_dirs(tmp_path / "results", "rl_finetune")
    logs = [[json.loads(line) for line in (run / "checkpoint-2" / "episodes.jsonl").read_text().splitlines()]
            for run in runs]
    # the first iteration's moves, at the same weights (the second's follow updates equal only to bf16 rounding)
    labels = [[step["label"] for episode in log if episode["iteration"] == 1 for step in episode["steps"]]
              for log in logs]
    assert labels[0] and labels[0] == labels[1]
    for run in runs:
        records = [r for r in metrics.read_metrics(run) if "loss" in r]
        assert len(records) == 2 and all(r["nan_skips"] == 0 and r["loss"] == r["loss"] for r in records)
