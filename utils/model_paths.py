"""Where a ``--model_name`` is found: a local folder as it is, ``tiny-gpt2`` built once (utils/tiny_gpt2.py), a
``.gguf`` file dequantised once into a float model folder in the cache, a hub id through the hub or, without it,
the local Hugging Face cache (:func:`resolve_model_path`)."""

import functools
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from utils.errors import UsageError

logger = logging.getLogger(__name__)

TINY_MODEL = "tiny-gpt2"


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


def canonical_model_name(model_name: str) -> str:
    """``model_name`` spelt one way whatever the caller's spelling: a local file or folder (a ``.gguf`` file, a
    model folder) as its absolute path with links resolved, anything else (``tiny-gpt2``, a hub id) as given. What
    a run is keyed by (the demo's stages, a seed's settings) names a model this way, so ``.venv/x.gguf`` and
    ``/repo/.venv/x.gguf`` are one model, not a changed setting that trains everything again."""
    if model_name == TINY_MODEL:
        return model_name
    local = Path(model_name).expanduser()
    return str(local.resolve()) if local.exists() else model_name


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
