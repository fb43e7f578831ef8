"""A frozen model's linear layers multiplied with their weights laid out once for oneDNN (``--packed_weights``).

On a CPU, torch's matrix product hands each weight to oneDNN in the layout it computes in, and lays it out
again at every call. A reflector's drafted passes hold a few rows each (a few episodes by a few guessed
tokens), so that reordering costs as much as the product itself: a bfloat16 layer of SmolLM2 (576 x 1,536)
took 89 us for 5 rows through ``nn.functional.linear`` and 48 us with the weight laid out beforehand, its LM
head (49,152 x 576) 5.5 ms and 2.3 ms; at 2,400 rows the two are within 5% (a 2-core EPYC with
``avx512_bf16``). :class:`PackedWeights` keeps such a copy of every plain ``nn.Linear`` (and GPT-2's
``Conv1D``) weight, made on first use and made again when the model's weights change (their version counters,
:class:`utils.kv_cache.WeightsWatch`), and routes the layers through it while its context is open.

In bfloat16 the packed product is oneDNN's own kernel on the same numbers: the same logits, bit for bit, on a
CPU that computes bfloat16 natively (``tests/test_packed_weights.py``). In float32 torch's product runs another
library's kernel, so the logits differ by rounding (about 1e-4 on SmolLM2) and a greedy reflection can differ
where two top logits nearly tie. The price is a second copy of the layers' weights in memory. No gradient
flows through a packed layer: it is for frozen models under ``torch.no_grad``, on the CPU.

oneDNN packs bfloat16 weights only where it has bfloat16 kernels (AVX-512 BW/VL/DQ or AVX-NE-CONVERT, as torch's
own check says, under any ``ONEDNN_MAX_CPU_ISA`` cap): elsewhere (an AVX2-only CPU) the bfloat16 layers keep torch's
product, said once, and float32 layers are packed as anywhere.
"""

from __future__ import annotations

import contextlib
import functools
import weakref

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from utils import cpu
from utils.kv_cache import WeightsWatch
from utils.log_filters import say_once

DTYPES = (torch.bfloat16, torch.float32)


def available() -> bool:
    """Whether this torch build has oneDNN's packed linear product (x86 and ARM CPU builds do)."""
    mkldnn = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise"))


@functools.cache
def bf16_packable() -> bool:
    """Whether oneDNN packs bfloat16 weights on this CPU (torch's own check, which follows ``ONEDNN_MAX_CPU_ISA``);
    where it does not, its reorder raises "bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and
    avx512dq". Asked once per process (oneDNN reads its cap once), not at every reflection."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _matrix(layer: nn.Module) -> torch.Tensor:
    """The layer's weight as (out, in), the layout ``nn.Linear`` keeps (GPT-2's ``Conv1D`` keeps (in, out))."""
    weight = layer.weight.detach()
    return weight.t().contiguous() if isinstance(layer, Conv1D) else weight


def packable(layer: nn.Module) -> bool:
    """A plain linear layer (not a quantised or adapter subclass) with a frozen CPU weight of a packable dtype."""
    if type(layer) not in (nn.Linear, Conv1D) or "forward" in vars(layer):  # another wrapper owns its forward
        return False
    weight = layer.weight
    return weight.device.type == "cpu" and weight.dtype in DTYPES and not weight.requires_grad


def packed_here(layers: list[nn.Module]) -> list[nn.Module]:
    """The :func:`packable` layers this CPU packs: all of them, or, where oneDNN has no bfloat16 kernels, the
    float32 ones (the fallback said once per process)."""
    kept = [layer for layer in layers if layer.weight.dtype != torch.bfloat16]
    if len(kept) == len(layers) or bf16_packable():
        return layers
    say_once(__name__, f"packed weights: bfloat16 needs oneDNN's AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT kernels "
                       f"(this CPU: {cpu.caps().describe()}); the bfloat16 layers use torch's product")
    return kept


def _reorder(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` laid out once for oneDNN's product."""
    return torch.ops.mkldnn._reorder_linear_weight(weight)


def _packed_forward(layer: nn.Module, packed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if (x.dtype != packed.dtype or x.device.type != "cpu" or torch.is_autocast_enabled("cpu")
            or torch.is_grad_enabled() and x.requires_grad):
        return type(layer).forward(layer, x)  # anything else (autocast's dtype, a graph) takes the layer's own product
    return torch.ops.mkldnn._linear_pointwise(x, packed, layer.bias, "none", [], "")


class PackedWeights:
    """Packed copies of a frozen model's linear weights, used by its layers inside :meth:`active`."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.watch = WeightsWatch(model)
        self.packed: weakref.WeakKeyDictionary[nn.Module, torch.Tensor] = weakref.WeakKeyDictionary()

    @contextlib.contextmanager
    def active(self):
        """Route every packable layer of the model (as it is now: a swapped-in head included) through its
        packed weight; the layers compute as before once the context closes."""
        if self.watch.changed():
            self.packed.clear()  # the weights moved: every copy is stale
        layers = packed_here([layer for layer in self.model.modules() if packable(layer)])
        for layer in layers:
            if layer not in self.packed:
                self.packed[layer] = _reorder(_matrix(layer))
            layer.forward = functools.partial(_packed_forward, layer, self.packed[layer])
        try:
            yield self.model
        finally:
            for layer in layers:
                del layer.forward
