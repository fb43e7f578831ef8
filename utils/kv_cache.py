"""Key/value caches for the rollout's batched forward passes (the policy's scoring, the reflector's generation).

* **Shared prefix** (``--prefix_cache``): the prompts of one batch often begin alike (the reflector's
  instruction; an ALFWorld room and its task). :class:`PrefixKV` runs the longest prefix all rows share once,
  at batch 1, and gives every row that prefix's keys and values; each row's own part is fed after it,
  padded on its left (between the prefix and its tokens), its positions counted as if unpadded. The KV of
  a prefix is kept for later batches while the model's weights stay as they were (a frozen reflector: the
  whole run; the policy: until the learner's next step).
* **Static cache** (``--static_cache``, off by default: on a CPU it did not pay): the reflector's token-by-token generation writes its keys and values
  into tensors allocated once for the longest sequence (``transformers.StaticCache``) instead of growing them
  by concatenation at every token.

Neither changes a prompt or a decoding rule, but neither is bit-exact: the same numbers are summed in another
order, so log-probabilities move in their last bits (about 1e-5 on SmolLM2). ``benchmarks/rl_iteration.py``
reports whether the episodes' choices and reflections stayed the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, StaticCache

# A shared prefix shorter than this is not worth a forward pass of its own.
MIN_SHARED_TOKENS = 8
# Prefixes kept at once (the oldest goes first): one per distinct prompt head, few in any environment.
KEPT_PREFIXES = 16


def shared_length(ids: list[list[int]]) -> int:
    """Leading tokens every row has in common, leaving each row at least one token of its own."""
    if not ids:
        return 0
    limit = min(map(len, ids)) - 1
    first = ids[0]
    for n in range(max(limit, 0)):
        if any(row[n] != first[n] for row in ids[1:]):
            return n
    return max(limit, 0)


class WeightsWatch:
    """Tells whether a model's weights changed since the last look: each parameter's version counter,
    bumped by every in-place change (an optimiser step, a loaded state dict)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.seen = self._versions()

    def _versions(self) -> tuple[int, ...]:
        return tuple(p._version for p in self.model.parameters())

    def changed(self) -> bool:
        now = self._versions()
        changed, self.seen = now != self.seen, now
        return changed


class WeightsMemo(dict):
    """A dict of what a model computed, valid only at the weights it was filled under: :meth:`fresh` empties it
    where they changed since the last look (:class:`WeightsWatch`). The memos of a frozen player's answers and
    :class:`PrefixKV`'s prefixes are of this kind."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.watch = WeightsWatch(model)

    def fresh(self) -> WeightsMemo:
        """The memo itself, emptied first if the weights changed."""
        if self.watch.changed():
            self.clear()
        return self


@dataclass
class Prepared:
    """A batch laid out after a shared prefix (see :meth:`PrefixKV.prepare`)."""

    input_ids: torch.Tensor  # (B, P + W): the prefix, then each row's own tokens left-padded to W
    attention_mask: torch.Tensor  # (B, P + W): 0 on the padding between prefix and row
    position_ids: torch.Tensor  # (B, W): the own tokens' positions, counted from the prefix's first token
    cache: DynamicCache | StaticCache  # the prefix's keys and values, one copy per row
    prefix: int  # P
    tokens: int  # real tokens in the batch, prefix counted per row (as a full batch reads them)


class PrefixKV:
    """The keys and values of a batch's shared prompt prefix, computed at batch 1 and kept while the
    model's weights stay the same (:class:`WeightsMemo`)."""

    def __init__(self, model: torch.nn.Module, min_tokens: int = MIN_SHARED_TOKENS):
        self.model = model
        self.min_tokens = min_tokens
        self.kept = WeightsMemo(model)  # prefix ids -> its keys and values per layer, the newest last
        self.saved_tokens = 0  # prompt tokens not recomputed thanks to the prefix

    def prepare(self, ids: list[list[int]], pad_id: int, device, *, static_len: int | None = None) -> Prepared | None:
        """The batch laid out after its shared prefix, or None where the rows share fewer than ``min_tokens``
        (then the caller pads as usual). ``static_len``: a :class:`StaticCache` of that many positions
        (prefix, rows and the tokens still to generate) instead of a dynamic one."""
        shared = shared_length(ids)
        if shared < self.min_tokens:
            return None
        prefix = tuple(ids[0][:shared])
        kv = self._prefix_kv(prefix, device)
        rows = [row[shared:] for row in ids]
        width = max(map(len, rows))
        own = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows])
        own_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        mask = torch.cat([torch.ones(len(rows), shared, dtype=own_mask.dtype), own_mask], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        input_ids = torch.cat([torch.tensor([prefix] * len(rows)), own], dim=1)
        config = self.model.config
        cache = StaticCache(config=config, max_cache_len=static_len) if static_len else DynamicCache(config=config)
        for layer, (keys, values) in enumerate(kv):
            cache.update(keys.expand(len(rows), -1, -1, -1).contiguous(),
                         values.expand(len(rows), -1, -1, -1).contiguous(), layer)
        self.saved_tokens += shared * (len(rows) - 1)
        return Prepared(input_ids.to(device), mask.to(device), positions.to(device), cache, shared,
                        shared * len(rows) + int(own_mask.sum()))

    def _prefix_kv(self, prefix: tuple[int, ...], device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if prefix in self.kept.fresh():
            self.kept[prefix] = self.kept.pop(prefix)  # the newest again
            return self.kept[prefix]
        cache = DynamicCache(config=self.model.config)
        with torch.no_grad():
            self.model(input_ids=torch.tensor([prefix], device=device), cache=cache, use_cache=True,
                       logits_to_keep=1)
        kv = [(layer.keys, layer.values) for layer in cache.layers]
        self.kept[prefix] = kv
        while len(self.kept) > KEPT_PREFIXES:
            self.kept.pop(next(iter(self.kept)))
        return kv
