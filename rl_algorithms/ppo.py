"""PPO: ``--ppo_epochs`` clipped-surrogate steps on each batch of episodes.

The behaviour log-probabilities are those recorded in the rollout, so the first epoch's
gradient equals REINFORCE's. Reports the approximate KL to the behaviour policy and the
fraction of clipped ratios of the last epoch.
"""

import numpy as np
import torch

from rl_algorithms.base import Learner, Play, UpdateResult, flat_decisions
from rl_algorithms.losses import ppo_loss, ratio_figures
from rollout import Episode


class PPO(Learner):
    def update(self, episodes: list[Episode], play: Play, rng: np.random.Generator) -> UpdateResult:
        decisions, q = flat_decisions(episodes)
        old = torch.tensor([d.logprob for d in decisions])
        clip = self.settings.ppo_clip
        applied = True
        for epoch in range(self.settings.ppo_epochs):
            total, log_ratios = 0.0, []
            for scored in self.score(decisions):
                end = scored.start + len(scored.decisions)
                q_chunk = q[scored.start:end].to(scored.logprobs.device)
                old_chunk = old[scored.start:end].to(scored.logprobs.device)
                loss = ppo_loss(scored.logprobs, old_chunk, q_chunk,
                                self.baseline(q.to(q_chunk.device), scored.values), clip, len(episodes))
                loss = loss - self.entropy_bonus(scored, len(episodes))
                loss = loss + self.critic_term(scored, q_chunk, len(decisions), collect=epoch == 0)
                loss.backward()
                total += loss.item()
                log_ratios.append((scored.logprobs.detach() - old_chunk).cpu())
            ok, grad_norm = self.step(total)
            applied = applied and ok
        log_ratio = torch.cat(log_ratios) if log_ratios else torch.zeros(0)
        critic = {"critic_loss": self.train_critic_on_schedule(rng)} if self.critic_schedule else {}
        return UpdateResult(total, applied, {**critic, "grad_norm": grad_norm, **ratio_figures(log_ratio, clip)})
