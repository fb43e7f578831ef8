"""supervised_pretrain.py: completion-only labels, truncation, errors, a short run, resume."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

import supervised_pretrain as sft
from prompts import ACTION_MARKER, ANALYZE_MARKER, completion_start, policy_sft_text, reflection_sft_text
from utils import checkpoints, metrics, models

HEAD = "The actions you can take now is:"
OBS = f"--- Current State ---\n+---+\n|T P|\n+---+\n{HEAD}\n0. Move south\n1. Move north\n2. Move east\n"


def _write(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def test_policy_text_trains_only_the_label(tiny_tokenizer):
    text = policy_sft_text(OBS, HEAD, "2", reflection="The passenger is east.")
    example = sft.encode_example(tiny_tokenizer, text, 1024, None)
    completion = [t for t, label in zip(example["input_ids"], example["labels"]) if label != sft.IGNORE]
    assert tiny_tokenizer.decode(completion) == "2"
    assert example["labels"][:-1] == [sft.IGNORE] * (len(example["labels"]) - 1)
    assert tiny_tokenizer.decode(example["input_ids"]) == text


def test_reflection_text_trains_the_reflection_and_eos(tiny_tokenizer):
    text = reflection_sft_text(OBS, HEAD, "The passenger is east of the taxi.")
    example = sft.encode_example(tiny_tokenizer, text, 1024, True)
    trained = [t for t, label in zip(example["input_ids"], example["labels"]) if label != sft.IGNORE]
    assert trained[-1] == tiny_tokenizer.eos_token_id
    assert tiny_tokenizer.decode(trained[:-1]) == "The passenger is east of the taxi.\n"
    prompt = [t for t, label in zip(example["input_ids"], example["labels"]) if label == sft.IGNORE]
    assert tiny_tokenizer.decode(prompt).endswith(ANALYZE_MARKER)


def test_long_prompts_lose_their_beginning(tiny_tokenizer):
    text = policy_sft_text("filler words " * 200 + OBS, HEAD, "1")
    example = sft.encode_example(tiny_tokenizer, text, 64, False)
    assert len(example["input_ids"]) == 64 and tiny_tokenizer.decode(example["input_ids"]).endswith(ACTION_MARKER + "1")
    assert sft.encode_example(tiny_tokenizer, reflection_sft_text(OBS, HEAD, "word " * 100), 20, None) is None


def test_reflect_flag_checks_the_data(tiny_tokenizer):
    with pytest.raises(ValueError, match="--reflect=True"):
        sft.encode_example(tiny_tokenizer, policy_sft_text(OBS, HEAD, "1"), 1024, True)
    with pytest.raises(ValueError, match="--reflect=False"):
        sft.encode_example(tiny_tokenizer, reflection_sft_text(OBS, HEAD, "x"), 1024, False)


def test_bad_task_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="--task_file"):
        sft.read_texts(None)
    with pytest.raises(ValueError, match="no such file"):
        sft.read_texts(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok # Action:\\n1"}\n{not json}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2 is not JSON"):
        sft.read_texts(str(bad))
    bad.write_text('{"txt": "x"}\n')
    with pytest.raises(ValueError, match="no string field 'text'"):
        sft.read_texts(str(bad))


def test_short_run_lowers_the_loss_and_saves_a_loadable_adapter(make_args, tmp_path):
    texts = [policy_sft_text(OBS.replace("T P", f"T{i % 3}P"), HEAD, str(i % 3)) for i in range(24)]
    args = make_args(task_file=_write(tmp_path / "sft.jsonl", texts), max_steps=30, save_steps=15,
                     logging_steps=5, learning_rate=3e-3, per_device_train_batch_size=8)
    assert sft.main(args) == 0
    (run_dir,) = (tmp_path / "results").glob("*_supervised_pretrain")
    losses = [r["loss"] for r in metrics.read_metrics(run_dir) if "loss" in r]
    assert len(losses) == 6 and losses[-1] < 0.5 * losses[0]
    checkpoint = run_dir / "checkpoint-30"
    assert (checkpoint / "adapter_config.json").is_file() and (checkpoint / checkpoints.SETTINGS_FILE).is_file()
    assert (run_dir / "checkpoint-15" / checkpoints.SETTINGS_FILE).is_file()
    tuned, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args()),
                                                       adapter_dir=str(checkpoint), trainable=False)
    base, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args()), trainable=False)
    batch = tokenizer([texts[1][:-1]], return_tensors="pt").to(models.device())
    labels = [tokenizer.convert_tokens_to_ids(label) for label in "012"]
    with torch.no_grad():
        tuned_mass = tuned(**batch).logits[0, -1].softmax(-1)[labels].sum()
        base_mass = base(**batch).logits[0, -1].softmax(-1)[labels].sum()
    assert base_mass < 0.01 and tuned_mass > 0.3  # the adapter learned to answer with a label


def test_resume_continues_the_step_count(make_args, tmp_path, capsys):
    texts = [policy_sft_text(OBS, HEAD, "0")] * 8
    task_file = _write(tmp_path / "sft.jsonl", texts)
    assert sft.main(make_args(task_file=task_file, max_steps=4, save_steps=2)) == 0
    assert "; adapter: " in capsys.readouterr().out  # LoRA, the default
    (first,) = (tmp_path / "results").glob("*_supervised_pretrain")
    assert sft.main(make_args(task_file=task_file, max_steps=6, save_steps=2,
                              resume_from=str(first / "checkpoint-2"))) == 0
    second = tmp_path / "results" / "2_supervised_pretrain"
    assert sorted(p.name for p in second.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    # resumed with another interval, it saves at that one, not at the checkpoint's (trainer_state.json)
    assert sft.main(make_args(task_file=task_file, max_steps=7, save_steps=1,
                              resume_from=str(second / "checkpoint-4"))) == 0
    third = tmp_path / "results" / "3_supervised_pretrain"
    assert sorted(p.name for p in third.glob("checkpoint-*")) == ["checkpoint-5", "checkpoint-6", "checkpoint-7"]
    capsys.readouterr()
    assert sft.main(make_args(task_file=task_file, max_steps=1, save_steps=1, use_peft=False,
                              load_in_8bit=False)) == 0
    assert "; model: " in capsys.readouterr().out  # the whole model: the final line does not call it an adapter



def test_a_batch_is_encoded_as_each_text_alone(tiny_tokenizer):
    """The batch tokeniser calls give each text the ids a call on that text alone gives."""
    texts = [reflection_sft_text(OBS, HEAD, "Head east, then south."), policy_sft_text(OBS, HEAD, "1"),
             reflection_sft_text(OBS, HEAD, "word " * 100), policy_sft_text(OBS + " more", HEAD, "3")]
    examples = sft.encode_examples(tiny_tokenizer, texts, 1024, None)
    for text, example in zip(texts, examples):
        alone = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
        prompt = tiny_tokenizer(text[:completion_start(text)], add_special_tokens=False)["input_ids"]
        reflection = text[:completion_start(text)].endswith(ANALYZE_MARKER)
        assert example["input_ids"] == alone + ([tiny_tokenizer.eos_token_id] if reflection else [])
        assert example["labels"] == [-100] * len(prompt) + example["input_ids"][len(prompt):]
    assert sft.encode_examples(tiny_tokenizer, texts, 20, None)[2] is None  # its completion alone is too long


def _mixed_texts() -> list[str]:
    """Policy and reflection texts of several lengths: batches with padding and completions of 1 to 9 tokens."""
    texts = []
    for i in range(16):
        obs = OBS.replace("T P", f"T{'.' * (i % 5)}P")
        texts.append(policy_sft_text(obs, HEAD, str(i % 3)) if i % 2 else
                     reflection_sft_text(obs, HEAD, "Head east, then south." * (1 + i % 3)))
    return texts


def test_completion_logits_compute_the_head_only_where_the_loss_reads(tiny_tokenizer, make_args):
    examples = sft.encode_examples(tiny_tokenizer, _mixed_texts()[:4], 1024, None)
    full = sft.PadCollator(tiny_tokenizer.pad_token_id)(examples)
    kept = sft.PadCollator(tiny_tokenizer.pad_token_id, completion_logits=True)(examples)
    assert set(full) == {"input_ids", "attention_mask", "labels"}
    for key in full:
        assert torch.equal(full[key], kept[key])
    labels = full["labels"]
    # position t is kept iff the token at t + 1 is a label; the labels follow in the same (row-major) order
    expected = [(row, t) for row in range(len(labels)) for t in range(labels.shape[1] - 1) if labels[row, t + 1] != -100]
    assert kept["logits_to_keep"].nonzero().tolist() == [list(p) for p in expected]
    assert kept["shift_labels"].tolist() == [labels[row, t + 1].item() for row, t in expected]

    model, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args()), trainable=False)
    full, kept = ({key: value.to(model.device) for key, value in batch.items()} for batch in (full, kept))
    with torch.no_grad():
        every = model(**full)
        some = model(**kept)
    assert every.logits.shape[:2] == labels.shape
    assert some.logits.shape == (len(expected), every.logits.shape[-1])  # only the positions the loss reads
    torch.testing.assert_close(some.loss, every.loss, rtol=1e-6, atol=1e-6)


def test_completion_logits_train_as_every_position_does(make_args, tmp_path):
    """--completion_logits changes what is computed, not what is learned; --no_completion_logits is the paper's."""
    task_file = _write(tmp_path / "sft.jsonl", _mixed_texts())
    weights, losses = [], []
    for on in (True, False):
        root = tmp_path / f"on-{on}"
        # in float32: a GPU's 8-bit base and bfloat16 give other sums for other shapes (0.03% on an H200)
        assert sft.main(make_args(task_file=task_file, max_steps=4, logging_steps=1, completion_logits=on,
                                  per_device_train_batch_size=4, ckpt_path=str(root), load_in_8bit=False,
                                  bf16=False)) == 0
        (run_dir,) = root.glob("*_supervised_pretrain")
        losses.append([r["loss"] for r in metrics.read_metrics(run_dir) if "loss" in r])
        weights.append(load_file(run_dir / "checkpoint-4" / "adapter_model.safetensors"))
    assert len(losses[0]) == 4
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    assert weights[0].keys() == weights[1].keys()
    atol = 1e-6 if torch.cuda.is_available() else 1e-7  # cuBLAS sums other shapes in another order (3.6e-7)
    for name in weights[0]:
        torch.testing.assert_close(weights[0][name], weights[1][name], rtol=1e-5, atol=atol)


def test_a_model_without_logits_to_keep_runs_every_position(make_args, caplog):
    class Plain(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, labels=None):
            raise AssertionError("not called")

    assert sft.completion_logits(make_args(), Plain()) is False
    assert "no logits_to_keep" in caplog.text
    model, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args()), trainable=False)
    assert sft.completion_logits(make_args(), model) is True
    assert sft.completion_logits(make_args(completion_logits=False), model) is False


def test_a_step_with_a_non_finite_loss_is_skipped_and_counted(make_args, tmp_path, monkeypatch, capsys, caplog):
    """A NaN loss (a rate that diverged, an overflow in bfloat16) gives NaN gradients. The Trainer alone applies
    them (every later weight NaN, while its log shows a loss of 0.0 for a window of such steps); the step is
    skipped instead, as RL skips such an update: the weights stay those of the last step taken."""
    from transformers import Trainer

    poisoned = {2, 3}
    compute_loss = Trainer.compute_loss

    def poisoning(self, model, inputs, *args, **kwargs):
        loss = compute_loss(self, model, inputs, *args, **kwargs)
        return loss * float("nan") if self.state.global_step + 1 in poisoned else loss

    monkeypatch.setattr(Trainer, "compute_loss", poisoning)
    texts = [policy_sft_text(OBS.replace("T P", f"T{i % 3}P"), HEAD, str(i % 3)) for i in range(8)]
    # float32: no loss scaler, on every device; a weight decay, which a step with zero gradients would apply
    assert sft.main(make_args(task_file=_write(tmp_path / "sft.jsonl", texts), max_steps=4, save_steps=1,
                              logging_steps=1, learning_rate=1e-2, weight_decay=0.1, per_device_train_batch_size=4,
                              load_in_8bit=False, bf16=False)) == 0
    (run_dir,) = (tmp_path / "results").glob("*_supervised_pretrain")
    weights = [load_file(run_dir / f"checkpoint-{step}" / "adapter_model.safetensors") for step in (1, 2, 3, 4)]
    for name, first in weights[0].items():
        assert all(bool(torch.isfinite(w[name]).all()) for w in weights)
        assert torch.equal(weights[1][name], first) and torch.equal(weights[2][name], first)  # steps 2, 3 skipped
    assert any(not torch.equal(weights[3][name], first) for name, first in weights[0].items())  # step 4 trained
    records = [r for r in metrics.read_metrics(run_dir) if "loss" in r]
    assert [r["nan_skips"] for r in records] == [0, 1, 2, 2]
    assert [math.isnan(r["loss"]) for r in records] == [False, True, True, False]  # no loss where none was taken
    assert "step 2: non-finite loss or gradient" in caplog.text and "step 3:" in caplog.text
    assert "(2 of 4 steps skipped for a non-finite loss or gradient" in capsys.readouterr().out
