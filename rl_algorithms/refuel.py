"""REFUEL: regress differences of log-ratio gains on differences of returns.

For each episode τ a step h is drawn; a branch τ' replays τ up to h (same states, same
reflection at h) and then samples its own action and continues with the current policy.
Where the two actions at h differ, the pair (τ_h, τ'_h) enters the loss with the returns
from h onwards.
"""

import numpy as np
import torch

from rl_algorithms.base import Learner, Play, UpdateResult
from rl_algorithms.losses import cost_to_go, refuel_loss
from rollout import Decision, Episode, EpisodeStart

Pair = tuple[Decision, Decision, float, float]  # (τ_h, τ'_h, G_h, G'_h)


def refuel_pairs(episodes: list[Episode], branches: list[Episode], steps: list[int]) -> list[Pair]:
    """(decision in τ, decision in τ', G_h, G'_h) for branches whose action differs at h."""
    pairs = []
    for episode, branch, h in zip(episodes, branches, steps):
        if branch.decisions[h].action == episode.decisions[h].action:
            continue
        returns = -cost_to_go(episode.costs())[h]
        branch_returns = -cost_to_go(branch.costs())[h]
        pairs.append((episode.decisions[h], branch.decisions[h], returns, branch_returns))
    return pairs


class Refuel(Learner):
    def update(self, episodes: list[Episode], play: Play, rng: np.random.Generator) -> UpdateResult:
        steps = [int(rng.integers(len(e.decisions))) for e in episodes]
        branch_starts = [EpisodeStart(seed=e.seed, options=e.options, level=e.level, replay=e.decisions[:h + 1])
                         for e, h in zip(episodes, steps)]
        pairs = refuel_pairs(episodes, play(branch_starts, rng), steps)
        loss = self._accumulate(pairs)
        applied, grad_norm = self.step(loss)  # also without pairs: Adam's weight decay and step count go on
        return UpdateResult(loss, applied, {"grad_norm": grad_norm, "refuel_pairs": len(pairs)})

    def _accumulate(self, pairs: list[Pair]) -> float:
        """Backpropagate the loss over all pairs (in minibatches); return its value."""
        total, size = 0.0, self.settings.minibatch_size
        for start in range(0, len(pairs), size):
            chunk = pairs[start:start + size]
            decisions = [p[0] for p in chunk] + [p[1] for p in chunk]
            logp = self.scorer.logprobs([d.prompt for d in decisions], [d.valid for d in decisions]).logprobs
            chosen = logp.gather(1, torch.tensor([[d.action] for d in decisions], device=logp.device)).squeeze(1)
            # The episodes are fresh from the current policy, so its log-probabilities are the behaviour's:
            # taken from this very pass, a gain is exactly 0 before the step. The rollout's recorded ones
            # agree only to ~1e-7 (other batches, other CPU kernels); where G_h = G'_h that noise would be
            # the pair's whole gradient, and Adam would scale it to a full step in a direction set by
            # the machine.
            old = chosen.detach()
            returns = torch.tensor([p[2] for p in chunk], device=logp.device)
            branch_returns = torch.tensor([p[3] for p in chunk], device=logp.device)
            n = len(chunk)
            loss = refuel_loss(chosen[:n], old[:n], chosen[n:], old[n:], returns, branch_returns,
                               self.settings.refuel_eta)
            (loss * n / len(pairs)).backward()
            total += loss.item() * n / len(pairs)
        return total
