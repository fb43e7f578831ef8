"""What every learner shares: the interface, the optimiser step, scoring and baselines.

A learner turns a batch of freshly played episodes into one (or, for PPO, several)
optimiser steps on the policy. It owns whatever extra state it needs (a replay buffer,
a critic, branch rollouts) and saves it through :meth:`Learner.state_dict`. The loop in
``rl_finetune.py`` only ever calls::

    result = learner.update(episodes, play, rng)     # -> UpdateResult

``play(starts, rng)`` plays more episodes on the run's environments with the current
policy (REFUEL uses it for its branches); ``rng`` is the run's episode generator, the
only source of randomness a learner may draw from.
"""

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from models import base_model, device
from rl_algorithms.losses import ValueHead, cost_to_go
from rollout import Decision, Episode, EpisodeStart, PolicyScorer, entropy_of

Play = Callable[[list[EpisodeStart], np.random.Generator], list[Episode]]


@dataclass
class UpdateResult:
    """What one ``update`` did.

    ``loss`` is the loss of the last optimiser step; ``applied`` is False when a
    non-finite loss or gradient made it skip a step; ``metrics`` are the learner's own
    figures (``grad_norm``, PPO's ``approx_kl`` ...), logged as they are.
    """

    loss: float
    applied: bool = True
    metrics: dict[str, float | int | None] = field(default_factory=dict)


@dataclass
class Scored:
    """A minibatch of decisions with their current log-probabilities (with gradient)."""

    start: int  # index of the first decision of the minibatch
    decisions: list[Decision]
    logprobs: torch.Tensor  # log pi(a|s) of each decision's action
    values: torch.Tensor | None  # the critic's cost-to-go estimates, when there is a critic
    entropy: torch.Tensor | None  # entropy of each decision's label distribution, when --entropy_coef > 0


def flat_decisions(episodes: list[Episode]) -> tuple[list[Decision], torch.Tensor]:
    """Every decision of ``episodes`` with its cost-to-go."""
    decisions, q = [], []
    for episode in episodes:
        decisions += episode.decisions
        q += cost_to_go(episode.costs())
    return decisions, torch.tensor(q, dtype=torch.float32)


class Learner:
    """Base class: subclasses implement :meth:`update` (and extend the state methods)."""

    def __init__(self, args, scorer: PolicyScorer, accelerator):
        self.args, self.scorer, self.accelerator = args, scorer, accelerator
        self.critic = None
        if args.baseline == "critic":
            self.critic = ValueHead(base_model(scorer.policy).config.hidden_size).to(device())
        self.params = [p for p in scorer.policy.parameters() if p.requires_grad]
        if self.critic is not None:
            self.params += list(self.critic.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=args.learning_rate, weight_decay=args.weight_decay)

    def update(self, episodes: list[Episode], play: Play, rng: np.random.Generator) -> UpdateResult:
        raise NotImplementedError

    # --- state saved in checkpoints (the optimiser is saved by the loop) ----------------------

    def state_dict(self) -> dict:
        return {"critic": self.critic.state_dict() if self.critic is not None else None}

    def load_state_dict(self, state: dict) -> None:
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])

    # --- pieces for subclasses --------------------------------------------------------------------

    def score(self, decisions: list[Decision]) -> Iterator[Scored]:
        """Current log-probs of the decisions' actions, in minibatches of ``per_device_train_batch_size``."""
        size = self.args.per_device_train_batch_size
        for start in range(0, len(decisions), size):
            chunk = decisions[start:start + size]
            scores = self.scorer.logprobs([d.prompt for d in chunk], [d.valid for d in chunk],
                                          with_hidden=self.critic is not None)
            logp = scores.logprobs
            chosen = logp.gather(1, torch.tensor([[d.action] for d in chunk], device=logp.device)).squeeze(1)
            values = self.critic(scores.hidden.detach()) if self.critic is not None else None
            entropy = entropy_of(logp) if self.args.entropy_coef > 0 else None
            yield Scored(start, chunk, chosen, values, entropy)

    def entropy_bonus(self, scored: Scored, num_episodes: int) -> torch.Tensor | float:
        """``--entropy_coef`` times the minibatch's summed entropy per episode (subtracted from a loss)."""
        if scored.entropy is None:
            return 0.0
        return self.args.entropy_coef * scored.entropy.sum() / num_episodes

    def baseline(self, q: torch.Tensor, values: torch.Tensor | None) -> torch.Tensor | float:
        """What ``--baseline`` subtracts from the cost-to-go (``q``: the whole batch's)."""
        if self.args.baseline == "mean":
            return q.mean()
        if self.args.baseline == "critic":
            return values.detach()
        return 0.0

    def step(self, loss: float) -> tuple[bool, float | None]:
        """Average gradients over ranks, clip, and take one optimiser step.

        Returns (applied, gradient norm before clipping). A non-finite loss or gradient on
        any rank skips the step on every rank (applied False, norm None).
        """
        accelerator = self.accelerator
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if accelerator.num_processes > 1:
            for p in self.params:
                p.grad = accelerator.reduce(p.grad, reduction="mean")
        finite = torch.tensor(float(math.isfinite(loss) and all(bool(torch.isfinite(p.grad).all())
                                                                for p in self.params)))
        if accelerator.num_processes > 1:
            finite = accelerator.reduce(finite.to(accelerator.device), reduction="min").cpu()
        if not bool(finite):
            self.optimizer.zero_grad(set_to_none=True)
            return False, None
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.args.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return True, float(norm)
