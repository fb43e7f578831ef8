"""The loader on the architectures researchers bring (llama, qwen2, gemma ...): peft's default
LoRA targets, the label head over a non-paper alphabet, a tokenizer without a pad token, the
model's position limit. Small random models with the digit-splitting tokenizer, so it runs fast."""

import pytest
import torch

from envs import make_env
from prompts import policy_prompt
from rollout import PolicyScorer
from utils import lm_head, models

ARCHITECTURES = {
    "llama": "LlamaConfig",
    "qwen2": "Qwen2Config",
    "gemma": "GemmaConfig",
    "gemma2": "Gemma2Config",
    "mistral": "MistralConfig",
}


def _save_model(folder, digit_model, config_name: str, **extra):
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(digit_model)
    config = getattr(transformers, config_name)(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=1024, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id, **extra)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_lora_and_label_head_on_the_architecture(architecture, digit_model, make_args, tmp_path):
    path = _save_model(tmp_path / architecture, digit_model, ARCHITECTURES[architecture])
    args = make_args(model_name=path, max_seq_length=512)
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args), shrink_head=True)
    assert model.config.model_type == architecture
    assert tokenizer.pad_token == tokenizer.eos_token and tokenizer.model_max_length == 1024
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name and ("q_proj" in name or "v_proj" in name) for name in trainable)

    scorer = PolicyScorer(model, tokenizer, max_seq_length=512, temperature=1.0)
    env = make_env("taxi", labels=scorer.labels)
    obs, info = env.reset(seed=1)
    valid = [scorer.label_index[label] for label in info["labels"]]
    prompt = policy_prompt(obs, env.action_head)
    shrunk = scorer.logprobs([prompt], [valid]).logprobs
    with lm_head.full_head(model), torch.no_grad():
        full = scorer.logprobs([prompt], [valid]).logprobs
    torch.testing.assert_close(shrunk.detach(), full, atol=1e-5, rtol=1e-5)
    shrunk[0, valid[0]].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.requires_grad)


def test_an_architecture_without_default_lora_targets_names_the_flag(digit_model, make_args, tmp_path):
    path = _save_model(tmp_path / "phi3", digit_model, "Phi3Config", pad_token_id=None)
    with pytest.raises(ValueError, match="--lora_target_modules") as error:
        models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args(model_name=path, max_seq_length=512)))
    assert "phi3" in str(error.value) and "\n" not in str(error.value)
    model, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args(
        model_name=path, max_seq_length=512, lora_target_modules=["qkv_proj"])))
    assert any("lora_" in name for name, _ in model.named_parameters())


def test_max_seq_length_beyond_the_models_positions_is_refused(digit_model, make_args, tmp_path):
    path = _save_model(tmp_path / "llama", digit_model, "LlamaConfig")
    with pytest.raises(ValueError, match="--max_seq_length=2048 exceeds the 1024 positions"):
        models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args(model_name=path, max_seq_length=2048)))
