"""The buffer of recent successful episodes that PG (``rl_algorithms/pg.py``) and the group learners
(``rl_algorithms/group.py``, :class:`SuccessReplay`) replay alongside fresh ones."""

from collections import deque

import numpy as np


class ReplayBuffer:
    """The most recent successful episodes (as dicts), sampled alongside fresh data."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.episodes: deque = deque(maxlen=capacity if capacity > 0 else 0)

    def __len__(self) -> int:
        return len(self.episodes)

    def add(self, episode: dict) -> None:
        if self.capacity > 0 and episode["success"]:
            self.episodes.append(episode)

    def clear(self) -> None:
        self.episodes.clear()

    def draw(self, count: int, rng: np.random.Generator) -> list[dict]:
        """``count`` episodes drawn uniformly with replacement (none from an empty buffer)."""
        if not self.episodes:
            return []
        return [self.episodes[int(i)] for i in rng.integers(len(self.episodes), size=count)]

    def sample(self, count: int, rng: np.random.Generator) -> list[dict]:
        """Up to ``count`` distinct episodes, uniformly."""
        count = min(count, len(self.episodes))
        if count == 0:
            return []
        picks = rng.choice(len(self.episodes), size=count, replace=False)
        return [self.episodes[int(i)] for i in sorted(picks)]

    def state_dict(self) -> dict:
        return {"capacity": self.capacity, "episodes": list(self.episodes)}

    def load_state_dict(self, state: dict) -> None:
        self.capacity = state["capacity"]
        self.episodes = deque(state["episodes"], maxlen=self.capacity if self.capacity > 0 else 0)
