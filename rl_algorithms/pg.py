"""REINFORCE on the cost-to-go, with replay of recent successes (the paper's learner).

Each update trains on the fresh episodes plus up to ``--replay_batch_size`` successful
episodes drawn from a buffer of the last ``--replay_buffer_size`` successes (``--replay_mode
separate``, the paper's code: a step on the fresh episodes, then a step on one success drawn
with replacement; the buffer is emptied at each new curriculum level); with
``--baseline critic`` a value head on the policy's hidden state learns the cost-to-go
alongside (in the policy's step, or on the paper's ``--critic_update_freq`` schedule).
"""

import numpy as np
import torch

from rl_algorithms.base import Learner, Play, UpdateResult, flat_decisions
from rl_algorithms.losses import pg_loss
from rl_algorithms.replay import ReplayBuffer
from rollout import Episode


class PolicyGradient(Learner):
    def __init__(self, settings, scorer, accelerator):
        super().__init__(settings, scorer, accelerator)
        self.replay = ReplayBuffer(settings.replay_buffer_size)
        self.level: str | None = None  # the curriculum level of the last batch (--replay_mode separate)

    def update(self, episodes: list[Episode], play: Play, rng: np.random.Generator) -> UpdateResult:
        if self.settings.replay_mode == "separate":
            return self._update_separately(episodes, rng)
        replayed = [Episode.from_dict(e) for e in self.replay.sample(self.settings.replay_batch_size, rng)]
        total, applied, grad_norm, critic_total = self._train(episodes + replayed)
        for episode in episodes:
            self.replay.add(episode.to_dict())
        return self._result(total, applied, grad_norm, critic_total, len(replayed), rng)

    def _update_separately(self, episodes: list[Episode], rng: np.random.Generator) -> UpdateResult:
        """The paper's replay: a step on the fresh episodes, then one on a success drawn (with replacement)
        from the buffer, which is emptied whenever the curriculum moves to another level."""
        level = episodes[0].level if episodes else None
        if level != self.level:
            self.replay.clear()
            self.level = level
        drawn = [Episode.from_dict(e) for e in self.replay.draw(1, rng)]
        total, applied, grad_norm, critic_total = self._train(episodes)
        if drawn:
            replay_loss, replay_applied, _, _ = self._train(drawn)
        result = self._result(total, applied, grad_norm, critic_total, len(drawn), rng)
        if drawn:
            result.metrics["replay_loss"] = replay_loss
            result.metrics["replay_applied"] = replay_applied
        for episode in episodes:
            self.replay.add(episode.to_dict())
        result.metrics["replay_size"] = len(self.replay)
        return result

    def _train(self, batch: list[Episode]) -> tuple[float, bool, float | None, float]:
        """One optimiser step of REINFORCE (and the critic) on ``batch``."""
        decisions, q = flat_decisions(batch)
        # --pg_normalize: the summed loss per episode (ours) or per decision (the paper's code)
        norm = len(batch) if self.settings.pg_normalize == "episodes" else len(decisions)
        total, critic_total = 0.0, 0.0
        for scored in self.score(decisions):
            q_chunk = q[scored.start:scored.start + len(scored.decisions)].to(scored.logprobs.device)
            loss = pg_loss(scored.logprobs, q_chunk, self.baseline(q.to(q_chunk.device), scored.values), norm)
            loss = loss - self.entropy_bonus(scored, norm)
            critic_loss = self.critic_term(scored, q_chunk, len(decisions))
            if torch.is_tensor(critic_loss):
                critic_total += critic_loss.item()
                loss = loss + critic_loss
            loss.backward()
            total += loss.item()
        applied, grad_norm = self.step(total)
        return total, applied, grad_norm, critic_total

    def _result(self, total: float, applied: bool, grad_norm, critic_total: float, replayed: int,
                rng: np.random.Generator) -> UpdateResult:
        metrics = {"grad_norm": grad_norm, "replayed": replayed, "replay_size": len(self.replay)}
        if self.critic_schedule:
            metrics["critic_loss"] = self.train_critic_on_schedule(rng)
        elif self.critic is not None:
            metrics["critic_loss"] = critic_total
        return UpdateResult(total, applied, metrics)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "replay": self.replay.state_dict(), "level": self.level}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.replay.load_state_dict(state["replay"])
        self.level = state.get("level")
