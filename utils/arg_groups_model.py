"""The flags' group of the models a run loads: the base model, the adapters to start from, LoRA and precision
(:class:`ModelArguments`; the other groups are in ``utils/arg_groups.py`` and ``utils/arg_groups_io.py``)."""

from dataclasses import dataclass
from typing import ClassVar, Literal

from utils.arg_fields import (
    FOUR_BIT,
    NEW_LORA,
    NO_CUDA,
    NO_LOAD_LIST,
    REFLECTOR,
    _arg,
    _at_least,
    _Group,
    _positive,
    need,
)

# why a policy with the label head (--shrink_head) cannot answer with commands: said by the flags' check and by
# rollout.PolicyScorer, handed a model that has one
LABEL_HEAD_WITH_COMMANDS = ("cannot be combined with --policy_answer=command: the commands' words are scored with "
                            "the full LM head")


@dataclass
class ModelArguments(_Group):
    """The models of a run: the base model, the adapters to start from, LoRA and precision."""

    TITLE: ClassVar[str] = "model, LoRA and precision"

    model_name: str = _arg(
        "gpt2-xl",
        "Base model: a Hugging Face hub id, a local model directory, a .gguf file (made into a float model "
        "folder once, in the cache; needs the gguf package), or 'tiny-gpt2' (built offline, random weights, for "
        "tests and the CPU demo).")
    load_dir: str | None = _arg(
        None,
        "Adapter directory of the policy to start from (an SFT checkpoint-N/). "
        "RL fine-tunes it; without it RL trains a new LoRA on the base model.", NO_LOAD_LIST)
    reflect_model_name: str | None = _arg(
        None, "Base model of the reflection model (default: --model_name).", only_with=REFLECTOR)
    reflect_load_dir: str | None = _arg(
        None,
        "Adapter directory of the frozen reflection model. Reflection is used iff this is given "
        "(unless --reflect says otherwise).", NO_LOAD_LIST, aliases=["--reflectload_dir"])
    use_peft: bool = _arg(True, "Train LoRA adapters (peft) instead of all weights.")
    peft_lora_r: int = _arg(64, "LoRA rank.", NEW_LORA, aliases=["--lora_r"])
    peft_lora_alpha: int = _arg(16, "LoRA alpha.", NEW_LORA, aliases=["--lora_alpha"])
    lora_dropout: float = _arg(0.1, "LoRA dropout.", NEW_LORA)
    lora_target_modules: list[str] | None = _arg(
        None, "Module names LoRA adapts (default: peft's choice for the architecture).", NEW_LORA)
    load_in_8bit: bool = _arg(
        True, "Load the base model in 8 bits (bitsandbytes; CUDA only, ignored on CPU).", aliases=["--use_8bit"])
    load_in_4bit: bool = _arg(False, "Load the base model in 4 bits (bitsandbytes; CUDA only).",
                              aliases=["--use_4bit"])
    bnb_4bit_quant_type: Literal["nf4", "fp4"] = _arg("nf4", "4-bit quantisation type (with --load_in_4bit).",
                                                      FOUR_BIT)
    bnb_4bit_compute_dtype: Literal["float16", "bfloat16", "float32"] | None = _arg(
        None, "Compute dtype of 4-bit layers (default: that of --bf16/--fp16).", FOUR_BIT)
    use_nested_quant: bool = _arg(False, "Quantise the 4-bit quantisation constants too (double quantisation).",
                                  FOUR_BIT)
    disable_dropout: bool = _arg(False, "Set every dropout of the trained model, LoRA's included, to 0.")
    bf16: bool = _arg(True, "Compute in bfloat16 (CUDA; on a CPU only with --cpu_bf16, else fp32).")
    cpu_bf16: bool = _arg(
        False, "Without CUDA, compute in bfloat16 on the CPU: about 2x faster forward passes where the CPU has "
        "native bf16 (AVX512-BF16, AMX), slower where it does not. Off: float32, the same numbers on every CPU.",
        NO_CUDA)
    fp16: bool = _arg(False, "Compute in float16 (CUDA only).")
    attn_implementation: Literal["auto", "sdpa", "eager"] = _arg(
        "auto", "Attention kernel (transformers' attn_implementation). auto: eager for a model trained in bfloat16 "
        "on a CPU, where torch's sdpa backward pass is about twice as slow (benchmarks/sft_step.py); elsewhere "
        "transformers' choice for the architecture (sdpa where it has it). The two compute the same attention, "
        "rounded differently.")
    contiguous_head: bool = _arg(
        True, "Give the LM head its rows as a contiguous tensor. transformers hands it a strided slice "
        "(hidden[:, -1:, :]) when only the last position's logits are wanted, and torch's matmul then copies the "
        "head's weight once per row of the batch: SmolLM2's first generation step at batch 16 took 4.7 s "
        "instead of 9 ms in bfloat16 on a CPU (benchmarks/rl_iteration.py). The same product, by another kernel "
        "(--no_contiguous_head: as transformers calls it).")
    adapter_autocast: bool = _arg(
        False, "Multiply LoRA adapters in the base model's bfloat16/float16 (torch.autocast), as the Trainer's mixed "
        "precision does in SFT; their weights, gradients and Adam states stay float32. peft keeps adapters in "
        "float32 and casts each layer's input up and its output back: a quarter of the time of an update pass of "
        "SmolLM2 in bfloat16 on a CPU (benchmarks/rl_iteration.py). Off by default: in RL with trained SmolLM2 "
        "checkpoints it did not pay (2.83 against 2.65 s per 1,000 tokens). Another arithmetic, as bf16 is; no "
        "effect on a float32 model (off: peft's float32 products).")
    gradient_checkpointing: bool = _arg(False, "Trade compute for memory in SFT and RL.")
    shrink_head: bool = _arg(
        False,
        "Replace the policy's LM head by one over the choice-label tokens only "
        "(rows copied from the model's head, frozen).")
    max_seq_length: int = _arg(
        1024, "Longest prompt in tokens; longer prompts are cut from the left.")
    policy_answer: Literal["label", "command"] = _arg(
        "label", "What the policy writes after the action marker: the label of its choice (the paper's) or the "
        "command that label stands for, scored word by word over the commands the menu shows (rollout/commands.py; "
        "SFT trains on the command's words). In SFT, RL, evaluation and label lookups alike.")

    def __post_init__(self) -> None:
        need(not (self.load_in_8bit and self.load_in_4bit), "load_in_4bit", "cannot be combined with --load_in_8bit")
        need(not (self.bf16 and self.fp16), "fp16", "cannot be combined with --bf16")
        need(not (self.shrink_head and self.policy_answer == "command"), "shrink_head", LABEL_HEAD_WITH_COMMANDS)
        _at_least(self, 1, "peft_lora_r")
        _at_least(self, 16, "max_seq_length")
        _positive(self, "peft_lora_alpha")
        need(0.0 <= self.lora_dropout < 1.0, "lora_dropout", f"must be in [0, 1), got {self.lora_dropout}")
        super().__post_init__()
