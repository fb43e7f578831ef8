"""Small shared helpers: seeding, THE model/tokenizer loader, the shrunk label head,
run directories, checkpoints and metric logging.

Every script loads models through :func:`load_model_and_tokenizer` and saves and
restores training state through :func:`save_checkpoint` / :func:`load_checkpoint`;
there is no other path.
"""

import contextlib
import fcntl
import json
import logging
import os
import random
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

from prompts import label_token_ids

logger = logging.getLogger(__name__)

TINY_MODEL = "tiny-gpt2"
SETTINGS_FILE = "setting.yml"
TRAINER_STATE_FILE = "trainer_state.pt"


# --- seeding --------------------------------------------------------------------------

def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) for a run's entry point."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def rng_state() -> dict:
    """The global generators' states, in a form ``torch.load(weights_only=True)`` accepts."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": _to_lists(random.getstate()),
        "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _to_lists(value):
    return [_to_lists(v) for v in value] if isinstance(value, tuple) else value


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


# --- the model/tokenizer loader ----------------------------------------------------------

def resolve_model_path(model_name: str) -> str:
    """A hub id or a local directory stays as it is; ``tiny-gpt2`` is built (once) and cached."""
    if model_name == TINY_MODEL:
        import tiny_gpt2

        return str(tiny_gpt2.tiny_gpt2_path())
    return model_name


def load_tokenizer(model_name: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model_name))
    tokenizer.padding_side = "left"
    tokenizer.pad_token = tokenizer.eos_token
    label_token_ids(tokenizer)  # fails early, listing the labels that are not one token
    return tokenizer


def load_model_and_tokenizer(
    args,
    *,
    model_name: str | None = None,
    adapter_dir: str | None = None,
    trainable: bool = True,
    shrink_head: bool = False,
):
    """Load a causal LM and its tokenizer: THE loader of every script.

    * ``model_name``: hub id, local directory or ``tiny-gpt2`` (default ``args.model_name``).
    * ``adapter_dir``: a checkpoint to start from, trainable or frozen as ``trainable`` says:
      a peft adapter (``adapter_config.json``), or a whole model saved by a run with
      ``--no_use_peft`` (``config.json``). Without one, a trainable model gets a new LoRA
      adapter (``args.use_peft``) or trains all its weights (``--no_use_peft``).
    * quantisation (``args.load_in_8bit``/``load_in_4bit``, CUDA only) and precision from ``args``.
    * the tokenizer pads on the left with EOS; every choice label must be one token.
    * ``shrink_head``: replace the LM head by the frozen label head (:func:`shrink_lm_head`).
    """
    from peft import LoraConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    from transformers.pytorch_utils import Conv1D
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model_name = model_name or args.model_name
    path = resolve_model_path(model_name)
    tokenizer = load_tokenizer(model_name)
    quantized = args.load_in_8bit or args.load_in_4bit
    kwargs: dict[str, Any] = {"dtype": compute_dtype(args)}
    if quantized:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_8bit=args.load_in_8bit,
            load_in_4bit=args.load_in_4bit,
            bnb_4bit_compute_dtype=compute_dtype(args),
        )
        kwargs["device_map"] = {"": device()}
    whole_model = adapter_dir is not None and _is_whole_model(adapter_dir)
    model = AutoModelForCausalLM.from_pretrained(adapter_dir if whole_model else path, **kwargs)
    if not quantized:
        model.to(device())
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.loss_type = "ForCausalLM"  # say it, or transformers warns that it guessed
    if trainable and quantized:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=args.gradient_checkpointing)
    elif trainable and args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()

    if adapter_dir is not None and not whole_model:
        if not (Path(adapter_dir) / "adapter_config.json").is_file():
            raise ValueError(f"{adapter_dir!r} is neither an adapter directory (adapter_config.json) nor a "
                             "saved model (config.json)")
        with _quiet_peft():
            model = PeftModel.from_pretrained(model, adapter_dir, is_trainable=trainable)
    elif trainable and args.use_peft and not whole_model:
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
    if not trainable:
        model.requires_grad_(False)
        model.eval()
    if shrink_head:
        shrink_lm_head(model, label_token_ids(tokenizer))
    return model, tokenizer


def _is_whole_model(directory: str) -> bool:
    files = Path(directory)
    return (files / "config.json").is_file() and not (files / "adapter_config.json").is_file()


@contextlib.contextmanager
def _quiet_peft():
    """peft still calls a transformers API deprecated in v5; its warning is not ours to fix."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())


# --- the shrunk label head ---------------------------------------------------------------

class LabelHead(nn.Module):
    """An LM head over the choice-label tokens only: rows copied from the full head, frozen.

    Its logits are exactly the full head's logits at the label tokens, in the order
    of :data:`prompts.LABELS`; the full head is kept so it can be switched back.
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


# --- run directories and settings -----------------------------------------------------------

@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_RUN_DIR = re.compile(r"(\d+)_(.+)")  # <id>_<script>


def run_dirs(root: str | Path, script: str | None = None) -> list[Path]:
    """The run directories under ``root`` (of ``script`` only, if given), in id order."""
    root = Path(root)
    found = [(int(m.group(1)), p) for p in (root.iterdir() if root.is_dir() else [])
             if (m := _RUN_DIR.fullmatch(p.name)) and script in (None, m.group(2))]
    return [path for _, path in sorted(found)]


def make_run_dir(args, script: str) -> Path:
    """Create ``<ckpt_path>/<id>_<script>/`` with the next free numeric id and save its settings.

    Ids are unique across scripts and safe when several runs start at once.
    """
    root = Path(args.ckpt_path)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".run_id.lock"):
        runs = run_dirs(root)
        last = int(_RUN_DIR.fullmatch(runs[-1].name).group(1)) if runs else 0
        run_dir = root / f"{last + 1}_{script}"
        run_dir.mkdir()
    save_settings(run_dir, args)
    return run_dir


def save_settings(directory: Path, args) -> None:
    """Write ``setting.yml``: the run's arguments, usable again as ``--config``."""
    header = "# " + " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) + "\n"
    settings = {k: v for k, v in args.to_dict().items() if k != "config"}
    _write_atomic(Path(directory) / SETTINGS_FILE, header + yaml.safe_dump(settings, sort_keys=False))


def load_settings(directory: str | Path) -> dict:
    path = Path(directory) / SETTINGS_FILE
    if not path.is_file():
        raise ValueError(f"{directory!r} has no {SETTINGS_FILE}")
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# --- checkpoints -------------------------------------------------------------------------------

def save_checkpoint(
    directory: str | Path,
    *,
    model: nn.Module,
    tokenizer,
    args,
    step: int,
    optimizer: torch.optim.Optimizer | None = None,
    state: dict | None = None,
    files: dict[str, str] | None = None,
) -> Path:
    """Save adapter (or model), tokenizer, settings, optimiser, RNG states, step and ``state``
    (plus any text ``files`` by name, e.g. episode logs).

    Written into a scratch folder and renamed into place, so a crash never leaves a
    half-written checkpoint behind.
    """
    directory = Path(directory)
    scratch = directory.with_name(f".{directory.name}.tmp{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    with full_head(model):
        model.save_pretrained(scratch)
    tokenizer.save_pretrained(scratch)
    save_settings(scratch, args)
    payload = {
        "step": step,
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "rng": rng_state(),
        "state": state or {},
    }
    torch.save(payload, scratch / TRAINER_STATE_FILE)
    for name, text in (files or {}).items():
        (scratch / name).write_text(text, encoding="utf-8")
    if directory.exists():
        old = directory.with_name(f".{directory.name}.old{os.getpid()}")
        os.rename(directory, old)
        os.rename(scratch, directory)
        shutil.rmtree(old)
    else:
        os.rename(scratch, directory)
    return directory


def load_checkpoint(
    directory: str | Path,
    optimizer: torch.optim.Optimizer | None = None,
    restore_rng: bool = True,
) -> dict:
    """Restore optimiser and RNG states saved by :func:`save_checkpoint`; return
    ``{"step": ..., "state": ...}``. The adapter itself is loaded by the loader."""
    path = Path(directory) / TRAINER_STATE_FILE
    if not path.is_file():
        raise ValueError(f"{directory!r} is not a training checkpoint (no {TRAINER_STATE_FILE})")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if optimizer is not None:
        if payload["optimizer"] is None:
            raise ValueError(f"{path} holds no optimiser state")
        optimizer.load_state_dict(payload["optimizer"])
    if restore_rng:
        set_rng_state(payload["rng"])
    return {"step": payload["step"], "state": payload["state"]}


# --- metric logging ------------------------------------------------------------------------------

class MetricLogger:
    """Append metrics to ``<run_dir>/metrics.jsonl`` and to TensorBoard (``<run_dir>/tb``)."""

    FILE = "metrics.jsonl"

    def __init__(self, run_dir: str | Path, tensorboard: bool = True):
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(run_dir) / self.FILE
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(Path(run_dir) / "tb"))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **metrics}
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if self._writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._writer.add_scalar(key, value, step)
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / MetricLogger.FILE
    if not path.is_file():
        raise ValueError(f"{run_dir!r} has no {MetricLogger.FILE}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
