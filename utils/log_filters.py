"""Filters on loggers: each distinct message of a logger said once (:func:`say_once`: bitsandbytes' cast warning,
:data:`BNB_CAST_LOGGER`, and this project's own lines that a path would otherwise repeat at every call, such as a
CPU fallback), and transformers' unpadded-``generate`` warning dropped. Nothing here imports torch."""

import logging

# bitsandbytes' 8-bit layers log "MatMul8bitLt: inputs will be cast from torch.bfloat16 to float16 during
# quantization" at every product whose input is not float16: with the paper's defaults (8-bit weights, bf16
# compute) an RL iteration at GPT-2 XL's size logged it 27,520 times (an H200, 2026-11-28).
BNB_CAST_LOGGER = "bitsandbytes.autograd._functions"
ONCE_KEY = "said_once_key"  # a record's attribute: what makes it the same line as another (default: its text)


class _SaidOnce(logging.Filter):
    """Let each distinct message of a logger through once, and drop its repeats."""

    def __init__(self):
        super().__init__()
        self.said: set[str | tuple] = set()  # messages, or the keys given for them

    def filter(self, record: logging.LogRecord) -> bool:
        key = getattr(record, ONCE_KEY, None) or record.getMessage()
        if key in self.said:
            return False
        self.said.add(key)
        return True


def say_once(name: str, message: str | None = None, level: int = logging.WARNING, key: tuple | None = None) -> None:
    """Each distinct message of logger ``name`` is logged once per process (its repeats dropped); with ``message``,
    log it there at ``level`` (a fallback is said where it is taken first, not at every product). ``key``: what
    makes two lines the same, where their texts may differ (a checkpoint's warning, whichever flag named the folder)."""
    _filter_once(name, _SaidOnce)
    if message is not None:
        logging.getLogger(name).log(level, message, extra={ONCE_KEY: key} if key is not None else None)


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
