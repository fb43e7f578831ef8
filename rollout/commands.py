"""The policy answering with a command's text instead of its label (``--policy_answer=command``): each command the
menu shows is scored by the log-probability of its words after the action marker, and the policy's distribution is
the softmax of those scores over the menu.

Why: AutoExplore's menus list up to 90 commands, and the paper's policy answers with the label in front of one. To
find it, a model must look back from the command the analysis names to the label written before that command, a
lookup SmolLM2-135M did not learn in 60 SFT steps on menus of more than 10 commands (6–13% of validation texts);
answering with the command's words is a copy of the file name the analysis already wrote (`docs/auto_explore.md`).

One forward pass reads a prompt once and all its candidates after it: the candidates sit one after another behind
the prompt, each seeing the prompt and its own words only (a 4D attention mask), each starting at the position
right after the prompt. A candidate's score is the sum of its tokens' log-probabilities; the same, to rounding, as
reading ``prompt + command`` for each command apart (``tests/test_commands.py``).
"""

import torch

from prompts import ACTION_MARKER, shown_menu
from utils.models import activation_dtype

ANSWER_END = "\n"  # ends a command answer, so that a command is not scored as the start of a longer one


def command_answer_text(text: str, alphabet) -> str:
    """A policy SFT text (``prompt + label``) with the command that label stands for as its answer instead."""
    cut = text.rindex(ACTION_MARKER) + len(ACTION_MARKER)
    prompt, label = text[:cut], text[cut:].strip()
    commands = dict(shown_menu(prompt, alphabet))
    if label not in commands:
        raise ValueError(f"policy text's label {label!r} is not among the labels its menu shows "
                         f"({', '.join(list(commands)[:6])}...)")
    return prompt + commands[label] + ANSWER_END


def tree_batch(prompts: list[list[int]], candidates: list[list[list[int]]], pad_id: int, dtype: torch.dtype):
    """Inputs of one pass reading each prompt and, behind it, its candidates (each seeing the prompt and itself).

    Rows are left-padded to one width. Returns ``input_ids``, a float ``attention_mask`` (batch, 1, width, width)
    of 0 where a token may look and the dtype's minimum elsewhere, ``position_ids``, and per row the positions
    whose next-token distribution scores each candidate token: ``(row, position, token, candidate index)``."""
    rows = [prompt + [t for cand in cands for t in cand] for prompt, cands in zip(prompts, candidates)]
    width = max(map(len, rows))
    batch = len(rows)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    positions = torch.zeros((batch, width), dtype=torch.long)
    allowed = torch.zeros((batch, width, width), dtype=torch.bool)
    picks = []  # (row, position read, token scored, candidate)
    for row, (prompt, cands) in enumerate(zip(prompts, candidates)):
        start = width - len(rows[row])
        input_ids[row, start:] = torch.tensor(rows[row])
        length = len(prompt)
        positions[row, start:start + length] = torch.arange(length)
        allowed[row, start:start + length, start:start + length] = torch.ones(length, length, dtype=torch.bool).tril()
        at = start + length
        for index, cand in enumerate(cands):
            size = len(cand)
            positions[row, at:at + size] = torch.arange(length, length + size)
            allowed[row, at:at + size, start:start + length] = True
            allowed[row, at:at + size, at:at + size] = torch.ones(size, size, dtype=torch.bool).tril()
            for offset, token in enumerate(cand):
                picks.append((row, (at + offset - 1) if offset else (start + length - 1), token, index))
            at += size
        allowed[row, :start, :start] |= torch.eye(start, dtype=torch.bool)  # padding looks at itself: no empty row
    mask = torch.zeros((batch, 1, width, width), dtype=dtype).masked_fill(~allowed[:, None], torch.finfo(dtype).min)
    return input_ids, mask, positions, picks


def command_scores(model, prompts: list[list[int]], candidates: list[list[list[int]]], pad_id: int,
                   with_hidden: bool = False) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """Per prompt, the summed log-probability of each of its candidates' tokens after it (with the model's graph
    when gradients are on); with ``with_hidden``, each prompt's last hidden state too (batch, hidden)."""
    device = next(model.parameters()).device
    input_ids, mask, positions, picks = tree_batch(prompts, candidates, pad_id, activation_dtype(model))
    out = model(input_ids=input_ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                output_hidden_states=True, logits_to_keep=1)
    last = out.hidden_states[-1]  # after the final norm: what the head reads
    rows = torch.tensor([p[0] for p in picks], device=device)
    reads = torch.tensor([p[1] for p in picks], device=device)
    tokens = torch.tensor([p[2] for p in picks], device=device)
    logits = model.get_output_embeddings()(last[rows, reads]).float()
    token_logp = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    sizes = [len(cands) for cands in candidates]
    first = [sum(sizes[:row]) for row in range(len(sizes))]  # each row's first candidate among all rows'
    owner = torch.tensor([first[p[0]] + p[3] for p in picks], device=device)
    total = torch.zeros(sum(sizes), device=device, dtype=torch.float32).index_add(0, owner, token_logp)
    scores = list(total.split(sizes))
    hidden = None
    if with_hidden:
        ends = torch.tensor([input_ids.shape[1] - sum(map(len, cands)) - 1 for cands in candidates], device=device)
        hidden = last[torch.arange(len(candidates), device=device), ends].float()
    return scores, hidden
