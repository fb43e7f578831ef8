"""The model's LM head: the policy's shrunk label head over the choice-label tokens (``--shrink_head``,
:class:`LabelHead`), the full head put back for generation and saving (:func:`full_head`), and the head's
contiguous input (``--contiguous_head``)."""

import contextlib
import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)


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
