"""What a rollout records: each episode's decisions (:class:`Decision`, :class:`Episode`), how an episode starts
(:class:`EpisodeStart`, a REFUEL branch's replay included), and the rollout's running totals (:class:`RolloutStats`,
with the clock on the two players' calls). The learners, evaluation and the data steps read episodes from here."""

import dataclasses
import functools
import hashlib
import time
from dataclasses import dataclass, field

from utils.draft_decoding import DraftStats


@dataclass
class Decision:
    """One policy step: what it saw, what it could pick, what it picked."""

    obs: str
    prompt: str
    valid: list[int]  # indices into the policy's label alphabet of the labels shown
    action: int  # index into the policy's label alphabet of the label chosen
    logprob: float  # log-probability of ``action`` under the behaviour policy, at the temperature
    entropy: float
    reflection: str | None = None
    reward: float = 0.0
    oracle: int | None = None
    state: str | None = None  # a digest of the environment's state key (``info["state_key"]``): equal states, equal keys


@dataclass
class Episode:
    seed: int
    options: dict
    level: str = ""
    decisions: list[Decision] = field(default_factory=list)
    success: bool = False
    cost: float = 0.0
    group: int | None = None  # episodes of one batch with the same group played the same start (--group_size)

    def costs(self) -> list[float]:
        return [-d.reward for d in self.decisions]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Episode":
        data = dict(data)
        data["decisions"] = [Decision(**d) for d in data["decisions"]]
        return cls(**data)


@dataclass
class EpisodeStart:
    """How to start an episode: the reset seed and options.

    For a REFUEL branch, ``replay`` holds an earlier episode's decisions up to and
    including the branch step h: steps before h are replayed as recorded (their
    states checked), and at step h the recorded state and reflection are reused but
    a fresh action is sampled.
    """

    seed: int
    options: dict
    level: str = ""
    replay: list[Decision] = field(default_factory=list)
    group: int | None = None  # the batch's starts played more than once share one (``--group_size``)

    @property
    def branch_step(self) -> int | None:
        return len(self.replay) - 1 if self.replay else None


@dataclass
class RolloutStats:
    """Running totals of one rollout object (per process)."""

    policy_tokens: int = 0
    reflection_prompt_tokens: int = 0
    reflection_new_tokens: int = 0
    truncated: int = 0  # prompts cut from the left at max_seq_length
    episodes: int = 0  # episodes played, a learner's extra ones (REFUEL's branches) included
    decisions: int = 0
    policy_hits: int = 0  # of those, answered from the policy's memo (PolicyMemo, --policy_memo) without a pass
    reflections: int = 0  # reflections asked for
    reflection_hits: int = 0  # of those, answered from the memo (ReflectionMemo) without generating
    drafts: DraftStats = field(default_factory=DraftStats)  # guessed reflection tokens (--draft_tokens)
    # wall-clock seconds in the two players' calls: where a rollout's time goes (RL's metrics, benchmarks)
    reflect_seconds: float = 0.0  # TwoPlayerRollout.reflect: the reflector's generation, memo look-ups included
    policy_seconds: float = 0.0  # TwoPlayerRollout.act: the policy's scoring pass (with gradient where kept)

    @property
    def reflection_hit_rate(self) -> float:
        return self.reflection_hits / self.reflections if self.reflections else 0.0

    @property
    def prompt_tokens(self) -> int:
        """Tokens of every prompt the two players read."""
        return self.policy_tokens + self.reflection_prompt_tokens


def _clocked(name: str):
    """Add a method's wall-clock seconds to ``self.stats.<name>`` (a :class:`RolloutStats` field)."""

    def wrap(method):
        @functools.wraps(method)
        def timed(self, *args, **kwargs):
            tic = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                setattr(self.stats, name, getattr(self.stats, name) + time.perf_counter() - tic)

        return timed

    return wrap


def state_digest(info: dict) -> str | None:
    """A short digest of the environment's state key (``info["state_key"]``), None where it gives none."""
    key = info.get("state_key")
    return None if key is None else hashlib.blake2b(key.encode("utf-8"), digest_size=8).hexdigest()

