"""The learners' pure pieces: returns, losses and the critic head.

Costs, not rewards: an environment's reward is ``-cost``. The policy minimises cost,
so the REINFORCE loss pushes down the log-probability of costly actions.

All losses are summed over decisions and divided by the number of episodes in the
batch, so PG and the first PPO epoch (ratio 1) give the same gradient.
"""

from collections.abc import Sequence

import torch
from torch import nn


def cost_to_go(costs: Sequence[float]) -> list[float]:
    """Q_t = sum of the costs from step t to the end of the episode."""
    out, total = [], 0.0
    for cost in reversed(costs):
        total += cost
        out.append(total)
    return out[::-1]


def pg_loss(logprobs: torch.Tensor, costs_to_go: torch.Tensor, baseline: torch.Tensor | float,
            normaliser: int) -> torch.Tensor:
    """REINFORCE on the cost-to-go: sum_t log pi(a_t|s_t) (Q_t - b), divided by ``normaliser`` (the
    batch's episodes, or its decisions)."""
    return (logprobs * (costs_to_go - baseline)).sum() / normaliser


def clipped_surrogate(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                      clip: float) -> torch.Tensor:
    """PPO's clipped surrogate per decision: min(r A, clip(r, 1 - clip, 1 + clip) A), r = pi / pi_behaviour
    (to be maximised)."""
    ratio = torch.exp(logprobs - old_logprobs)
    return torch.minimum(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)


def ppo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, costs_to_go: torch.Tensor,
             baseline: torch.Tensor | float, clip: float, num_episodes: int) -> torch.Tensor:
    """Clipped surrogate with advantage -(Q_t - b) and ratio pi / pi_behaviour."""
    return -clipped_surrogate(logprobs, old_logprobs, -(costs_to_go - baseline), clip).sum() / num_episodes


def ratio_figures(log_ratio: torch.Tensor, clip: float) -> dict[str, float]:
    """How far a clipped-ratio learner moved from the behaviour policy, given log(pi / pi_behaviour) per decision:
    the largest ratio, the low-variance estimate of KL(behaviour || current), E[(r - 1) - log r], and the
    fraction of ratios outside the clip range."""
    if not len(log_ratio):
        return {"ppo_ratio_max": 1.0, "approx_kl": 0.0, "clip_fraction": 0.0}
    ratio = log_ratio.exp()
    return {"ppo_ratio_max": float(ratio.max()), "approx_kl": float(((ratio - 1) - log_ratio).mean()),
            "clip_fraction": float(((ratio - 1).abs() > clip).float().mean())}


def advantage_loss(logprobs: torch.Tensor, advantages: torch.Tensor, normaliser: int) -> torch.Tensor:
    """REINFORCE with given advantages (higher: better): -sum_t A_t log pi(a_t|s_t) / ``normaliser``."""
    return -(logprobs * advantages).sum() / normaliser


def kl_k3(logprobs: torch.Tensor, reference_logprobs: torch.Tensor) -> torch.Tensor:
    """Per decision, the unbiased, non-negative estimator of KL(pi || pi_ref) that GRPO uses (Schulman's k3):
    pi_ref/pi - log(pi_ref/pi) - 1, at the action taken."""
    log_ratio = reference_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1


def refuel_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, branch_logprobs: torch.Tensor,
                branch_old_logprobs: torch.Tensor, returns: torch.Tensor, branch_returns: torch.Tensor,
                eta: float) -> torch.Tensor:
    """REFUEL: regress the difference of log-ratio gains on the difference of returns.

    ``((log pi(a_h) - log pi_old(a_h)) - (log pi(a'_h) - log pi_old(a'_h)) - eta (G_h - G'_h))^2``,
    averaged over the pairs.
    """
    gain = (logprobs - old_logprobs) - (branch_logprobs - branch_old_logprobs)
    return ((gain - eta * (returns - branch_returns)) ** 2).mean()


def value_loss(values: torch.Tensor, costs_to_go: torch.Tensor) -> torch.Tensor:
    return ((values - costs_to_go) ** 2).mean()


class ValueHead(nn.Module):
    """A critic on the policy's last hidden state at the action marker: predicts the cost-to-go.

    ``linear`` (one layer) or ``mlp`` (a hidden layer of the same width, LayerNorm and ReLU, the
    paper's ``--critic_layer_type mlp``). The output layer starts at zero, so the first baseline is 0.
    """

    def __init__(self, hidden_size: int, layer_type: str = "linear"):
        super().__init__()
        if layer_type not in ("linear", "mlp"):
            raise ValueError(f"--critic_layer_type: {layer_type!r} is not linear or mlp")
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.hidden = None
        if layer_type == "mlp":
            first = nn.Linear(hidden_size, hidden_size)
            nn.init.xavier_uniform_(first.weight)
            nn.init.zeros_(first.bias)
            self.hidden = nn.Sequential(first, nn.LayerNorm(hidden_size), nn.ReLU())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.hidden is not None:
            hidden = self.hidden(hidden)
        return self.linear(hidden).squeeze(-1)
