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
from dataclasses import dataclass, field, fields

import numpy as np
import torch

from rl_algorithms.losses import ValueHead, cost_to_go, value_loss
from rollout import Decision, Episode, EpisodeStart, PolicyScorer, entropy_of
from utils.lm_head import base_model
from utils.models import device, finite_gradients

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
    hidden: torch.Tensor | None  # the policy's hidden states the critic read (detached), when there is one
    entropy: torch.Tensor | None  # entropy of each decision's label distribution, when --entropy_coef > 0


def flat_decisions(episodes: list[Episode]) -> tuple[list[Decision], torch.Tensor]:
    """Every decision of ``episodes`` with its cost-to-go."""
    decisions, q = [], []
    for episode in episodes:
        decisions += episode.decisions
        q += cost_to_go(episode.costs())
    return decisions, torch.tensor(q, dtype=torch.float32)


@dataclass(frozen=True)
class LearnerSettings:
    """All a learner reads of the flags, given to it explicitly (:meth:`from_args`)."""

    learning_rate: float
    weight_decay: float
    max_grad_norm: float
    minibatch_size: int  # --per_device_train_batch_size: decisions per backward pass
    baseline: str
    critic_layer_type: str
    critic_update_freq: int
    critic_update_iter: int
    entropy_coef: float
    replay_buffer_size: int
    replay_batch_size: int
    replay_mode: str
    pg_normalize: str
    ppo_clip: float
    ppo_epochs: int
    refuel_eta: float
    grpo_variant: str
    kl_coef: float
    gigpo_weight: float
    gigpo_gamma: float

    @classmethod
    def from_args(cls, args) -> "LearnerSettings":
        flag = {"minibatch_size": "per_device_train_batch_size"}
        return cls(**{f.name: getattr(args, flag.get(f.name, f.name)) for f in fields(cls)})


class Learner:
    """Base class: subclasses implement :meth:`update` (and extend the state methods)."""

    def __init__(self, settings: LearnerSettings, scorer: PolicyScorer, accelerator):
        self.settings, self.scorer, self.accelerator = settings, scorer, accelerator
        self.critic = None
        if settings.baseline == "critic":
            self.critic = ValueHead(base_model(scorer.policy).config.hidden_size, settings.critic_layer_type).to(device())
        # The critic learns in the policy's optimiser step (ours), or on the paper's schedule: every
        # --critic_update_freq iterations, --critic_update_iter passes, with an optimiser of its own.
        self.critic_schedule = self.critic is not None and (settings.critic_update_freq, settings.critic_update_iter) != (1, 1)
        self.policy_params = [p for p in scorer.policy.parameters() if p.requires_grad]
        self.params = list(self.policy_params)  # what the optimiser steps: the policy's, and the critic's below
        if self.critic is not None and not self.critic_schedule:
            self.params += list(self.critic.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=settings.learning_rate, weight_decay=settings.weight_decay)
        if self.critic_schedule:
            self.critic_params = list(self.critic.parameters())
            self.critic_optimizer = torch.optim.Adam(self.critic_params, lr=settings.learning_rate,
                                                     weight_decay=settings.weight_decay)
            self.critic_data: list[tuple[torch.Tensor, torch.Tensor]] = []  # (hidden, cost-to-go) to learn from
            self.iterations_since_critic = 0

    def update(self, episodes: list[Episode], play: Play, rng: np.random.Generator) -> UpdateResult:
        raise NotImplementedError

    # --- state saved in checkpoints (the optimiser is saved by the loop) ----------------------

    def state_dict(self) -> dict:
        state = {"critic": self.critic.state_dict() if self.critic is not None else None}
        if self.critic_schedule:
            state["critic_schedule"] = {"optimizer": self.critic_optimizer.state_dict(),
                                        "data": [list(pair) for pair in self.critic_data],
                                        "iterations": self.iterations_since_critic}
        return state

    def load_state_dict(self, state: dict) -> None:
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        if self.critic_schedule:
            schedule = state["critic_schedule"]
            self.critic_optimizer.load_state_dict(schedule["optimizer"])
            self.critic_data = [tuple(pair) for pair in schedule["data"]]
            self.iterations_since_critic = schedule["iterations"]

    # --- pieces for subclasses --------------------------------------------------------------------

    def score(self, decisions: list[Decision]) -> Iterator[Scored]:
        """Current log-probs of the decisions' actions, in minibatches of ``per_device_train_batch_size``.

        With ``--reuse_rollout_pass``, the leading decisions whose rollout passes were kept at the current
        weights (:class:`rollout.KeptPasses`) come first, in one piece read from those passes: one backward
        pass through them frees them all. The gradient is the same, to rounding, as the loss is a sum over
        decisions and the optimiser steps only after every minibatch."""
        size = self.settings.minibatch_size
        kept = self.scorer.kept.take(decisions) if self.critic is None else []
        if kept:
            yield self._scored(0, decisions[:len(kept)], torch.stack(kept))
        for start in range(len(kept), len(decisions), size):
            chunk = decisions[start:start + size]
            scores = self.scorer.logprobs([d.prompt for d in chunk], [d.valid for d in chunk],
                                          with_hidden=self.critic is not None)
            yield self._scored(start, chunk, scores.logprobs, scores.hidden)

    def _scored(self, start: int, chunk: list[Decision], logp: torch.Tensor,
                hidden: torch.Tensor | None = None) -> Scored:
        """The chunk's figures from its label log-probs (one row per decision): the chosen label's, the entropy
        when --entropy_coef asks for it, and the critic's values from the hidden states when there is one."""
        chosen = logp.gather(1, torch.tensor([[d.action] for d in chunk], device=logp.device)).squeeze(1)
        hidden = hidden.detach() if self.critic is not None else None
        values = self.critic(hidden) if self.critic is not None else None
        entropy = entropy_of(logp) if self.settings.entropy_coef > 0 else None
        return Scored(start, chunk, chosen, values, hidden, entropy)

    def critic_term(self, scored: Scored, q_chunk: torch.Tensor, num_decisions: int,
                    collect: bool = True) -> torch.Tensor | float:
        """The critic's part of a minibatch's loss: its squared error, weighted by the minibatch's share
        of the batch's decisions, when it learns in the policy's step; 0 on the paper's schedule, where the
        minibatch is kept (``collect``) for :meth:`train_critic_on_schedule`."""
        if scored.values is None:
            return 0.0
        if not self.critic_schedule:
            return value_loss(scored.values, q_chunk) * len(scored.decisions) / num_decisions
        if collect:
            self.critic_data.append((scored.hidden.cpu(), q_chunk.detach().cpu()))
        return 0.0

    def train_critic_on_schedule(self, rng: np.random.Generator) -> float | None:
        """Every ``--critic_update_freq`` iterations: ``--critic_update_iter`` shuffled passes over the
        decisions kept since, in minibatches of ``--per_device_train_batch_size``, each an optimiser step
        on the critic alone. Returns the mean squared error of those steps, or None when not yet due."""
        if not self.critic_schedule:
            return None
        self.iterations_since_critic += 1
        if self.iterations_since_critic < self.settings.critic_update_freq:
            return None
        hidden = torch.cat([h for h, _ in self.critic_data]) if self.critic_data else torch.zeros(0, 1)
        q = torch.cat([c for _, c in self.critic_data]) if self.critic_data else torch.zeros(0)
        size, losses = self.settings.minibatch_size, []
        for _ in range(self.settings.critic_update_iter):
            order = torch.from_numpy(rng.permutation(len(q)))
            batches = [order[i:i + size] for i in range(0, len(q), size)]
            for number in range(self.agreed_count(len(batches))):  # ranks step together
                loss = 0.0
                if number < len(batches):
                    index = batches[number]
                    loss = value_loss(self.critic(hidden[index].to(device())), q[index].to(device()))
                    loss.backward()
                    loss = loss.item()
                    losses.append(loss)
                self.step(loss, self.critic_params, self.critic_optimizer)
        self.critic_data, self.iterations_since_critic = [], 0
        return sum(losses) / len(losses) if losses else None

    def agreed_count(self, count: int) -> int:
        """The largest ``count`` over the ranks (``count`` itself in one process)."""
        if self.accelerator.num_processes == 1:
            return count
        mine = torch.tensor(float(count), device=self.accelerator.device)
        return int(self.accelerator.reduce(mine, reduction="max").item())

    def entropy_bonus(self, scored: Scored, num_episodes: int) -> torch.Tensor | float:
        """``--entropy_coef`` times the minibatch's summed entropy per episode (subtracted from a loss)."""
        if scored.entropy is None:
            return 0.0
        return self.settings.entropy_coef * scored.entropy.sum() / num_episodes

    def baseline(self, q: torch.Tensor, values: torch.Tensor | None) -> torch.Tensor | float:
        """What ``--baseline`` subtracts from the cost-to-go (``q``: the whole batch's)."""
        if self.settings.baseline == "mean":
            return q.mean()
        if self.settings.baseline == "critic":
            return values.detach()
        return 0.0

    def step(self, loss: float, params: list | None = None,
             optimizer: torch.optim.Optimizer | None = None) -> tuple[bool, float | None]:
        """Average gradients over ranks, clip, and take one optimiser step (of the policy, unless other
        ``params`` and their ``optimizer`` are given).

        Returns (applied, gradient norm before clipping). A non-finite loss or gradient on
        any rank skips the step on every rank (applied False, norm None).
        """
        accelerator = self.accelerator
        params = self.params if params is None else params
        optimizer = self.optimizer if optimizer is None else optimizer
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if accelerator.num_processes > 1:
            for p in params:
                p.grad = accelerator.reduce(p.grad, reduction="mean")
        finite = torch.tensor(float(math.isfinite(loss) and finite_gradients(params)))
        if accelerator.num_processes > 1:
            finite = accelerator.reduce(finite.to(accelerator.device), reduction="min").cpu()
        if not bool(finite):
            optimizer.zero_grad(set_to_none=True)
            return False, None
        norm = torch.nn.utils.clip_grad_norm_(params, self.settings.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return True, float(norm)
