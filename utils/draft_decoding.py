"""Greedy generation that checks guessed tokens in one forward pass: batched prompt-lookup decoding.

A reflector writes much the same text from one step of an episode to the next ("The passenger is north;
head north."), and repeats itself within a text, so much of a reflection can be guessed before it is
generated. A row's **draft** is what followed, in its *source* (the prompt's last tokens, the row's previous
reflection, then the text generated so far), the first occurrence of the row's last tokens (the longest
match of at most :data:`MAX_NGRAM`). One forward pass feeds every row's last token and its draft; the
model's argmax after each fed token says which drafted tokens it would itself have generated: those are
accepted, with the token the model gives after the last accepted one. A pass thus yields between 1 and
``draft_tokens + 1`` tokens a row, where token-by-token decoding yields 1.

Rejected draft tokens stay in the key/value cache, masked out of every later query (a 0 in the attention
mask); each accepted token's position continues from its row's last real token. So every token sees the
tokens and positions it would see decoding one at a time, and rows that stop leave the batch.

The text is greedy decoding's (``generate`` with ``do_sample=False``) except where the argmax moves with
rounding: a pass over several tokens multiplies matrices of other shapes, which sum in another order, so two
near-equal top logits may swap. ``tests/test_draft_decoding.py`` checks the text against ``generate``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_NGRAM = 3  # the longest run of a row's last tokens looked up in its source


@dataclass
class DraftStats:
    """Running totals of drafted decoding."""

    passes: int = 0  # forward passes after the prompts' (each yields >= 1 token a row)
    drafted: int = 0  # tokens guessed and checked
    accepted: int = 0  # of those, the model's own next tokens

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def draft_after(source: list[int], count: int) -> list[int]:
    """Up to ``count`` tokens that follow, in ``source``, the first earlier occurrence of its own last
    tokens (the longest such run of at most :data:`MAX_NGRAM` that occurs with a token after it); [] if none."""
    if count <= 0:
        return []
    for n in range(min(MAX_NGRAM, len(source) - 1), 0, -1):
        key = source[-n:]
        for start in range(len(source) - n):
            if source[start:start + n] == key:
                return source[start + n:start + n + count]
    return []


def draft_source(prompt_ids: list[int], hint_ids: list[int] | None) -> list[int]:
    """Where a row's drafts are looked up, before its generated text is appended: the hint (a text the
    reflection may resemble, e.g. the previous one) after the prompt's last tokens, then those tokens again,
    so the first generated tokens match the hint's beginning."""
    context = prompt_ids[-MAX_NGRAM:]
    return [*context, *hint_ids, *context] if hint_ids else list(context)


@torch.no_grad()
def greedy_with_drafts(model, *, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                       cache, sources: list[list[int]], max_new_tokens: int, stop_ids: list[int],
                       draft_tokens: int, pad_id: int, stats: DraftStats | None = None) -> list[list[int]]:
    """Greedy continuations of a left-padded batch, each up to ``max_new_tokens`` tokens and ending at its
    first stop token (included).

    ``input_ids`` (B, W) are fed after what ``cache`` already holds (a shared prefix, or nothing);
    ``attention_mask`` covers both (B, prefix + W), ``position_ids`` the fed tokens (B, W). ``sources`` are
    the rows' :func:`draft_source`. At most ``draft_tokens`` tokens a row are checked per pass."""
    stats = stats if stats is not None else DraftStats()
    stops = set(stop_ids)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                use_cache=True, logits_to_keep=1)
    generated = [[token] for token in out.logits[:, -1].argmax(-1).tolist()]
    done = [row[0] in stops or max_new_tokens <= 1 for row in generated]
    rows = list(range(len(generated)))  # which rows are still in the batch, in its order
    mask = attention_mask
    next_position = position_ids[:, -1] + 1
    device = input_ids.device
    while True:
        staying = [i for i, row in enumerate(rows) if not done[row]]
        if not staying:
            return generated
        if len(staying) < len(rows):
            index = torch.tensor(staying, device=device)
            cache.batch_select_indices(index)
            mask, next_position = mask[index], next_position[index]
            rows = [rows[i] for i in staying]
        # a pass yields the accepted drafts and one token more: never past max_new_tokens
        drafts = [draft_after(sources[row] + generated[row], min(draft_tokens, max_new_tokens - len(generated[row]) - 1))
                  for row in rows]
        width = 1 + max(map(len, drafts))
        fed = torch.full((len(rows), width), pad_id, dtype=input_ids.dtype)
        fed_mask = torch.zeros((len(rows), width), dtype=mask.dtype)
        for i, (row, draft) in enumerate(zip(rows, drafts)):
            fed[i, :1 + len(draft)] = torch.tensor([generated[row][-1], *draft])
            fed_mask[i, :1 + len(draft)] = 1
        mask = torch.cat([mask, fed_mask.to(device)], dim=1)
        positions = next_position[:, None] + torch.arange(width, device=device)
        out = model(input_ids=fed.to(device), attention_mask=mask, position_ids=positions, cache=cache,
                    use_cache=True, logits_to_keep=width)
        predicted = out.logits.argmax(-1).tolist()
        stats.passes += 1
        for i, (row, draft) in enumerate(zip(rows, drafts)):
            accepted = 0
            while accepted < len(draft) and draft[accepted] == predicted[i][accepted]:
                accepted += 1
            stats.drafted += len(draft)
            stats.accepted += accepted
            for token in [*draft[:accepted], predicted[i][accepted]]:
                generated[row].append(token)
                if token in stops or len(generated[row]) >= max_new_tokens:
                    done[row] = True
                    break
            # the rejected drafts and the padding after them: never attended to again
            mask[i, mask.shape[1] - width + 1 + accepted:] = 0
            next_position[i] += 1 + accepted
