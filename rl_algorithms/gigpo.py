"""GiGPO: GRPO's episode-level group advantage plus a step-level one, from the steps of a start's episodes
that reach the same state.

Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training" (2025; verl-agent). The K episodes
of one start (``--group_size K``) form the episode-level group, as in GRPO (``rl_algorithms/grpo.py``):
A^E_i from the episodes' returns. Within that group, the decisions taken in the same environment state (the
same ``Decision.state``, a digest of the environment's ``info["state_key"]``: Taxi's decoded state,
ALFWorld's game, last observation and admissible commands, AutoExplore's task, directory and files read)
form an *anchor-state group*. Decision t of episode i has the discounted return from that step,

    G_it = sum_{k >= t} gamma^(k - t) r_ik                     (gamma: --gigpo_gamma)

and its step-level advantage is G_it against its anchor group's, normalised as the episode level is
(``--grpo_variant``: by the group's standard deviation, or not):

    A^S_it = (G_it - mean(G over the anchor group)) / (std + eps)      (0 in an anchor group of one)

The advantage is A_it = A^E_i + omega * A^S_it (omega: ``--gigpo_weight``), under GRPO's clipped ratio,
weights, optional KL term, entropy bonus and replay of successes. No critic: the step groups come from states
that recur, which in Taxi they do.
"""

from collections import defaultdict

import numpy as np
import torch

from rl_algorithms.group import group_members, group_relative
from rl_algorithms.grpo import GRPO
from rollout import Episode


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    """G_t = sum_{k >= t} gamma^(k - t) r_k for every step t."""
    out, total = [], 0.0
    for reward in reversed(rewards):
        total = reward + gamma * total
        out.append(total)
    return out[::-1]


def anchor_groups(episodes: list[Episode], members: list[list[int]]) -> list[list[int]]:
    """The decisions (indices in ``flat_decisions`` order) taken in the same state within one episode group."""
    offsets = np.cumsum([0] + [len(e.decisions) for e in episodes])
    anchors = []
    for indices in members:
        by_state: dict[str, list[int]] = defaultdict(list)
        for i in indices:
            for t, decision in enumerate(episodes[i].decisions):
                if decision.state is None:
                    raise ValueError("GiGPO groups steps by the environment's state key, and this environment gives "
                                     "none (info['state_key'])")
                by_state[decision.state].append(int(offsets[i]) + t)
        anchors += list(by_state.values())
    return anchors


class GiGPO(GRPO):
    def advantages(self, episodes: list[Episode], replayed: list[Episode] = ()) -> np.ndarray:
        """Each decision's advantage, in ``flat_decisions`` order: the fresh episodes', then the replayed ones'
        (a replayed success's step-level advantage is 0: its steps are in no anchor group of the batch)."""
        members = group_members(episodes)
        episode_level = self.episode_advantages(episodes, members, replayed)
        step_returns = torch.tensor([g for e in episodes for g in discounted_returns(
            [d.reward for d in e.decisions], self.settings.gigpo_gamma)], dtype=torch.float64)
        step_level = group_relative(step_returns, anchor_groups(episodes, members), self.scaled).numpy()
        step_level = np.concatenate([step_level, np.zeros(sum(len(e.decisions) for e in replayed))])
        return episode_level + self.settings.gigpo_weight * step_level
