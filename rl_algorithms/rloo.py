"""RLOO: REINFORCE with the leave-one-out baseline of the other episodes of the same start.

Kool, van Hoof and Welling, "Buy 4 REINFORCE Samples, Get a Baseline for Free!" (ICLR 2019 workshop);
Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback
in LLMs" (ACL 2024). With K episodes of one start (``--group_size K``) and returns R_1..R_K, episode i's
advantage is

    A_i = R_i - (1 / (K - 1)) * sum_{j != i} R_j,

given to every decision of the episode (an outcome-level advantage), and one optimiser step minimises

    ( -sum_i A_i sum_t log pi(a_t | s_t)  -  c * sum_i sum_t H_t ) / N

over the batch's N episodes (c: ``--entropy_coef``, H_t: the entropy of the policy's label distribution at
decision t). No critic. With ``--replay_batch_size M`` the batch also holds up to M replayed successes, each
with its return against the fresh batch's mean (``rl_algorithms/group.py``), and N counts them.
"""

import numpy as np

from rl_algorithms.base import Learner, UpdateResult, flat_decisions
from rl_algorithms.group import SuccessReplay, decision_advantages, group_members, leave_one_out
from rl_algorithms.losses import advantage_loss
from rollout import Episode


class RLOO(SuccessReplay, Learner):
    def advantages(self, episodes: list[Episode], replayed: list[Episode] = ()) -> np.ndarray:
        """Each decision's advantage, in ``flat_decisions`` order: the fresh episodes', then the replayed ones'."""
        members = group_members(episodes)
        return decision_advantages(episodes, replayed, lambda fresh: leave_one_out(fresh, members), scale=False)

    def train(self, episodes: list[Episode], replayed: list[Episode]) -> UpdateResult:
        batch = episodes + replayed
        decisions, _ = flat_decisions(batch)
        advantages = self.advantages(episodes, replayed)
        total = 0.0
        for scored in self.score(decisions):
            chunk = advantages[scored.start:scored.start + len(scored.decisions)]
            loss = advantage_loss(scored.logprobs, scored.logprobs.new_tensor(chunk), len(batch))
            loss = loss - self.entropy_bonus(scored, len(batch))
            loss.backward()
            total += loss.item()
        applied, grad_norm = self.step(total)
        return UpdateResult(total, applied, {"grad_norm": grad_norm,
                                             "advantage_abs": float(np.abs(advantages).mean()) if len(advantages) else 0.0})
