"""What the group learners (RLOO, GRPO, GiGPO) share: a batch's groups, the episodes' returns, and the
group-relative baselines, and the replay of recent successes.

``--group_size K`` plays each start K times per iteration (``rl_finetune.episode_starts``); the episodes of
one start carry the same ``Episode.group``. A group learner compares each episode with the others of its
group instead of subtracting a learned or batch-wide baseline. Returns are rewards (higher: better),
``-cost``: the sum of the episode's rewards.

**Success replay** (``--replay_batch_size M``, ``--replay_buffer_size``; PG's joint replay): each update also
trains on up to M distinct successes drawn from the last ``--replay_buffer_size`` successful episodes. A replayed
episode was played from another start, in no group of the batch, so its baseline is the fresh batch's: with
returns F_1..F_N of the fresh episodes, a replayed success of return R gets

    A = R - mean(F)                                   (rloo; grpo and gigpo under dr_grpo)
    A = (R - mean(F)) / (std(F u replayed) + eps)     (grpo and gigpo under grpo's scaling)

for every one of its decisions. The scale is the standard deviation of all the batch's returns, replayed ones
included, so that a batch of equal fresh returns (std 0) does not blow a replayed one up. Under GRPO's clipped
ratio a replayed decision's behaviour log-probability is the one recorded when it was played: a success the
policy has since made likelier (ratio above 1 + clip) adds nothing, one it has made rarer is pulled back up.
"""

from collections.abc import Callable

import numpy as np
import torch

from rl_algorithms.base import Play, UpdateResult
from rl_algorithms.replay import ReplayBuffer
from rollout import Episode

# GRPO's epsilon: keeps a group whose returns are all equal (std 0) at advantage 0
EPS = 1e-6


def group_members(episodes: list[Episode]) -> list[list[int]]:
    """The batch's episodes by group (indices into ``episodes``), groups in order of first appearance."""
    members: dict[int, list[int]] = {}
    for index, episode in enumerate(episodes):
        if episode.group is None:
            raise ValueError("a group learner was given an episode without a group: play with --group_size 2 or "
                             "more (rl_finetune does)")
        members.setdefault(episode.group, []).append(index)
    for indices in members.values():
        if len(indices) < 2:
            raise ValueError(f"a group of {len(indices)} episode: a group learner compares at least 2 episodes of "
                             "one start (--group_size 2 or more)")
    return list(members.values())


def episode_returns(episodes: list[Episode]) -> torch.Tensor:
    """Each episode's return: the sum of its rewards (= -its cost)."""
    return torch.tensor([sum(d.reward for d in e.decisions) for e in episodes], dtype=torch.float64)


def leave_one_out(values: torch.Tensor, members: list[list[int]]) -> torch.Tensor:
    """RLOO's advantage: each value minus the mean of the other values of its group."""
    out = torch.zeros_like(values)
    for indices in members:
        group = values[indices]
        out[indices] = group - (group.sum() - group) / (len(indices) - 1)
    return out


def group_relative(values: torch.Tensor, members: list[list[int]], scale: bool) -> torch.Tensor:
    """GRPO's advantage: each value minus its group's mean, divided by the group's standard deviation (with
    Bessel's correction, as TRL computes it) plus :data:`EPS` when ``scale``; a group of one gets 0."""
    out = torch.zeros_like(values)
    for indices in members:
        if len(indices) < 2:
            continue
        group = values[indices]
        centred = group - group.mean()
        out[indices] = centred / (group.std() + EPS) if scale else centred
    return out


def per_decision(episodes: list[Episode], per_episode: torch.Tensor) -> torch.Tensor:
    """An episode-level figure repeated for each of the episode's decisions, in ``flat_decisions`` order."""
    return torch.cat([per_episode[i].repeat(len(e.decisions)) for i, e in enumerate(episodes)]
                     or [per_episode.new_zeros(0)])


def replayed_relative(fresh: torch.Tensor, replayed: torch.Tensor, scale: bool) -> torch.Tensor:
    """A replayed success's advantage against the fresh batch (see the module's docstring)."""
    if len(replayed) == 0:
        return replayed.new_zeros(0)
    centred = replayed - fresh.mean()
    return centred / (torch.cat([fresh, replayed]).std() + EPS) if scale else centred


def decision_advantages(episodes: list[Episode], replayed: list[Episode],
                        grouped: Callable[[torch.Tensor], torch.Tensor], scale: bool) -> np.ndarray:
    """Each decision's advantage, in ``flat_decisions`` order: the fresh episodes' from their returns by the
    learner's group baseline ``grouped``, then the replayed successes' against the fresh batch."""
    fresh = episode_returns(episodes)
    per_episode = torch.cat([grouped(fresh), replayed_relative(fresh, episode_returns(list(replayed)), scale)])
    return per_decision([*episodes, *replayed], per_episode).numpy()


class SuccessReplay:
    """A group learner's replay of recent successes (``--replay_batch_size``, ``--replay_buffer_size``): the
    buffer, what an update draws from it, and its part of the learner's state. Mixed into a
    :class:`rl_algorithms.base.Learner` subclass, before it in the bases (``class RLOO(SuccessReplay, Learner)``)."""

    def __init__(self, settings, scorer, accelerator):
        super().__init__(settings, scorer, accelerator)
        self.replay = ReplayBuffer(settings.replay_buffer_size)

    def replayed(self, rng: np.random.Generator) -> list[Episode]:
        """Up to ``--replay_batch_size`` distinct successes from the buffer, out of any group."""
        drawn = self.replay.sample(self.settings.replay_batch_size, rng) if self.settings.replay_batch_size else []
        return [Episode.from_dict({**e, "group": None}) for e in drawn]

    def update(self, episodes: list[Episode], play: Play, rng: np.random.Generator) -> UpdateResult:
        """The learner's update (:meth:`train`) on the fresh episodes and the successes drawn for them; then the
        fresh batch's successes are kept for later updates."""
        replayed = self.replayed(rng)
        result = self.train(episodes, replayed)
        for episode in episodes:
            self.replay.add(episode.to_dict())
        result.metrics.update(replayed=len(replayed), replay_size=len(self.replay))
        return result

    def train(self, episodes: list[Episode], replayed: list[Episode]) -> UpdateResult:
        """One update on the fresh ``episodes`` (in their groups) and the ``replayed`` successes."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {**super().state_dict(), "replay": self.replay.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "replay" in state:  # a checkpoint from before the group learners replayed has none: an empty buffer
            self.replay.load_state_dict(state["replay"])
