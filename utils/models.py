"""THE model/tokenizer loader of every script, and the shrunk label head.

Every script loads models through :func:`load_model_and_tokenizer`; there is no other
path. The policy may replace its LM head by a :class:`LabelHead` over the choice-label
tokens (``--shrink_head``); :func:`full_head` switches back for generation and saving.
"""

import contextlib
import functools
import logging
import os
import shutil
import tempfile
import types
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prompts import LABELS, check_label_file, label_alphabet, label_token_ids
from utils import cpu
from utils.errors import UsageError

logger = logging.getLogger(__name__)

TINY_MODEL = "tiny-gpt2"


# --- devices and precision ----------------------------------------------------------------

def device() -> torch.device:
    """This process's device: its CUDA device under ``accelerate``/torchrun, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def compute_dtype(args) -> torch.dtype:
    if args.bf16:
        return torch.bfloat16
    if args.fp16:
        return torch.float16
    return torch.float32


def say_compute(dtype: torch.dtype) -> None:
    """The line a command that loads a model starts with, once per process: its device and dtype, and on a CPU the
    capabilities that decide its speed (utils/cpu.py), with the cost of bfloat16 where the CPU emulates it."""
    where = device()
    name = torch.cuda.get_device_name(where) if where.type == "cuda" else ""
    level = logging.WARNING if dtype == torch.bfloat16 and where.type == "cpu" and cpu.cpu_native_bf16() is False \
        else logging.INFO
    cpu.say_once(cpu.compute_line(str(dtype).removeprefix("torch."), where.type, name), level)


def attention_kernel(args, trainable: bool) -> str | None:
    """``--attn_implementation``, with ``auto`` settled: eager for a model trained in bfloat16 on a CPU (torch's
    CPU sdpa is about twice as slow as eager attention in a bfloat16 backward pass), else None: transformers'
    own choice for the architecture (sdpa where it has it; Gemma2, say, has only eager)."""
    if args.attn_implementation != "auto":
        return args.attn_implementation
    cpu_bf16_training = trainable and compute_dtype(args) == torch.bfloat16 and device().type == "cpu"
    return "eager" if cpu_bf16_training else None


# --- the model/tokenizer loader ----------------------------------------------------------

def resolve_model_path(model_name: str) -> str:
    """Where ``from_pretrained`` finds ``model_name``.

    A local directory stays as it is; ``tiny-gpt2`` is built (once) and cached; a ``.gguf`` file is
    dequantised (once) into a float model folder in the cache; a hub id is :func:`hub_model`'s.
    """
    if model_name == TINY_MODEL:
        from utils import tiny_gpt2

        return str(tiny_gpt2.tiny_gpt2_path())
    if model_name.endswith(".gguf"):
        return str(gguf_folder(model_name))
    if Path(model_name).expanduser().is_dir():
        return model_name
    return hub_model(model_name)


HUB_PROBE_SECONDS = 3.0  # how long the hub may take to answer before it counts as out of reach


def hub_model(model_id: str) -> str:
    """``model_id`` as ``from_pretrained`` should get it: the id itself where the hub can be reached (it
    downloads what the cache lacks), else the model's folder in the local Hugging Face cache.

    Without the hub (``HF_HUB_OFFLINE`` set, or no answer within :data:`HUB_PROBE_SECONDS`) a model that is
    not in the cache is a ``UsageError`` at once, saying that nothing can be downloaded: transformers would
    otherwise retry for about a minute, then fail with a traceback. A name that is no hub id (a path that
    does not exist, say) is one too.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(model_id)
    except HFValidationError:
        raise UsageError(f"--model_name {model_id!r}: no such model folder (nor a Hugging Face hub id, "
                         "a .gguf file or tiny-gpt2)") from None
    if not constants.HF_HUB_OFFLINE and _hub_reachable(constants.ENDPOINT):
        return model_id
    try:
        return snapshot_download(model_id, local_files_only=True)
    except (OSError, ValueError):
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else f"{constants.ENDPOINT} cannot be reached"
        raise UsageError(f"--model_name {model_id!r}: not a local folder nor in the Hugging Face cache, and {why}: "
                         "nothing can be downloaded (give a local model folder, a .gguf file or tiny-gpt2, or "
                         "download the model where the hub can be reached)") from None


@functools.lru_cache(maxsize=4)
def _hub_reachable(endpoint: str) -> bool:
    """Whether the hub answers at all (any HTTP status) within :data:`HUB_PROBE_SECONDS`; asked once per process."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint, timeout=HUB_PROBE_SECONDS)
    except Exception:  # noqa: BLE001 - any failure to connect (DNS, refused, timeout, proxy) means out of reach
        return False
    return True


def gguf_folder(gguf_file: str | os.PathLike) -> Path:
    """The float model folder of a ``.gguf`` file, made on first use by transformers' GGUF loader
    (needs the ``gguf`` package) and kept in the cache under the file's content hash."""
    import transformers

    from utils.paths import cache_root

    source = Path(gguf_file).expanduser().resolve()
    if not source.is_file():
        raise UsageError(f"--model_name: no such GGUF file {str(gguf_file)!r}")
    stat = source.stat()
    key = f"{_file_digest(source, stat.st_size, stat.st_mtime_ns)}-transformers{transformers.__version__}"
    target = cache_root() / f"gguf-{source.stem}-{key}"
    if (target / "config.json").is_file():
        return target
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise UsageError(f"--model_name {str(gguf_file)!r}: reading a .gguf file needs the 'gguf' package "
                         "(pip install gguf)") from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("dequantising %s into %s (once)", source, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name).save_pretrained(scratch)
        model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
        if getattr(model, "hf_quantizer", None) is not None:  # the loader dequantised: the weights are floats
            model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(scratch)
        try:
            os.rename(scratch, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


@functools.lru_cache(maxsize=8)
def _file_digest(path: Path, size: int, mtime_ns: int) -> str:
    """:func:`paths.file_digest`, once per process while the file is unchanged."""
    from utils.paths import file_digest

    return file_digest(path)


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


def policy_labels(args) -> tuple[str, ...]:
    """The choice labels of ``args.model_name`` (what its environments must show). Its tokenizer is read once
    per process while its files stay as they are (a run asks again for each checkpoint it checks)."""
    if args.model_name.removeprefix("openai-community/").removeprefix("distilbert/") in GPT2_HUB_MODELS:
        return LABELS
    key = _tokenizer_files(args.model_name)
    if key not in _POLICY_LABELS:
        _POLICY_LABELS[key] = label_alphabet(load_tokenizer(args.model_name))
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
    args,
    *,
    model_name: str | None = None,
    adapter_dir: str | None = None,
    trainable: bool = True,
    shrink_head: bool = False,
):
    """Load a causal LM and its tokenizer: THE loader of every script.

    * ``model_name``: hub id, local directory, ``.gguf`` file or ``tiny-gpt2`` (default ``args.model_name``).
    * ``adapter_dir``: a checkpoint to start from, trainable or frozen as ``trainable`` says:
      a peft adapter (``adapter_config.json``), or a whole model saved by a run with
      ``--no_use_peft`` (``config.json``). Without one, a trainable model gets a new LoRA
      adapter (``args.use_peft``) or trains all its weights (``--no_use_peft``).
    * quantisation (``args.load_in_8bit``/``load_in_4bit``, CUDA only) and precision from ``args``.
    * the tokenizer pads on the left (:func:`load_tokenizer`); its choice labels
      (:func:`prompts.label_alphabet`) must be those the checkpoint was trained with.
    * ``shrink_head``: replace the LM head by the frozen label head (:func:`shrink_lm_head`).
    """
    from peft import LoraConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    from transformers.pytorch_utils import Conv1D
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    args.report_cpu_fallback()
    model_name = model_name or args.model_name
    path = resolve_model_path(model_name)
    tokenizer = load_tokenizer(model_name)
    quantized = args.load_in_8bit or args.load_in_4bit
    whole_model = adapter_dir is not None and _is_whole_model(adapter_dir)
    if trainable and quantized and (whole_model or (adapter_dir is None and not args.use_peft)):
        # bitsandbytes' 8/4-bit weights take no gradient: the run would train nothing
        raise UsageError(f"{'--load_in_8bit' if args.load_in_8bit else '--load_in_4bit'} cannot train every weight "
                         f"({'the whole model saved in ' + repr(adapter_dir) if whole_model else '--no_use_peft'}): "
                         "quantised weights take no gradient; add --no_load_in_8bit (and no --load_in_4bit), or "
                         "train a LoRA adapter (--use_peft)")
    kwargs: dict[str, Any] = {"dtype": compute_dtype(args)}
    say_compute(kwargs["dtype"])
    if attention := attention_kernel(args, trainable):
        kwargs["attn_implementation"] = attention
    if quantized:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_8bit=args.load_in_8bit,
            load_in_4bit=args.load_in_4bit,
            bnb_4bit_compute_dtype=getattr(torch, args.bnb_4bit_compute_dtype) if args.bnb_4bit_compute_dtype
            else compute_dtype(args),
            bnb_4bit_quant_type=args.bnb_4bit_quant_type,
            bnb_4bit_use_double_quant=args.use_nested_quant,
        )
        kwargs["device_map"] = {"": device()}
        say_once(BNB_CAST_LOGGER)
    model = AutoModelForCausalLM.from_pretrained(adapter_dir if whole_model else path, **kwargs)
    if not quantized:
        model.to(device())
    positions = _max_positions(model.config)
    if positions and args.max_seq_length > positions:
        raise UsageError(f"--max_seq_length={args.max_seq_length} exceeds the {positions} positions of "
                         f"model {model_name!r}")
    model.config.pad_token_id = tokenizer.pad_token_id
    # transformers picks the loss from the class name, which GPT2LMHeadModel does not match: say it,
    # or it warns "loss_type=None ... unrecognized" at the first labelled forward pass
    model.loss_type = "ForCausalLM"
    if trainable and quantized:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=args.gradient_checkpointing)
    elif trainable and args.gradient_checkpointing:
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
            with _quiet_peft():
                model = PeftModel.from_pretrained(model, adapter_dir, is_trainable=trainable)
        _check_finite_weights(model, adapter_dir, whole_model)
    elif trainable and args.use_peft:
        _check_lora_targets(model, args.lora_target_modules)
        config = LoraConfig(
            r=args.peft_lora_r,
            lora_alpha=args.peft_lora_alpha,
            lora_dropout=args.lora_dropout,
            target_modules=args.lora_target_modules,
            bias="none",
            task_type="CAUSAL_LM",
            fan_in_fan_out=any(isinstance(m, Conv1D) for m in model.modules()),
        )
        with _quiet_peft():
            model = get_peft_model(model, config)
    if args.disable_dropout:
        disable_dropout(model)
    if not trainable:
        model.requires_grad_(False)
        model.eval()
    if shrink_head:
        shrink_lm_head(model, label_token_ids(tokenizer))
    if args.contiguous_head:
        contiguous_head_input(model)
    if args.adapter_autocast:
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


def _contiguous_input(module: nn.Module, inputs: tuple) -> tuple:
    return (inputs[0].contiguous(), *inputs[1:])


def contiguous_head_input(model: nn.Module) -> None:
    """Make the LM head (and, under a label head, the full head :func:`full_head` puts back) read a contiguous
    copy of its input (``--contiguous_head``).

    With ``logits_to_keep``, transformers passes the head ``hidden[:, -1:, :]``, a strided view. torch's
    ``matmul`` cannot fold such a 3-D input into one matrix product: it broadcasts the head's weight to every
    row of the batch and copies it (batch x vocabulary x hidden values, 906 MB for SmolLM2 at batch 16 in
    bfloat16) before a batched product. A contiguous input takes the single matrix product."""
    head = base_model(model).get_output_embeddings()
    heads = [head, head.full_head] if isinstance(head, LabelHead) else [head]
    for module in heads:
        if module is not None and not getattr(module, "_contiguous_input", False):
            module.register_forward_pre_hook(_contiguous_input)
            module._contiguous_input = True


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


def _is_whole_model(directory: str) -> bool:
    files = Path(directory)
    return (files / "config.json").is_file() and not (files / "adapter_config.json").is_file()


@contextlib.contextmanager
def _quiet_peft():
    """peft still calls a transformers API deprecated in v5; its warning is not ours to fix."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


# --- the shrunk label head ---------------------------------------------------------------

class LabelHead(nn.Module):
    """An LM head over the choice-label tokens only: rows copied from the full head, frozen.

    Its logits are exactly the full head's logits at the label tokens, in the order
    of the tokenizer's :func:`prompts.label_alphabet`; the full head is kept so it can be switched back.
    """

    def __init__(self, full_head: nn.Linear, token_ids: list[int]):
        super().__init__()
        index = torch.tensor(token_ids, device=full_head.weight.device)
        self.register_buffer("label_weight", full_head.weight.detach()[index].clone(), persistent=False)
        bias = full_head.bias.detach()[index].clone() if full_head.bias is not None else None
        self.register_buffer("label_bias", bias, persistent=False)
        self.token_ids = list(token_ids)
        self._full_head = (full_head,)  # a tuple, so it is not registered as a submodule

    @property
    def full_head(self) -> nn.Linear:
        return self._full_head[0]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        bias = None if self.label_bias is None else self.label_bias.to(hidden.dtype)
        return nn.functional.linear(hidden, self.label_weight.to(hidden.dtype), bias)


def base_model(model: nn.Module) -> nn.Module:
    """The transformers model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def shrink_lm_head(model: nn.Module, token_ids: list[int]) -> LabelHead:
    base = base_model(model)
    head = base.get_output_embeddings()
    if isinstance(head, LabelHead):
        return head
    if head.weight.requires_grad:
        # Training all weights (--no_use_peft): the head rows are a frozen copy, so the
        # embedding matrix tied to them must stay frozen too, or a saved and reloaded
        # model would no longer score labels as it did in training.
        head.weight.requires_grad_(False)
        logger.info("label head: the output/embedding matrix is frozen; the other weights train")
    label_head = LabelHead(head, token_ids)
    base.set_output_embeddings(label_head)
    return label_head


def label_head(model: nn.Module) -> LabelHead | None:
    """The model's label head if its head is shrunk, else None."""
    head = base_model(model).get_output_embeddings()
    return head if isinstance(head, LabelHead) else None


@contextlib.contextmanager
def full_head(model: nn.Module):
    """Temporarily put the full LM head back (for generation, or saving a full model)."""
    base = base_model(model)
    shrunk = label_head(model)
    if shrunk is None:
        yield model
        return
    base.set_output_embeddings(shrunk.full_head)
    try:
        yield model
    finally:
        base.set_output_embeddings(shrunk)


# bitsandbytes' 8-bit layers log "MatMul8bitLt: inputs will be cast from torch.bfloat16 to float16 during
# quantization" at every product whose input is not float16: with the paper's defaults (8-bit weights, bf16
# compute) an RL iteration at GPT-2 XL's size logged it 27,520 times (an H200, 2026-11-28).
BNB_CAST_LOGGER = "bitsandbytes.autograd._functions"


class _SaidOnce(logging.Filter):
    """Let each distinct message of a logger through once, and drop its repeats."""

    def __init__(self):
        super().__init__()
        self.said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.said:
            return False
        self.said.add(message)
        return True


def say_once(name: str) -> None:
    """Each distinct message of logger ``name`` is logged once per process."""
    _filter_once(name, _SaidOnce)


def _filter_once(name: str, kind: type[logging.Filter]) -> None:
    """Put a ``kind`` filter on logger ``name``, unless it has one."""
    target = logging.getLogger(name)
    if not any(isinstance(f, kind) for f in target.filters):
        target.addFilter(kind())


class _UnpaddedGenerateWarning(logging.Filter):
    """Drop transformers' "strongly recommend passing in an `attention_mask`" line for our ``generate``.

    We always pass the mask. When a batch needs no padding, ``generate`` drops the all-ones mask
    itself, and once a row has finished it is filled with the pad (= eos) token, which makes
    GPT-2 warn although nothing attends to padding.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "passing in an `attention_mask`" not in record.getMessage()


def silence_unpadded_generate_warning() -> None:
    """Install the filter once (by the first rollout, not at import)."""
    _filter_once("transformers.modeling_utils", _UnpaddedGenerateWarning)
