"""The policy's side of the two-player rollout: one batched forward pass gives the log-probabilities of the choice
labels after each policy prompt (:class:`PolicyScorer`, read by the rollout and by the learners' updates), the
passes a training rollout keeps for the update (:class:`KeptPasses`), the memo of a frozen policy's answers by
prompt (:class:`PolicyMemo`), and the left-cut, left-padded batches both players' prompts are read in
(:func:`cut_left`, :func:`pad_left`)."""

from dataclasses import dataclass
from typing import NamedTuple

import torch

from prompts import label_alphabet, label_token_ids, shown_menu
from rollout.commands import ANSWER_END, command_scores
from rollout.records import Decision
from utils import lm_head
from utils.arg_groups_model import LABEL_HEAD_WITH_COMMANDS
from utils.errors import UsageError
from utils.kv_cache import PrefixKV, WeightsMemo, WeightsWatch


class Choice(NamedTuple):
    """The policy's pick at one step."""

    action: int  # index into the policy's label alphabet
    logprob: float  # at the temperature
    entropy: float  # of the distribution over the valid labels
    row: torch.Tensor | None = None  # the label log-probs with their graph, where the pass is kept for the update


class KeptPasses:
    """The policy's forward passes of the latest training rollout, kept with their autograd graphs so that the
    update reads each decision's label log-probs from them instead of reading its prompt again
    (``--reuse_rollout_pass``).

    Valid only at the weights they were computed with: each parameter's version counter is compared when the
    update takes them, and any in-place change since (an optimiser step, weights swapped in) drops them all.
    A backward pass frees a graph for every row of its forward pass, so they are taken once, in one piece:
    the leading run of the given decisions that has kept rows; whatever else was kept is dropped.
    """

    def __init__(self, policy):
        self.watch = WeightsWatch(policy)
        self.rows: dict[int, tuple[Decision, torch.Tensor]] = {}  # id(decision) -> (decision, its row)

    def clear(self) -> None:
        """Forget every kept pass (a new training rollout begins at the current weights)."""
        self.rows.clear()
        self.watch.changed()

    def keep(self, decision: "Decision", row: torch.Tensor) -> None:
        self.rows[id(decision)] = (decision, row)

    def take(self, decisions: list["Decision"]) -> list[torch.Tensor]:
        """The kept rows of the leading decisions that have one (none if the weights changed since), consumed."""
        if not self.rows:
            return []
        taken = []
        if not self.watch.changed():
            for decision in decisions:
                entry = self.rows.get(id(decision))
                if entry is None or entry[0] is not decision:
                    break
                taken.append(entry[1])
        self.rows.clear()
        return taken


class PolicyMemo(WeightsMemo):
    """The label log-probabilities the policy gave, by prompt and valid labels, for choices made without gradient
    (``--policy_memo``): a prompt seen again (AutoExplore's states recur across the episodes of one task) is not read
    again. Valid only at the weights it was filled under (the same check as :class:`KeptPasses`'s): an optimiser step
    or weights swapped in empty it. Equal to reading the prompt again up to rounding, as the prompt's row would sit in
    another batch, of another width."""

    def lookup(self, prompts: list[str], valid: list[list[int]], score) -> tuple[torch.Tensor, int, "LabelScores | None"]:
        """Each prompt's row of label log-probs (on the CPU), the number answered from memory, and the scores of
        the pass ``score(prompts, valid)`` made for the others (each distinct prompt read once), if one was."""
        rows = self.fresh()  # (prompt, valid labels) -> its row of label log-probs
        keys = [(prompt, tuple(labels)) for prompt, labels in zip(prompts, valid)]
        missing = list(dict.fromkeys(key for key in keys if key not in rows))
        scores = None
        if missing:
            scores = score([prompt for prompt, _ in missing], [list(labels) for _, labels in missing])
            rows.update(zip(missing, scores.logprobs.detach().cpu().unbind(0)))
        return torch.stack([rows[key] for key in keys]), len(keys) - len(missing), scores


@dataclass
class LabelScores:
    """What one batched policy forward pass gives."""

    logprobs: torch.Tensor  # (B, len(labels)) log-probabilities at the temperature, -inf outside the valid labels
    hidden: torch.Tensor | None  # (B, hidden) last hidden state at the action marker, if asked for
    truncated: int  # prompts cut from the left at max_seq_length
    tokens: int  # prompt tokens read


@dataclass
class Encoded:
    """A left-padded batch of prompts (see :func:`pad_left`)."""

    inputs: dict[str, torch.Tensor]  # input_ids, attention_mask, position_ids
    truncated: int
    tokens: int


class PolicyScorer:
    """Log-probabilities of the choice labels after policy prompts (with or without gradient).

    The labels are the tokenizer's alphabet (:func:`prompts.label_alphabet`); ``label_index``
    maps a label to its column. ``answer``: what the policy writes after the action marker, the label (the
    paper's) or the command the label stands for (``--policy_answer=command``, :mod:`rollout.commands`); either
    way the result is a distribution over the labels shown.
    """

    def __init__(self, policy, tokenizer, max_seq_length: int, temperature: float, answer: str = "label"):
        if answer not in ("label", "command"):
            raise UsageError(f"--policy_answer: {answer!r} is neither 'label' nor 'command'")
        if answer == "command" and lm_head.label_head(policy) is not None:
            raise UsageError(f"--shrink_head (the policy has the label head): {LABEL_HEAD_WITH_COMMANDS}")
        self.policy, self.tokenizer, self.answer = policy, tokenizer, answer
        self.max_seq_length, self.temperature = max_seq_length, temperature
        self.labels = label_alphabet(tokenizer)
        self.label_index = {label: i for i, label in enumerate(self.labels)}
        self.label_ids = torch.tensor(label_token_ids(tokenizer, self.labels))
        self.kept = KeptPasses(policy)  # the training rollout's passes, for the update (--reuse_rollout_pass)

    def logprobs(self, prompts: list[str], valid: list[list[int]], with_hidden: bool = False,
                 prefix: PrefixKV | None = None) -> LabelScores:
        """Label log-probabilities after each prompt, only ``valid[i]`` allowed for prompt i; the prompts'
        shared prefix read once through ``prefix`` where given (no gradient: the rollout's choices)."""
        if self.answer == "command":
            return self._command_logprobs(prompts, valid, with_hidden)
        ids, truncated = cut_left(self.tokenizer, prompts, self.max_seq_length)
        device = _device(self.policy)
        prepared = prefix.prepare(ids, self.tokenizer.pad_token_id, device) if prefix is not None else None
        if prepared is None:
            encoded = pad_left(self.tokenizer, ids, truncated, device)
            out = self.policy(**encoded.inputs, logits_to_keep=1, output_hidden_states=with_hidden)
            tokens = encoded.tokens
        else:
            out = self.policy(input_ids=prepared.input_ids[:, prepared.prefix:], attention_mask=prepared.attention_mask,
                              position_ids=prepared.position_ids, cache=prepared.cache, use_cache=True,
                              logits_to_keep=1, output_hidden_states=with_hidden)
            tokens = prepared.tokens
        logits = out.logits[:, -1, :].float()
        if lm_head.label_head(self.policy) is None:
            logits = logits[:, self.label_ids.to(logits.device)]
        mask = torch.zeros_like(logits, dtype=torch.bool)
        for row, indices in enumerate(valid):
            mask[row, indices] = True
        logp = torch.log_softmax((logits / self.temperature).masked_fill(~mask, float("-inf")), dim=-1)
        hidden = out.hidden_states[-1][:, -1, :].float() if with_hidden else None
        return LabelScores(logp, hidden, truncated, tokens)

    def _command_logprobs(self, prompts: list[str], valid: list[list[int]], with_hidden: bool) -> LabelScores:
        """:meth:`logprobs` where the policy answers with the command's words: each valid label's command scored
        after its prompt (:func:`rollout.commands.command_scores`, one pass reading each prompt once)."""
        commands = []
        for prompt, indices in zip(prompts, valid):
            menu = dict(shown_menu(prompt, self.label_index))
            missing = [self.labels[i] for i in indices if self.labels[i] not in menu]
            if missing:
                raise ValueError(f"labels {missing[:5]} are valid but the prompt's menu does not show them")
            commands.append([menu[self.labels[i]] + ANSWER_END for i in indices])
        flat = [command for row in commands for command in row]
        encoded = iter(self.tokenizer(flat, add_special_tokens=False)["input_ids"]) if flat else iter(())
        candidates = [[next(encoded) for _ in row] for row in commands]
        room = self.max_seq_length - max((len(c) for row in candidates for c in row), default=0)
        ids, truncated = cut_left(self.tokenizer, prompts, max(room, 1))
        scores, hidden = command_scores(self.policy, ids, candidates, self.tokenizer.pad_token_id, with_hidden)
        device = scores[0].device if scores else _device(self.policy)
        table = torch.full((len(prompts), len(self.labels)), float("-inf"), device=device)
        rows = [table[row].index_put((torch.tensor(indices, device=device),), score)
                for row, (indices, score) in enumerate(zip(valid, scores))]
        logp = torch.log_softmax(torch.stack(rows) / self.temperature, dim=-1)
        tokens = sum(map(len, ids)) + sum(len(c) for row in candidates for c in row)
        return LabelScores(logp, hidden, truncated, tokens)


def _device(model) -> torch.device:
    return next(model.parameters()).device


def cut_left(tokenizer, prompts: list[str], max_length: int) -> tuple[list[list[int]], int]:
    """Each prompt's token ids cut from the left at ``max_length``, and how many were cut."""
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    return [x[-max_length:] for x in ids], sum(len(x) > max_length for x in ids)


def pad_left(tokenizer, ids: list[list[int]], truncated: int, device) -> Encoded:
    """Token ids (already cut to length) as a left-padded batch."""
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    # Left padding must not shift positions: each prompt's first real token is position 0.
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    batch = {"input_ids": input_ids, "attention_mask": attention, "position_ids": positions}
    return Encoded({k: v.to(device) for k, v in batch.items()}, truncated, int(attention.sum()))


def entropy_of(logp: torch.Tensor) -> torch.Tensor:
    probs = logp.exp()
    return -(probs * logp.masked_fill(probs == 0, 0.0)).sum(-1)
