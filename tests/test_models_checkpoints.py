"""The loader, the label head, run directories, checkpoints and the metric logger."""

import copy
import json
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from experiment_args import parse_args
from prompts import LABELS, label_token_ids, policy_prompt
from utils import checkpoints, lm_head, metrics, models, seeding
from utils.errors import UsageError

HEAD = "The actions you can take now is:"
PROMPTS = [
    policy_prompt(f"A state.\n{HEAD}\n0. left\n1. right\n", HEAD),
    policy_prompt(f"A longer state with more words in it.\n{HEAD}\n0. up\n", HEAD),
]


def _count(model) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad), sum(p.numel() for p in model.parameters())


def _batch(tokenizer):
    return tokenizer(PROMPTS, return_tensors="pt", padding=True).to(models.device())


def test_new_lora_adapter_trains_only_lora(make_args):
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args(peft_lora_r=8)))
    config = model.get_base_model().config
    # GPT-2's default LoRA target is c_attn: (n_embd -> 3 n_embd) per layer, r (in + out) weights.
    expected = config.n_layer * 8 * (config.n_embd + 3 * config.n_embd)
    trainable, total = _count(model)
    assert trainable == expected and total > trainable
    assert all("lora_" in name for name, p in model.named_parameters() if p.requires_grad)


def test_the_causal_lm_loss_is_named_not_guessed(make_args):
    """transformers 5.x picks the loss by class name; GPT2LMHeadModel matches none and it warns
    ``loss_type=None ... unrecognized`` at the first labelled forward pass unless the loader names it."""
    from transformers.loss.loss_utils import LOSS_MAPPING

    for use_peft in (True, False):
        # a CUDA machine keeps the 8-bit default, which only LoRA can train
        loader = models.ModelSettings.from_args(make_args(use_peft=use_peft, load_in_8bit=use_peft))
        model, tokenizer = models.load_model_and_tokenizer(loader)
        base = model.get_base_model() if use_peft else model
        assert base.loss_type == "ForCausalLM" and base.loss_type in LOSS_MAPPING
        assert base.loss_function is LOSS_MAPPING["ForCausalLM"]


def test_shrunk_head_equals_full_head_at_label_tokens(make_args):
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args()))
    batch = _batch(tokenizer)
    with torch.no_grad():
        full = model(**batch).logits[:, -1]
    head = lm_head.shrink_lm_head(model, label_token_ids(tokenizer))
    assert lm_head.label_head(model) is head and len(head.token_ids) == len(LABELS)
    with torch.no_grad():
        shrunk = model(**batch).logits[:, -1]
    assert shrunk.shape == (2, len(LABELS))
    torch.testing.assert_close(shrunk, full[:, head.token_ids])
    assert not any(p.requires_grad for p in head.parameters())
    with lm_head.full_head(model), torch.no_grad():
        torch.testing.assert_close(model(**batch).logits[:, -1], full)
    assert lm_head.label_head(model) is head


def test_loader_shrinks_on_request(make_args):
    model, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args()), shrink_head=True)
    assert lm_head.label_head(model) is not None


def test_adapter_loads_trainable_or_frozen(make_args, tmp_path):
    args = make_args(load_in_8bit=False, bf16=False)  # float32 either way: compared exactly
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    model.save_pretrained(tmp_path / "adapter")
    batch = _batch(tokenizer)
    model.eval()  # no dropout
    with torch.no_grad():
        expected = model(**batch).logits

    trained, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(args),
                                                 adapter_dir=str(tmp_path / "adapter"))
    frozen, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(args),
                                                adapter_dir=str(tmp_path / "adapter"), trainable=False)
    assert _count(trained)[0] == _count(model)[0]
    assert _count(frozen)[0] == 0 and not frozen.training
    trained.eval()
    with torch.no_grad():
        torch.testing.assert_close(trained(**batch).logits, expected)
        torch.testing.assert_close(frozen(**batch).logits, expected)


@pytest.mark.parametrize("use_peft", [True, False])
def test_a_checkpoint_with_non_finite_weights_is_refused_in_one_line(make_args, tmp_path, use_peft):
    """A diverged run's checkpoint (NaN in one weight) is refused where it loads, naming it, for an adapter and
    for a whole model, trainable (RL's start) or frozen (evaluation): it would play NaN log-probabilities."""
    args = make_args(use_peft=use_peft, load_in_8bit=False, bf16=False)
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args))
    checkpoint = checkpoints.save_checkpoint(tmp_path / "ckpt", model=model, tokenizer=tokenizer, args=args, step=1)
    for trainable in (True, False):  # finite: loads
        models.load_model_and_tokenizer(models.ModelSettings.from_args(args), adapter_dir=str(checkpoint),
                                        trainable=trainable)
    with torch.no_grad():
        weight = next(p for n, p in model.named_parameters() if "lora_" in n or not use_peft)
        weight.view(-1)[0] = float("nan")
    checkpoint = checkpoints.save_checkpoint(tmp_path / "nan", model=model, tokenizer=tokenizer, args=args, step=1)
    for trainable in (True, False):
        with pytest.raises(UsageError, match=rf"checkpoint {checkpoint}: 1 of its weight tensors hold NaN"):
            models.load_model_and_tokenizer(models.ModelSettings.from_args(args), adapter_dir=str(checkpoint),
                                            trainable=trainable)


def test_frozen_base_model_without_adapter(make_args):
    model, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args()), trainable=False)
    assert _count(model)[0] == 0


def test_not_an_adapter_dir_is_named(make_args, tmp_path):
    with pytest.raises(ValueError, match="neither an adapter directory"):
        models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args()), adapter_dir=str(tmp_path))


def test_run_dirs_get_unique_increasing_ids(make_args, tmp_path):
    args = make_args()
    with ThreadPoolExecutor(8) as pool:
        dirs = list(pool.map(lambda i: checkpoints.make_run_dir(args, "rl_finetune" if i % 2 else "sft"), range(16)))
    ids = sorted(int(d.name.split("_")[0]) for d in dirs)
    assert ids == list(range(1, 17))
    assert all((d / checkpoints.SETTINGS_FILE).is_file() for d in dirs)
    assert checkpoints.make_run_dir(args, "x").name == "17_x"
    rl_runs = checkpoints.run_dirs(tmp_path / "results", "rl_finetune")
    rl_ids = [int(d.name.split("_")[0]) for d in rl_runs]
    assert len(rl_runs) == 8 and rl_ids == sorted(rl_ids) and all(d.name.endswith("_rl_finetune") for d in rl_runs)
    assert [d.name.split("_")[0] for d in checkpoints.run_dirs(tmp_path / "results")] == [str(i) for i in range(1, 18)]


def test_settings_replay_as_config(make_args):
    args = make_args(learning_rate=1e-3, shrink_head=True, env="taxi", lora_target_modules=["c_attn"])
    run_dir = checkpoints.make_run_dir(args, "sft")
    again = parse_args([f"--config={run_dir / checkpoints.SETTINGS_FILE}"])
    assert again.to_dict() == {**args.to_dict(), "config": again.config}


def test_checkpoint_round_trip_restores_optimizer_rng_and_adapter(make_args, tmp_path):
    args = make_args(seed=3)
    seeding.set_seed(args.seed)
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args), shrink_head=True)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = _batch(tokenizer)
    for _ in range(2):
        optimizer.zero_grad()
        model(**batch).logits[:, -1].logsumexp(-1).sum().backward()
        optimizer.step()
    generator = np.random.default_rng(7)
    generator.random(3)
    ckpt = checkpoints.save_checkpoint(tmp_path / "checkpoint-2", model=model, tokenizer=tokenizer, args=args, step=2,
                                 optimizer=optimizer, state={"generator": generator.bit_generator.state,
                                                             "buffer": [{"labels": ["1", "a"], "cost": -0.5}]})
    draws = (random.random(), np.random.rand(), torch.rand(2), generator.random())

    model2, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(args), adapter_dir=str(ckpt),
                                                shrink_head=True)
    optimizer2 = torch.optim.Adam([p for p in model2.parameters() if p.requires_grad], lr=1e-2)
    restored = checkpoints.load_checkpoint(ckpt, optimizer2)
    generator2 = np.random.default_rng()
    generator2.bit_generator.state = restored["state"]["generator"]
    assert restored["step"] == 2 and restored["state"]["buffer"][0]["labels"] == ["1", "a"]
    assert (random.random(), np.random.rand()) == draws[:2]
    assert torch.equal(torch.rand(2), draws[2]) and generator2.random() == draws[3]
    for group, group2 in zip(optimizer.state_dict()["state"].values(), optimizer2.state_dict()["state"].values()):
        torch.testing.assert_close(group["exp_avg"], group2["exp_avg"])
    model.eval(), model2.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, model2(**batch).logits)
    assert (ckpt / "adapter_config.json").is_file() and (ckpt / checkpoints.SETTINGS_FILE).is_file()


def test_checkpoint_overwrite_and_bad_dir(make_args, tmp_path):
    args = make_args()
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args))
    checkpoints.save_checkpoint(tmp_path / "c", model=model, tokenizer=tokenizer, args=args, step=1)
    checkpoints.save_checkpoint(tmp_path / "c", model=model, tokenizer=tokenizer, args=args, step=5)
    assert checkpoints.load_checkpoint(tmp_path / "c")["step"] == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]
    with pytest.raises(ValueError, match="not a training checkpoint"):
        checkpoints.load_checkpoint(tmp_path)


def test_metric_logger_writes_jsonl_and_tensorboard(tmp_path):
    logger = metrics.MetricLogger(tmp_path)
    logger.log(1, {"success": 0.5, "loss": 1.25, "stage": "pickup"})
    logger.log(2, {"success": 0.75, "loss": 1.0, "stage": "pickup"})
    logger.close()
    records = metrics.read_metrics(tmp_path)
    assert records == [{"step": 1, "success": 0.5, "loss": 1.25, "stage": "pickup"},
                       {"step": 2, "success": 0.75, "loss": 1.0, "stage": "pickup"}]
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.value for e in events.Scalars("success")] == [0.5, 0.75]


def test_whole_model_training_and_reload_with_the_label_head(make_args, tmp_path):
    """--no_use_peft trains every weight; the label head keeps the tied matrix frozen so a
    saved and reloaded model scores labels exactly as in training."""
    args = make_args(use_peft=False, load_in_8bit=False)  # a CUDA machine would keep the 8-bit default
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args), shrink_head=True)
    trainable, total = _count(model)
    embedding = model.get_input_embeddings().weight
    assert not embedding.requires_grad and trainable == total - embedding.numel()
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.eval()
    batch = _batch(tokenizer)
    for _ in range(3):
        optimizer.zero_grad()
        model(**batch).logits[:, -1, 0].sum().backward()
        optimizer.step()
    with torch.no_grad():
        expected = model(**batch).logits
    checkpoint = checkpoints.save_checkpoint(tmp_path / "ckpt", model=model, tokenizer=tokenizer, args=args, step=3)
    assert (checkpoint / "config.json").is_file() and not (checkpoint / "adapter_config.json").exists()
    again, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(args), adapter_dir=str(checkpoint),
                                               trainable=False, shrink_head=True)
    with torch.no_grad():
        torch.testing.assert_close(again(**batch).logits, expected)


def test_a_quantised_model_is_never_trained_in_full(make_args, tmp_path):
    """8/4-bit weights take no gradient, so training every weight of one (--no_use_peft, or a saved whole
    model) is refused before anything loads, naming the flags; a CPU drops the 8 bits itself, so the
    setting a CUDA machine keeps is set here by hand."""
    args = make_args(use_peft=False)
    args.load_in_8bit = True
    with pytest.raises(UsageError, match=r"^--load_in_8bit cannot train every weight \(--no_use_peft\).*--no_load_in_8bit"):
        models.load_model_and_tokenizer(models.ModelSettings.from_args(args))
    whole = tmp_path / "whole"
    whole.mkdir()
    (whole / "config.json").write_text("{}")
    (whole / "model.safetensors").write_bytes(b"")  # never read: refused first
    args = make_args()
    args.load_in_8bit, args.load_in_4bit = False, True
    with pytest.raises(UsageError, match=r"^--load_in_4bit cannot train every weight \(the whole model saved in"):
        models.load_model_and_tokenizer(models.ModelSettings.from_args(args), adapter_dir=str(whole))


@pytest.mark.cpu_path
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU fallback only applies without CUDA")
def test_cpu_bf16_keeps_bfloat16_on_the_cpu(make_args, tmp_path):
    import rl_finetune
    import supervised_pretrain

    assert parse_args([]).bf16 is False
    assert models.compute_dtype(models.ModelSettings.from_args(parse_args([]))) == torch.float32
    args = parse_args(["--cpu_bf16"])
    assert args.bf16 is True and args.load_in_8bit is False
    assert models.compute_dtype(models.ModelSettings.from_args(args)) == torch.bfloat16
    model, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args(cpu_bf16=True)))
    assert {p.dtype for n, p in model.named_parameters() if "lora_" not in n} == {torch.bfloat16}
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}  # peft's choice
    # SFT and RL run in bfloat16 end to end
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"text": policy_prompt("state\nThe actions you can take now is:\n0. go\n",
                                                                "The actions you can take now is:") + "0"}) + "\n"
                            for _ in range(4)))
    assert supervised_pretrain.main(make_args(cpu_bf16=True, task_file=str(data), max_steps=2, save_steps=2,
                                              per_device_train_batch_size=2)) == 0
    assert rl_finetune.main(make_args(cpu_bf16=True, env="taxi", max_steps=1, save_steps=1, horizon=2,
                                      per_device_eval_batch_size=2, eval_steps=0)) == 0


@pytest.mark.cpu_path
def test_adapter_autocast_multiplies_lora_in_bfloat16_and_keeps_float32_weights_and_gradients(make_args):
    """--adapter_autocast: over a bfloat16 base, each LoRA layer's two products read bfloat16 (peft's own path
    casts the input up to float32); the adapter's weights and their gradients stay float32, the logits stay
    those of peft's path to bfloat16 rounding, and without the flag peft's path as it is. On a
    float32 model the flag changes nothing."""
    from peft.tuners.lora import Linear as LoraLinear

    seen, out = {}, {}
    ids = torch.tensor([[5, 6, 7, 8, 9], [9, 10, 11, 12, 13]], device=models.device())
    bfloat16 = dict(load_in_8bit=False, bf16=True) if torch.cuda.is_available() else dict(cpu_bf16=True)
    for on in (True, False):
        torch.manual_seed(0)
        model, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args(**bfloat16,
                                                                                           adapter_autocast=on)))
        layers = [m for m in model.modules() if isinstance(m, LoraLinear)]
        assert layers and all(getattr(m, "_autocast", False) is on for m in layers)
        if on:  # a copy of the model runs its own layers, not the original's
            copied = [m for m in copy.deepcopy(model).modules() if isinstance(m, LoraLinear)]
            assert all(m.forward.__self__ is m for m in copied)
        for m in layers:
            m.lora_A["default"].register_forward_hook(
                lambda mod, args, result, on=on: seen.setdefault(on, set()).add((args[0].dtype, result.dtype)))
            torch.nn.init.normal_(m.lora_B["default"].weight, std=0.02)  # peft starts B at 0: give it a say
        model.eval()
        logits = model(input_ids=ids).logits
        logits.float().square().mean().backward()
        lora = [p for n, p in model.named_parameters() if "lora_" in n]
        assert {p.dtype for p in lora} == {torch.float32} and {p.grad.dtype for p in lora} == {torch.float32}
        assert all(bool(p.grad.abs().sum() > 0) for n, p in model.named_parameters() if "lora_B" in n)
        out[on] = logits.detach().float()
    assert seen[True] == {(torch.bfloat16, torch.bfloat16)}  # autocast: bf16 in, bf16 out
    assert seen[False] == {(torch.float32, torch.float32)}  # peft: the input cast up to the weights' float32
    assert not torch.equal(out[True], out[False])  # another arithmetic ...
    assert torch.allclose(out[True], out[False], atol=0.05, rtol=0.02)  # ... to bfloat16's rounding

    float32 = {}
    for on in (True, False):
        torch.manual_seed(0)
        loader = models.ModelSettings.from_args(make_args(load_in_8bit=False, bf16=False, adapter_autocast=on))
        model, _ = models.load_model_and_tokenizer(loader)
        assert models.autocast_adapters(model) == 0  # nothing to gain on float32 weights
        float32[on] = model(input_ids=ids).logits
    assert torch.equal(float32[True], float32[False])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's choice of attention kernel")
def test_attention_kernel_is_eager_only_for_bf16_training_on_a_cpu(make_args):
    """--attn_implementation auto: eager where torch's CPU sdpa backward pass in bfloat16 is slow (a trained
    model in bf16 on a CPU), transformers' own choice elsewhere (float32, a frozen model: sdpa for GPT-2; the
    architecture tests load Gemma2, which has only eager); an explicit kernel is kept."""
    def loader(**flags) -> models.ModelSettings:
        return models.ModelSettings.from_args(make_args(**flags))

    bf16 = loader(cpu_bf16=True)
    assert models.attention_kernel(bf16, trainable=True) == "eager"
    assert models.attention_kernel(bf16, trainable=False) is None
    assert models.attention_kernel(loader(), trainable=True) is None
    assert models.attention_kernel(loader(cpu_bf16=True, attn_implementation="sdpa"), trainable=True) == "sdpa"
    assert models.attention_kernel(loader(attn_implementation="eager"), trainable=False) == "eager"
    trained, _ = models.load_model_and_tokenizer(bf16)
    frozen, _ = models.load_model_and_tokenizer(bf16, trainable=False)
    assert lm_head.base_model(trained).config._attn_implementation == "eager"
    assert frozen.config._attn_implementation == "sdpa"
    with pytest.raises(SystemExit):
        parse_args(["--attn_implementation=flash"])


@pytest.mark.cpu_path
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU fallback only applies without CUDA")
def test_cpu_bf16_warns_on_a_cpu_without_native_bfloat16(make_args, monkeypatch, caplog, fresh_say_once):
    """Said when the model loads, before hours are spent: with the measured cost and the way out, once."""
    from utils import cpu

    monkeypatch.setattr(cpu, "caps", lambda: cpu.probe({}, (frozenset({"avx2", "fma"}), "an AVX2 CPU")))
    for _ in range(2):
        models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args(cpu_bf16=True)), trainable=False)
    said = [r for r in caplog.records if "emulated" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING"
    assert cpu.EMULATED_BF16 in said[0].getMessage() and "float32 (no --cpu_bf16)" in said[0].getMessage()
    caplog.clear()
    monkeypatch.setattr(cpu, "caps", lambda: cpu.probe({}, (frozenset({"avx2", "fma", "avx512f", "avx512bw",
                                                                       "avx512vl", "avx512dq", "avx512_bf16"}), "")))
    models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args(cpu_bf16=True)), trainable=False)
    assert "emulated" not in caplog.text



def test_a_third_party_line_said_at_every_product_is_said_once(caplog):
    """``say_once``: bitsandbytes logs its bf16-to-float16 cast at every 8-bit product (27,000 lines in an RL
    iteration of GPT-2 XL at the GPU defaults); each distinct line of that logger now appears once, and the
    filter is installed once however often a model loads (tests/test_gpu.py checks it on bitsandbytes)."""
    import logging

    from utils import log_filters

    noisy = logging.getLogger(log_filters.BNB_CAST_LOGGER)
    saved = list(noisy.filters)
    noisy.filters[:] = []  # a fresh filter: one a quantised load installed in this process remembers its lines
    try:
        log_filters.say_once(log_filters.BNB_CAST_LOGGER)
        log_filters.say_once(log_filters.BNB_CAST_LOGGER)
        assert sum(type(f).__name__ == "_SaidOnce" for f in noisy.filters) == 1
        with caplog.at_level(logging.WARNING):
            for dtype in ("torch.bfloat16", "torch.bfloat16", "torch.float32", "torch.bfloat16"):
                noisy.warning("MatMul8bitLt: inputs will be cast from %s to float16 during quantization", dtype)
        assert [r.getMessage().split()[6] for r in caplog.records if r.name == log_filters.BNB_CAST_LOGGER] == \
               ["torch.bfloat16", "torch.float32"]
    finally:
        noisy.filters[:] = saved


def test_our_own_lines_are_said_once_by_the_same_say_once_which_imports_no_torch(caplog, fresh_say_once):
    """One say-once for both kinds of caller: a line of ours (a CPU fallback, the compute line) is said where it is
    first taken and dropped after, by the filter that quiets bitsandbytes; the module imports no torch, so the
    torch-free CPU probe and the data generators may use it."""
    import logging

    from utils import cpu, log_filters

    assert not hasattr(cpu, "say_once")
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            log_filters.say_once("tests.once", "a fallback", logging.INFO)
        log_filters.say_once("tests.once", "another line")
        # a key makes lines of other texts the same one (a checkpoint's warning, whichever flag named its folder)
        for where in ("--load_dir", "Reflect-RL: load_dir"):
            log_filters.say_once("tests.once", f"{where} 'ckpt' has no role.json", key=("/abs/ckpt", "no role.json"))
    assert [(r.getMessage(), r.levelno) for r in caplog.records if r.name == "tests.once"] == \
           [("a fallback", logging.INFO), ("another line", logging.WARNING),
            ("--load_dir 'ckpt' has no role.json", logging.WARNING)]
    code = "import sys, utils.log_filters, utils.cpu; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                            text=True, timeout=600)
    assert result.stdout.split() == ["False"], result.stderr[-2000:]
