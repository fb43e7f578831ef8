"""--packed_weights (utils/packed_weights.py): the frozen reflector's linear layers multiplied with weights laid out
once for oneDNN compute the same logits (bit for bit in bfloat16 where the CPU computes it natively, to rounding in
float32), are repacked when the weights change, leave every other layer alone, and reach the rollout by their flag."""

import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from utils import packed_weights
from utils.cpu import cpu_native_bf16
from utils.packed_weights import PackedWeights

pytestmark = [pytest.mark.skipif(not packed_weights.available(), reason="this torch build has no oneDNN packed product"),
              pytest.mark.cpu_path]  # run again by make test's portable leg, on the AVX2 path (utils/cpu.py)


def _llama(dtype):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config).to(dtype).eval().requires_grad_(False)


def _gpt2(dtype):  # GPT-2's attention and MLP are Conv1D layers, its head an nn.Linear
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=300, n_embd=64, n_layer=2, n_head=4, n_positions=64)
    return GPT2LMHeadModel(config).to(dtype).eval().requires_grad_(False)


def _linears(model):
    return [m for m in model.modules() if packed_weights.packable(m)]


@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_packed_layers_compute_the_same_logits(build, dtype):
    """On every CPU: where oneDNN cannot pack bfloat16 (AVX2 only, or the portable leg's forced AVX2 path), the
    bfloat16 layers keep torch's product, and the logits are torch's, bit for bit."""
    model = build(dtype)
    ids = torch.randint(0, 300, (5, 9))
    layers = _linears(model)
    packs = dtype == torch.float32 or packed_weights.bf16_packable()
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        packer = PackedWeights(model)
        with packer.active():
            packed = model(input_ids=ids).logits
            # every linear layer goes through its packed weight (the attention and MLP layers and the head) ...
            assert len(layers) >= 2 * 4 + 1
            assert len(packer.packed) == (len(layers) if packs else 0)
            assert all(("forward" in vars(layer)) is packs for layer in layers)  # ... where this CPU packs them
    assert not any("forward" in vars(m) for m in model.modules())  # the layers compute as before
    if dtype == torch.bfloat16 and (cpu_native_bf16() or not packs):
        assert torch.equal(packed, plain)  # oneDNN's own kernel either way, or torch's product itself
    else:
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # float32: another kernel; emulated bf16 likewise
        assert torch.allclose(packed.float(), plain.float(), atol=tolerance, rtol=0)


def test_where_onednn_cannot_pack_bfloat16_its_layers_keep_torchs_product_said_once(monkeypatch, caplog, fresh_say_once):
    """An AVX2-only CPU: oneDNN's bfloat16 reorder would raise ("bf16 path needs the cpu support avx_ne_convert or
    avx512bw, avx512vl and avx512dq"). It is never asked: the bfloat16 layers keep torch's product, float32 layers
    are packed as anywhere, and the fallback is said once, in one line."""
    monkeypatch.setattr(packed_weights, "bf16_packable", lambda: False)

    def refused(weight):
        assert weight.dtype != torch.bfloat16, "asked oneDNN to pack a bfloat16 weight"
        return real(weight)

    real = torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(packed_weights, "_reorder", refused)
    half, full = nn.Linear(8, 4).bfloat16().requires_grad_(False), nn.Linear(8, 4).requires_grad_(False)
    model = nn.ModuleDict({"bf16": half, "fp32": full})
    x = torch.randn(3, 8)
    with torch.no_grad():
        plain = half(x.bfloat16()), full(x)
        packer = PackedWeights(model)
        for _ in range(2):
            with packer.active():
                assert "forward" not in vars(half) and "forward" in vars(full)
                assert torch.equal(half(x.bfloat16()), plain[0])
                assert torch.allclose(full(x), plain[1], atol=1e-6)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("packed weights:")]
    assert len(said) == 1 and "\n" not in said[0] and "torch's product" in said[0]
    assert list(packer.packed.keys()) == [full]


def test_the_copies_follow_the_weights():
    model = _llama(torch.float32)
    packer = PackedWeights(model)
    ids = torch.randint(0, 300, (3, 7))
    with torch.no_grad():
        with packer.active():
            before = model(input_ids=ids).logits
        model.model.layers[0].mlp.down_proj.weight.mul_(3.0)  # an in-place change, as an optimiser step makes
        plain = model(input_ids=ids).logits
        with packer.active():
            after = model(input_ids=ids).logits
    assert not torch.allclose(before, plain, atol=1e-3)
    assert torch.allclose(after, plain, atol=1e-5, rtol=0)  # packed again from the new weights


def test_only_frozen_plain_cpu_layers_are_packed():
    trained = nn.Linear(4, 4)  # its weight takes gradient
    frozen = nn.Linear(4, 4).requires_grad_(False)
    half = nn.Linear(4, 4).half().requires_grad_(False)
    wrapped = nn.Linear(4, 4).requires_grad_(False)
    wrapped.forward = lambda x: x  # another wrapper (an accelerate hook) owns its forward

    class Quantised(nn.Linear):  # a subclass (bitsandbytes' layers are) has its own product
        pass

    quantised = Quantised(4, 4).requires_grad_(False)
    assert [packed_weights.packable(m) for m in (trained, frozen, half, wrapped, quantised)] == [
        False, True, False, False, False]


def test_a_packed_layer_keeps_the_graph_where_gradient_is_asked_for():
    layer = nn.Linear(6, 3).requires_grad_(False)
    model = nn.Sequential(layer)
    x = torch.randn(2, 6, requires_grad=True)
    with PackedWeights(model).active():
        model(x).sum().backward()  # the layer's own product: no packed kernel cuts the graph
    assert torch.allclose(x.grad, layer.weight.sum(0).expand(2, 6))


def test_under_autocast_a_layer_computes_as_autocast_says():
    """--adapter_autocast runs LoRA's float32 layers under torch.autocast: they must multiply in bf16 as without
    the packed copies, not in float32 through them."""
    layer = nn.Linear(8, 4).requires_grad_(False)
    model = nn.Sequential(layer)
    x = torch.randn(3, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        plain = model(x)
        with PackedWeights(model).active():
            packed = model(x)
    assert plain.dtype == packed.dtype == torch.bfloat16 and torch.equal(packed, plain)


def test_the_flag_reaches_the_rollout():
    from experiment_args import ScriptArguments, parse_args
    from rollout import TwoPlayerRollout
    from utils import models

    args = ScriptArguments(model_name="tiny-gpt2", load_in_8bit=False, bf16=False)
    policy, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args), shrink_head=True)
    reflector, reflect_tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args),
                                                                   trainable=False)
    for flags, on in (([], True), (["--no_packed_weights"], False)):
        args = parse_args(["--model_name=tiny-gpt2", "--env=taxi", *flags])
        rollout = TwoPlayerRollout.from_args(args, policy, tokenizer, reflector, reflect_tokenizer)
        assert (rollout.reflect_packed is not None) is on
        assert TwoPlayerRollout.from_args(args, policy, tokenizer).reflect_packed is None  # no reflector
