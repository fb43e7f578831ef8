"""What a column's recipe for a pretrained model (``demo.py --model_name``) shares with the others: LoRA over the
frozen base (the paper's r 64, alpha 16), in the dtype this machine computes fastest.

bfloat16 where the CPU computes it natively (``avx512_bf16``, ``amx_bf16``: utils/cpu.py); elsewhere it is emulated,
several times slower than float32, so float32 there, and the recipe says so before it starts (``Recipe.notice``). On
CUDA, bfloat16 without the paper's 8-bit base: the same base weights as on a CPU, so the machines' rows compare."""

from utils.arg_groups import cuda_available
from utils.cpu import cpu_native_bf16

LORA = ("--use_peft", "--lora_r=64", "--lora_alpha=16")  # the paper's adapter
# What a recipe's notice (``Recipe.notice``) says first where it computes in float32 (:func:`in_float32`); each recipe
# adds what that costs it, as measured.
FLOAT32 = ("no native bfloat16 found on this CPU (avx512_bf16 or amx_bf16, as oneDNN sees it: utils/cpu.py), so the "
           "recipe computes in float32, several times slower than in the bfloat16 it was timed in")


def lora_model(model_name: str, *flags: str) -> tuple[str, ...]:
    """The model flags of every stage: ``model_name`` under the paper's LoRA adapter, bfloat16 where this machine
    computes it natively (a CPU with it, or CUDA in place of the paper's 8 bits), and ``flags`` of the recipe's own."""
    return ("--model_name=" + model_name, *LORA, *(("--cpu_bf16",) if cpu_native_bf16() else ()),
            *(("--no_load_in_8bit",) if cuda_available() else ()), *flags)


def in_float32() -> bool:
    """Whether the recipe computes in float32 here (a CPU without native bfloat16, and no GPU): slower than the
    bfloat16 its times were measured in, which its notice says."""
    return not (cuda_available() or cpu_native_bf16())
