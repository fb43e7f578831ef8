"""What the group learners (RLOO, GRPO, GiGPO) share: a batch's groups, the episodes' returns, and the
group-relative baselines.

``--group_size K`` plays each start K times per iteration (``rl_finetune.episode_starts``); the episodes of
one start carry the same ``Episode.group``. A group learner compares each episode with the others of its
group instead of subtracting a learned or batch-wide baseline. Returns are rewards (higher: better),
``-cost``: the sum of the episode's rewards.
"""

import torch

from rollout_records import Episode

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
