"""SayCan-style action scoring, the baseline single-prompt enumeration is measured against.

Used by ``benchmarks/enumeration.py`` only: the project's policy never scores action texts.
"""

import torch


class SayCanScorer:
    """The baseline the paper compares against: score every action's text by its likelihood.

    For a state prompt ``s`` and actions ``a_1..a_n``, the score of ``a_i`` is
    ``log p(a_i | s)`` summed over its tokens. Uncached, that is n forward passes over
    ``s + a_i``; with ``cache=True`` the state is encoded once and its key/value cache is
    shared by all actions (one batched pass over the action tokens). Single-prompt
    enumeration (:class:`PolicyScorer`) needs one pass over ``s`` plus the listed actions.
    """

    def __init__(self, model, tokenizer, cache: bool = True):
        self.model, self.tokenizer, self.cache = model, tokenizer, cache
        self.tokens = 0  # tokens passed through the model, for the cost comparison

    @torch.no_grad()
    def scores(self, state: str, actions: list[str]) -> torch.Tensor:
        device = next(self.model.parameters()).device
        state_ids = self.tokenizer(state, add_special_tokens=False)["input_ids"]
        action_ids = [self.tokenizer(a, add_special_tokens=False)["input_ids"] for a in actions]
        if not self.cache:
            out = []
            for ids in action_ids:
                full = torch.tensor([state_ids + ids], device=device)
                logits = self.model(full, attention_mask=torch.ones_like(full)).logits
                logp = torch.log_softmax(logits[0, len(state_ids) - 1:-1].float(), -1)
                out.append(logp.gather(1, torch.tensor(ids, device=device).unsqueeze(1)).sum())
                self.tokens += full.shape[1]
            return torch.stack(out)
        state = torch.tensor([state_ids], device=device)
        prefix = self.model(state, attention_mask=torch.ones_like(state), use_cache=True)
        self.tokens += len(state_ids)
        width = max(map(len, action_ids))
        pad = self.tokenizer.pad_token_id
        batch = torch.tensor([ids + [pad] * (width - len(ids)) for ids in action_ids], device=device)
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in action_ids], device=device)
        cache = prefix.cache
        cache.batch_repeat_interleave(len(actions))
        attention = torch.cat([torch.ones(len(actions), len(state_ids), dtype=mask.dtype, device=device), mask], 1)
        positions = torch.arange(len(state_ids), len(state_ids) + width, device=device).expand(len(actions), -1)
        logits = self.model(batch, cache=cache, attention_mask=attention, position_ids=positions).logits
        self.tokens += int(mask.sum())
        # The first action token is predicted by the state's last position.
        first = torch.log_softmax(prefix.logits[0, -1].float(), -1)[batch[:, 0]]
        rest = torch.log_softmax(logits[:, :-1].float(), -1).gather(2, batch[:, 1:].unsqueeze(-1)).squeeze(-1)
        return first + (rest * mask[:, 1:]).sum(-1)
