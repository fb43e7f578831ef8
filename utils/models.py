"""THE model/tokenizer loader of every script, with the device and precision it loads in.

Every script loads models through :func:`load_model_and_tokenizer`; there is no other
path. Where a ``--model_name`` is found is ``utils/model_paths.py``'s; the policy's label head
(``--shrink_head``) and the full head put back are ``utils/lm_head.py``'s.
"""

import contextlib
import logging
import os
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prompts import LABELS, check_label_file, label_alphabet, label_token_ids
from utils import complete, cpu
from utils.arg_fields import flag_values
from utils.errors import UsageError
from utils.lm_head import contiguous_head_input, shrink_lm_head
from utils.log_filters import BNB_CAST_LOGGER, say_once
from utils.model_paths import TINY_MODEL, resolve_model_path


def _nothing_to_say() -> None:
    pass


@dataclass(frozen=True)
class ModelSettings:
    """All the loader reads of the flags, given to it explicitly (:meth:`from_args`): the base model, the new
    LoRA adapter, quantisation and precision, and what it changes in a loaded model."""

    model_name: str
    use_peft: bool
    peft_lora_r: int
    peft_lora_alpha: int
    lora_dropout: float
    lora_target_modules: tuple[str, ...] | None
    load_in_8bit: bool
    load_in_4bit: bool
    bnb_4bit_quant_type: str
    bnb_4bit_compute_dtype: str | None
    use_nested_quant: bool
    bf16: bool
    fp16: bool
    attn_implementation: str
    gradient_checkpointing: bool
    max_seq_length: int
    disable_dropout: bool
    contiguous_head: bool
    adapter_autocast: bool
    # The parsed flags' note that the GPU defaults were turned off on this CPU-only machine
    # (ScriptArguments.report_cpu_fallback): said when a model is loaded, so a step that only calls an API stays quiet.
    report_cpu_fallback: Callable[[], None] = field(default=_nothing_to_say, compare=False, repr=False)

    @classmethod
    def from_args(cls, args) -> "ModelSettings":
        return cls(**flag_values(cls, args))


# --- devices and precision ----------------------------------------------------------------

def device() -> torch.device:
    """This process's device: its CUDA device under ``accelerate``/torchrun, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def compute_dtype(settings: ModelSettings) -> torch.dtype:
    if settings.bf16:
        return torch.bfloat16
    if settings.fp16:
        return torch.float16
    return torch.float32


def activation_dtype(model) -> torch.dtype:
    """The dtype a loaded model's hidden states flow in (its :func:`compute_dtype`): its input embeddings'. Not its
    first parameter's, which can be a float32 adapter weight beside a bfloat16 base (peft keeps LoRA in float32)."""
    return model.get_input_embeddings().weight.dtype


def say_compute(dtype: torch.dtype) -> None:
    """The line a command that loads a model starts with, once per process: its device and dtype, and on a CPU the
    capabilities that decide its speed (utils/cpu.py), with the cost of bfloat16 where the CPU emulates it."""
    where = device()
    name = torch.cuda.get_device_name(where) if where.type == "cuda" else ""
    level = logging.WARNING if dtype == torch.bfloat16 and where.type == "cpu" and cpu.cpu_native_bf16() is False \
        else logging.INFO
    say_once(__name__, cpu.compute_line(str(dtype).removeprefix("torch."), where.type, name), level)


def attention_kernel(settings: ModelSettings, trainable: bool) -> str | None:
    """``--attn_implementation``, with ``auto`` settled: eager for a model trained in bfloat16 on a CPU (torch's
    CPU sdpa is about twice as slow as eager attention in a bfloat16 backward pass), else None: transformers'
    own choice for the architecture (sdpa where it has it; Gemma2, say, has only eager)."""
    if settings.attn_implementation != "auto":
        return settings.attn_implementation
    cpu_bf16_training = trainable and compute_dtype(settings) == torch.bfloat16 and device().type == "cpu"
    return "eager" if cpu_bf16_training else None


# --- the model/tokenizer loader ----------------------------------------------------------

def load_tokenizer(model_name: str):
    """The tokenizer of ``model_name``: left padding (EOS pads where it has no pad token),
    ``model_max_length`` capped at the model's positions, and its choice labels checked."""
    from transformers import AutoConfig, AutoTokenizer

    path = resolve_model_path(model_name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        config = AutoConfig.from_pretrained(path)
    except OSError as error:  # a folder without a model's files, a gated or unknown hub id ...
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"--model_name {model_name!r}: cannot load its tokenizer ({first})") from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise UsageError(f"--model_name {model_name!r}: its tokenizer has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    positions = _max_positions(config)
    if positions:
        tokenizer.model_max_length = min(tokenizer.model_max_length, positions)
    label_alphabet(tokenizer)  # fails early, one line, if the tokenizer has too few single-token labels
    return tokenizer


# The GPT-2 checkpoints on the hub share one byte-level BPE that keeps each of the paper's labels
# one token after the action marker (checked against its merge ranks), so their labels are known
# without fetching the tokenizer: the paper's data steps run offline with the default --model_name.
GPT2_HUB_MODELS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2")


def policy_labels(model_name: str) -> tuple[str, ...]:
    """The choice labels of ``model_name`` (what its environments must show). Its tokenizer is read once
    per process while its files stay as they are (a run asks again for each checkpoint it checks)."""
    if model_name.removeprefix("openai-community/").removeprefix("distilbert/") in GPT2_HUB_MODELS:
        return LABELS
    key = _tokenizer_files(model_name)
    if key not in _POLICY_LABELS:
        _POLICY_LABELS[key] = label_alphabet(load_tokenizer(model_name))
    return _POLICY_LABELS[key]


_POLICY_LABELS: dict[tuple, tuple[str, ...]] = {}


def _tokenizer_files(model_name: str) -> tuple:
    """What a model's tokenizer is read from: its folder and each file's name, size and modification time
    (a hub id: the id, without probing the hub again)."""
    if not (model_name == TINY_MODEL or model_name.endswith(".gguf") or Path(model_name).expanduser().is_dir()):
        return (model_name,)
    folder = Path(resolve_model_path(model_name)).expanduser().resolve()
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file())
    return (str(folder), *files)


def _max_positions(config) -> int | None:
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def load_model_and_tokenizer(
    settings: ModelSettings,
    *,
    model_name: str | None = None,
    adapter_dir: str | None = None,
    trainable: bool = True,
    shrink_head: bool = False,
):
    """Load a causal LM and its tokenizer: THE loader of every script.

    * ``model_name``: hub id, local directory, ``.gguf`` file or ``tiny-gpt2`` (default ``settings.model_name``).
    * ``adapter_dir``: a checkpoint to start from, trainable or frozen as ``trainable`` says:
      a peft adapter (``adapter_config.json``), or a whole model saved by a run with
      ``--no_use_peft`` (``config.json``). Without one, a trainable model gets a new LoRA
      adapter (``--use_peft``) or trains all its weights (``--no_use_peft``).
    * quantisation (``--load_in_8bit``/``--load_in_4bit``, CUDA only) and precision from ``settings``.
    * the tokenizer pads on the left (:func:`load_tokenizer`); its choice labels
      (:func:`prompts.label_alphabet`) must be those the checkpoint was trained with.
    * ``shrink_head``: replace the LM head by the frozen label head (:func:`shrink_lm_head`).
    """
    from peft import LoraConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    from transformers.pytorch_utils import Conv1D
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    settings.report_cpu_fallback()
    model_name = model_name or settings.model_name
    path = resolve_model_path(model_name)
    tokenizer = load_tokenizer(model_name)
    quantized = settings.load_in_8bit or settings.load_in_4bit
    if adapter_dir is not None and (torn := complete.problems(adapter_dir)[0]):
        raise UsageError(f"checkpoint {str(adapter_dir)!r} {torn[0]}")  # before peft could look for it on the hub
    whole_model = adapter_dir is not None and _is_whole_model(adapter_dir)
    if trainable and quantized and (whole_model or (adapter_dir is None and not settings.use_peft)):
        # bitsandbytes' 8/4-bit weights take no gradient: the run would train nothing
        raise UsageError(f"{'--load_in_8bit' if settings.load_in_8bit else '--load_in_4bit'} cannot train every weight "
                         f"({'the whole model saved in ' + repr(adapter_dir) if whole_model else '--no_use_peft'}): "
                         "quantised weights take no gradient; add --no_load_in_8bit (and no --load_in_4bit), or "
                         "train a LoRA adapter (--use_peft)")
    kwargs: dict[str, Any] = {"dtype": compute_dtype(settings)}
    say_compute(kwargs["dtype"])
    if attention := attention_kernel(settings, trainable):
        kwargs["attn_implementation"] = attention
    if quantized:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_8bit=settings.load_in_8bit,
            load_in_4bit=settings.load_in_4bit,
            bnb_4bit_compute_dtype=getattr(torch, settings.bnb_4bit_compute_dtype) if settings.bnb_4bit_compute_dtype
            else compute_dtype(settings),
            bnb_4bit_quant_type=settings.bnb_4bit_quant_type,
            bnb_4bit_use_double_quant=settings.use_nested_quant,
        )
        kwargs["device_map"] = {"": device()}
        say_once(BNB_CAST_LOGGER)
    with _damaged_weights(adapter_dir if whole_model else None):
        model = AutoModelForCausalLM.from_pretrained(adapter_dir if whole_model else path, **kwargs)
    if not quantized:
        model.to(device())
    positions = _max_positions(model.config)
    if positions and settings.max_seq_length > positions:
        raise UsageError(f"--max_seq_length={settings.max_seq_length} exceeds the {positions} positions of "
                         f"model {model_name!r}")
    model.config.pad_token_id = tokenizer.pad_token_id
    # transformers picks the loss from the class name, which GPT2LMHeadModel does not match: say it,
    # or it warns "loss_type=None ... unrecognized" at the first labelled forward pass
    model.loss_type = "ForCausalLM"
    if trainable and quantized:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=settings.gradient_checkpointing)
    elif trainable and settings.gradient_checkpointing:
        # transformers 5.x renamed it (the old name warns); earlier 5.x releases have only the old one
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
        model.enable_input_require_grads()

    if adapter_dir is not None:
        check_label_file(adapter_dir, label_alphabet(tokenizer), model_name, "checkpoint")
    if adapter_dir is not None:
        if not whole_model:
            if not (Path(adapter_dir) / "adapter_config.json").is_file():
                raise ValueError(f"{adapter_dir!r} is neither an adapter directory (adapter_config.json) nor a "
                                 "saved model (config.json)")
            with _quiet_peft(), _damaged_weights(adapter_dir):
                model = PeftModel.from_pretrained(model, adapter_dir, is_trainable=trainable)
        _check_finite_weights(model, adapter_dir, whole_model)
    elif trainable and settings.use_peft:
        _check_lora_targets(model, settings.lora_target_modules)
        config = LoraConfig(
            r=settings.peft_lora_r,
            lora_alpha=settings.peft_lora_alpha,
            lora_dropout=settings.lora_dropout,
            target_modules=None if settings.lora_target_modules is None else list(settings.lora_target_modules),
            bias="none",
            task_type="CAUSAL_LM",
            fan_in_fan_out=any(isinstance(m, Conv1D) for m in model.modules()),
        )
        with _quiet_peft():
            model = get_peft_model(model, config)
    if settings.disable_dropout:
        disable_dropout(model)
    if not trainable:
        model.requires_grad_(False)
        model.eval()
    if shrink_head:
        shrink_lm_head(model, label_token_ids(tokenizer))
    if settings.contiguous_head:
        contiguous_head_input(model)
    if settings.adapter_autocast:
        autocast_adapters(model)
    return model, tokenizer


def _check_finite_weights(model: nn.Module, checkpoint: str, whole_model: bool) -> None:
    """A checkpoint's weights (its adapter's, or every weight of a whole model) must be finite: one that holds a
    NaN or an infinity (a run that diverged before SFT and RL skipped such steps, or another tool's) would play
    NaN log-probabilities, so it is refused in one line naming it."""
    bad = [name for name, p in model.named_parameters()
           if (whole_model or "lora_" in name) and p.is_floating_point() and not bool(torch.isfinite(p).all())]
    if bad:
        raise UsageError(f"checkpoint {checkpoint}: {len(bad)} of its weight tensors hold NaN or infinity (e.g. "
                         f"{bad[0]}): the run that saved it diverged; take an earlier checkpoint, or train again "
                         "(e.g. with a lower --learning_rate)")


def autocast_adapters(model: nn.Module) -> int:
    """Make each LoRA layer over a bfloat16/float16 base layer multiply its adapter in that dtype under
    ``torch.autocast`` (``--adapter_autocast``). Returns how many layers were changed.

    peft keeps adapter weights in float32 over a half-precision base and casts each layer's input up to
    float32, multiplies, adds the result to the base layer's and casts the sum back. Under autocast the two
    small products run in the base's dtype on the float32 weights, as mixed-precision training does (the
    Trainer's in SFT): the weights, their gradients and the optimiser's states stay float32. The base layer's
    own product is unchanged (its weights and input are already in that dtype)."""
    from peft.tuners.lora import Linear as LoraLinear

    changed = 0
    for module in model.modules():
        if not isinstance(module, LoraLinear) or getattr(module, "_autocast", False):
            continue
        weight = getattr(module.get_base_layer(), "weight", None)
        if weight is None or weight.dtype not in (torch.bfloat16, torch.float16):
            continue  # float32 (nothing to gain) or quantised (bitsandbytes' layers compute their own way)
        module.cast_input_dtype_enabled = False  # autocast casts the weights to the input's dtype instead
        module.forward = types.MethodType(_forward_under_autocast, module)  # a copied model rebinds it
        module._autocast = True
        changed += 1
    return changed


def _forward_under_autocast(layer: nn.Module, *args, **kwargs):
    """A LoRA layer's own forward under autocast to its base weights' dtype, on their device."""
    weight = layer.get_base_layer().weight
    with torch.autocast(weight.device.type, dtype=weight.dtype):
        return type(layer).forward(layer, *args, **kwargs)


def disable_dropout(model: nn.Module) -> int:
    """Set every dropout of ``model`` (the base model's and LoRA's) to p = 0 (``--disable_dropout``, the
    paper's flag): training then sees the same network as sampling. Returns how many were changed."""
    changed = 0
    for module in model.modules():
        if isinstance(module, nn.Dropout) and module.p > 0:
            module.p = 0.0
            changed += 1
    return changed


def finite_gradients(params) -> bool:
    """Whether every gradient of ``params`` that is set is finite (no NaN, no infinity): the test by which RL's
    learners and SFT skip an optimiser step whose loss or gradient overflowed."""
    return all(bool(torch.isfinite(p.grad).all()) for p in params if p.grad is not None)


def _check_lora_targets(model, target_modules) -> None:
    """peft picks LoRA targets per architecture; for one it does not know, ask for the flag."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    kind = model.config.model_type
    if target_modules is None and kind not in DEFAULTS:
        linear = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise UsageError(f"--lora_target_modules: peft has no default LoRA targets for the architecture {kind!r}; "
                         f"name them, e.g. --lora_target_modules {' '.join(linear[:4])} (its linear layers: {linear})")


@contextlib.contextmanager
def _damaged_weights(checkpoint: str | None):
    """Inside, weights of ``checkpoint`` that cannot be read (a file overwritten, or truncated before checkpoints
    carried sizes: safetensors' and torch's readers name no file) stop the run in one line naming the file."""
    from safetensors import SafetensorError

    try:
        yield
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        if checkpoint is None or isinstance(error, UsageError):
            raise
        names = [name for names in complete.WEIGHTS.values() for name in names if (Path(checkpoint) / name).is_file()]
        raise UsageError(f"checkpoint {checkpoint!r}: its {' or '.join(names) or 'weights'} cannot be read, it is "
                         f"damaged ({type(error).__name__}: {' '.join(str(error).split())[:160]}); take another "
                         "checkpoint") from None


def _is_whole_model(directory: str) -> bool:
    files = Path(directory)
    return (files / "config.json").is_file() and not (files / "adapter_config.json").is_file()


@contextlib.contextmanager
def _quiet_peft():
    """peft still calls a transformers API deprecated in v5; its warning is not ours to fix."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield
