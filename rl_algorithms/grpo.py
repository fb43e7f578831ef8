"""GRPO: group-relative advantages under PPO's clipped ratio, with an optional KL penalty to where RL started.

Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models" (2024),
with the outcome-supervised advantage; Liu et al., "Understanding R1-Zero-Like Training: A Critical
Perspective" (2025) for Dr. GRPO. With the K episodes of one start (``--group_size K``) and returns
R_1..R_K, every decision t of episode i gets

    grpo:     A_i = (R_i - mean(R)) / (std(R) + eps)        (std with Bessel's correction)
    dr_grpo:  A_i =  R_i - mean(R)                           (no scaling: Dr. GRPO's unbiased form)

and each of ``--ppo_epochs`` optimiser steps minimises, with r = pi / pi_behaviour at the action taken
(pi_behaviour: the log-probability recorded in the rollout),

    l_it = -min(r A_i, clip(r, 1 - clip, 1 + clip) A_i) + beta * KL_k3(pi || pi_ref) - c * H_it

    grpo:     (1/N) sum_i (1/|o_i|) sum_t l_it    (the per-episode mean over decisions: GRPO's per-token
                                                    normalisation, a decision playing a token's part)
    dr_grpo:  (1/N) sum_i sum_t l_it              (no length normalisation: Dr. GRPO)

over the batch's N episodes. ``beta`` is ``--kl_coef`` (0: off); pi_ref is the policy RL started from (its
trainable weights are kept, and saved with the learner's state so a resumed run compares with the same).
``c`` is ``--entropy_coef`` (0: off) and H_it the entropy of the policy's label distribution at the decision,
so the bonus is weighted over decisions as the loss is. With ``--replay_batch_size M`` the batch also holds up to
M replayed successes (``rl_algorithms/group.py``: their advantage against the fresh batch, their recorded
behaviour log-probabilities), and N counts them.
"""

import contextlib

import numpy as np
import torch

from rl_algorithms.base import Learner, UpdateResult, flat_decisions
from rl_algorithms.group import SuccessReplay, decision_advantages, group_members, group_relative
from rl_algorithms.losses import clipped_surrogate, kl_k3, ratio_figures
from rollout import Episode


class GRPO(SuccessReplay, Learner):
    def __init__(self, settings, scorer, accelerator):
        super().__init__(settings, scorer, accelerator)
        # the policy RL started from, for the KL penalty (its trainable weights; the rest never change)
        self.reference = [p.detach().clone() for p in self.policy_params] if settings.kl_coef > 0 else None

    @property
    def scaled(self) -> bool:
        return self.settings.grpo_variant == "grpo"

    def advantages(self, episodes: list[Episode], replayed: list[Episode] = ()) -> np.ndarray:
        """Each decision's advantage, in ``flat_decisions`` order: the fresh episodes', then the replayed ones'."""
        return self.episode_advantages(episodes, group_members(episodes), replayed)

    def episode_advantages(self, episodes: list[Episode], members: list[list[int]],
                           replayed: list[Episode] = ()) -> np.ndarray:
        """Each decision's share of its episode's group-relative advantage (``members``: the groups), then each
        replayed decision's share of its episode's advantage against the fresh batch."""
        return decision_advantages(episodes, replayed, lambda fresh: group_relative(fresh, members, self.scaled),
                                   self.scaled)

    def weights(self, episodes: list[Episode]) -> np.ndarray:
        """Each decision's weight in the loss (see the module's docstring)."""
        n = len(episodes)
        return np.concatenate([np.full(len(e.decisions), 1.0 / (n * (len(e.decisions) if self.scaled else 1)))
                               for e in episodes] or [np.zeros(0)])

    def train(self, episodes: list[Episode], replayed: list[Episode]) -> UpdateResult:
        batch = episodes + replayed
        decisions, _ = flat_decisions(batch)
        advantages, weights = self.advantages(episodes, replayed), self.weights(batch)
        old = torch.tensor([d.logprob for d in decisions])
        reference = self._reference_logprobs(decisions)
        clip, applied = self.settings.ppo_clip, True
        for _ in range(self.settings.ppo_epochs):
            total, log_ratios, kls = 0.0, [], []
            for scored in self.score(decisions):
                span = slice(scored.start, scored.start + len(scored.decisions))
                logp = scored.logprobs
                terms = -clipped_surrogate(logp, old[span].to(logp.device), logp.new_tensor(advantages[span]), clip)
                if reference is not None:
                    kl = kl_k3(logp, reference[span].to(logp.device))
                    terms = terms + self.settings.kl_coef * kl
                    kls.append(kl.detach().cpu())
                if scored.entropy is not None:
                    terms = terms - self.settings.entropy_coef * scored.entropy
                loss = (terms * logp.new_tensor(weights[span])).sum()
                loss.backward()
                total += loss.item()
                log_ratios.append((logp.detach() - old[span].to(logp.device)).cpu())
            ok, grad_norm = self.step(total)
            applied = applied and ok
        log_ratio = torch.cat(log_ratios) if log_ratios else torch.zeros(0)
        metrics = {"grad_norm": grad_norm, "advantage_abs": float(np.abs(advantages).mean()) if len(advantages) else 0.0,
                   **ratio_figures(log_ratio, clip)}
        if kls:
            metrics["kl_reference"] = float(torch.cat(kls).mean())
        return UpdateResult(total, applied, metrics)

    @torch.no_grad()
    def _reference_logprobs(self, decisions) -> torch.Tensor | None:
        """log pi_ref of each decision's action (None without the KL penalty)."""
        if self.reference is None:
            return None
        with self._reference_weights():
            return torch.cat([scored.logprobs.cpu() for scored in self.score(decisions)] or [torch.zeros(0)])

    @contextlib.contextmanager
    def _reference_weights(self):
        """The policy with the weights RL started from, for the duration of the block."""
        current = [p.detach().clone() for p in self.policy_params]
        with torch.no_grad():
            for p, value in zip(self.policy_params, self.reference, strict=True):
                p.copy_(value)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, value in zip(self.policy_params, current, strict=True):
                    p.copy_(value)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "reference": self.reference}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.reference is not None:
            saved = state.get("reference")
            if saved is None:
                raise ValueError("--kl_coef > 0, but the checkpoint resumed from kept no reference policy (it was "
                                 "trained without the KL penalty)")
            self.reference = [t.to(p.device) for t, p in zip(saved, self.policy_params, strict=True)]
