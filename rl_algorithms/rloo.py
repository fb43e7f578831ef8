"""RLOO: REINFORCE with the leave-one-out baseline of the other episodes of the same start.

Kool, van Hoof and Welling, "Buy 4 REINFORCE Samples, Get a Baseline for Free!" (ICLR 2019 workshop);
Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback
in LLMs" (ACL 2024). With K episodes of one start (``--group_size K``) and returns R_1..R_K, episode i's
advantage is

    A_i = R_i - (1 / (K - 1)) * sum_{j != i} R_j,

given to every decision of the episode (an outcome-level advantage), and one optimiser step minimises
-sum_i A_i sum_t log pi(a_t | s_t) / N over the batch's N episodes. No critic, no replay buffer.
"""

import numpy as np

from rl_algorithms.base import Learner, Play, UpdateResult, flat_decisions
from rl_algorithms.group import episode_returns, group_members, leave_one_out, per_decision
from rl_algorithms.losses import advantage_loss
from rollout_records import Episode


class RLOO(Learner):
    def advantages(self, episodes: list[Episode]) -> np.ndarray:
        """Each decision's advantage, in ``flat_decisions`` order."""
        return per_decision(episodes, leave_one_out(episode_returns(episodes), group_members(episodes))).numpy()

    def update(self, episodes: list[Episode], play: Play, rng: np.random.Generator) -> UpdateResult:
        decisions, _ = flat_decisions(episodes)
        advantages = self.advantages(episodes)
        total = 0.0
        for scored in self.score(decisions):
            chunk = advantages[scored.start:scored.start + len(scored.decisions)]
            loss = advantage_loss(scored.logprobs, scored.logprobs.new_tensor(chunk), len(episodes))
            loss.backward()
            total += loss.item()
        applied, grad_norm = self.step(total)
        return UpdateResult(total, applied, {"grad_norm": grad_norm,
                                             "advantage_abs": float(np.abs(advantages).mean()) if len(advantages) else 0.0})
