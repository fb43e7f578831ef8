"""What the three environments share: text spaces, choice labels and the step contract.

An environment shows a state text followed by its *action head* line and the valid
actions, each behind a choice label (``labels``: the paper's ``prompts.LABELS`` unless the
policy's tokenizer needs its own alphabet, see ``prompts.label_alphabet``). The agent answers with a
label. Subclasses implement :meth:`TextEnv._reset` and :meth:`TextEnv._act`; this
class does the labelling, rendering, the ``info`` dict and the invalid-label rule.

``info`` always holds ``labels`` (valid labels, in display order), ``actions`` (their
command texts, aligned), ``oracle_label`` (an optimal next label, or None) and ``state_key`` (what
identifies the state whatever path led to it, :meth:`TextEnv._state_key`); at the
end of an episode also ``success`` and ``cost`` (the episode's total cost = -return).
A label outside the current list (an unusable answer) is a wasted step: the state stays
unchanged, the reward is what a step that achieves nothing earns (:meth:`TextEnv._wasted_step_reward`:
Taxi's move cost, AutoExplore's step cost, 0 in ALFWorld, whose steps cost nothing), and
``info["invalid_label"]`` is set; it counts towards the horizon.

``text_layout`` (:data:`prompts.TEXT_LAYOUTS`): ``ours``, or ``paper``, where an environment
arranges its text in the paper's structure (its own words still) and the prompts place the
analyze marker and the instruction as the paper's code does (``prompts.py``).

Two bandits shape an episode's first decision, for an environment that implements the hooks below:
``first_step`` (the paper's): the episode ends after that decision, scored on its own;
``oracle_completion`` (this project's): the oracle plays the episode out after it (:meth:`TextEnv._play_oracle_out`)
and the whole return is the decision's reward; ``success`` is then "the decision was optimal (the
return equals the oracle's own, :meth:`TextEnv._oracle_return`) and the task got solved", not merely
solved, as a played-out episode almost always is.

``shuffle_action`` draws the labels shown from the whole label set, in the order of the
commands (the paper's AutoExplore); an environment with ``shuffle_within_shown`` permutes the
first n labels instead and lists the commands in label order (the paper's ALFWorld).
"""

from dataclasses import dataclass, field

import gymnasium
import numpy as np
from gymnasium import spaces

from prompts import LABELS, TEXT_LAYOUTS, menu_line

MAX_OBS_CHARS = 1_000_000


class FreeText(spaces.Space[str]):
    """Any string up to ``max_length`` characters (observations hold file contents)."""

    def __init__(self, max_length: int = MAX_OBS_CHARS, seed=None):
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_length = max_length

    def contains(self, x) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(self, mask=None, probability=None) -> str:
        length = int(self.np_random.integers(0, 64))
        return "".join(chr(c) for c in self.np_random.integers(32, 127, size=length))

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"FreeText(max_length={self.max_length})"

    def __eq__(self, other) -> bool:
        return isinstance(other, FreeText) and other.max_length == self.max_length


class LabelSpace(spaces.Space[str]):
    """A finite set of choice labels; ``sample`` picks one uniformly."""

    def __init__(self, labels=LABELS, seed=None):
        super().__init__(shape=None, dtype=None, seed=seed)
        self.labels = tuple(labels)

    def contains(self, x) -> bool:
        return isinstance(x, str) and x in self.labels

    def sample(self, mask=None, probability=None) -> str:
        return self.labels[int(self.np_random.integers(len(self.labels)))]

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"LabelSpace({len(self.labels)} labels)"

    def __eq__(self, other) -> bool:
        return isinstance(other, LabelSpace) and other.labels == self.labels


@dataclass
class Outcome:
    """What a subclass's ``_act`` returns: the step's reward and whether it ended the episode."""

    reward: float
    terminated: bool = False
    truncated: bool = False
    info: dict = field(default_factory=dict)


class TextEnv(gymnasium.Env):
    """Base of the text environments; see the module docstring for the contract."""

    metadata = {"render_modes": ["ansi"]}
    action_head: str = "The actions you can take now is:"
    analyze_instruction: str = ""
    paper_instructs: bool = False  # does the paper's code give its reflector an instruction (Taxi only)?
    default_horizon: int = 20
    shuffle_within_shown: bool = False
    # The game runs in another process (ALFWorld): a batch's resets and steps wait on several at once.
    plays_elsewhere: bool = False

    def __init__(self, horizon: int | None = None, shuffle_action: bool = False, render_mode: str | None = None,
                 labels=None, text_layout: str = "ours", first_step: bool = False, oracle_completion: bool = False):
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if first_step and oracle_completion:
            raise ValueError("first_step and oracle_completion are two different bandits; choose one")
        self.first_step = first_step
        self.oracle_completion = oracle_completion
        self._first_optimal: bool | None = None  # oracle_completion: was the first decision optimal (and solved)?
        if text_layout not in TEXT_LAYOUTS:
            raise ValueError(f"text_layout must be one of {TEXT_LAYOUTS}, got {text_layout!r}")
        self.text_layout = text_layout
        self.horizon = horizon or self.default_horizon
        if self.horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {self.horizon}")
        self.shuffle_action = shuffle_action
        self.render_mode = render_mode
        self.observation_space = FreeText()
        self.label_set: tuple[str, ...] = LABELS if labels is None else tuple(labels)
        if not self.label_set or len(set(self.label_set)) != len(self.label_set):
            raise ValueError(f"labels must be distinct and at least one, got {self.label_set!r}")
        self.action_space = LabelSpace(self.label_set if shuffle_action else self.label_set[: self.max_actions()])
        self._labels: list[str] = []
        self._actions: list[str] = []
        self._obs = ""
        self.steps = 0
        self.total_reward = 0.0
        self.done = True

    # --- what subclasses implement -------------------------------------------------

    def max_actions(self) -> int:
        """Upper bound on the action-list length (sizes the label space without shuffling)."""
        return len(self.label_set)

    def _reset(self, options: dict) -> None:
        """Start an episode (randomness only from ``self.np_random``)."""
        raise NotImplementedError

    def _state_text(self) -> str:
        """The observation before the action head."""
        raise NotImplementedError

    def _action_texts(self) -> list[str]:
        """The valid actions now, in display order."""
        raise NotImplementedError

    def _act(self, index: int) -> Outcome:
        """Apply action ``index`` of :meth:`_action_texts`."""
        raise NotImplementedError

    def _oracle_index(self) -> int | None:
        """Index of an optimal next action, or None if the env knows none."""
        return None

    def _solved(self, total_reward: float) -> bool:
        """Whether an episode with this return solved the task."""
        raise NotImplementedError

    def _success(self) -> bool:
        if self._first_optimal is not None:
            return self._first_optimal
        return self._solved(self.total_reward)

    def _oracle_return(self) -> float:
        """oracle_completion: the return of the oracle playing the episode from here, leaving it unchanged."""
        raise NotImplementedError

    def _play_oracle_out(self, outcome: Outcome) -> None:
        """oracle_completion: the oracle plays the rest of the episode; its rewards are added to ``outcome``."""
        raise NotImplementedError

    @classmethod
    def instruction(cls, layout: str) -> str:
        """The reflector's instruction in the text ``layout``: ours, or none where the paper's code gives none."""
        return cls.analyze_instruction if layout != "paper" or cls.paper_instructs else ""

    # --- the gymnasium API -----------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.steps = 0
        self.total_reward = 0.0
        self.done = False
        self._first_optimal = None
        self._reset(dict(options or {}))
        return self._observe(), self._info()

    def step(self, label: str):
        if self.done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        self.steps += 1
        if label not in self._labels:
            outcome = Outcome(reward=self._wasted_step_reward(), info={"invalid_label": True})
        else:
            outcome = self._decide(self._labels.index(label))
        truncated = outcome.truncated or (not outcome.terminated and self.steps >= self.horizon)
        if truncated and not outcome.truncated:
            outcome.reward += self._truncation_reward()
        self.total_reward += outcome.reward
        self.done = outcome.terminated or truncated
        if outcome.info.get("invalid_label") and not self.done:
            obs = self._obs  # the state, and the labels shown, stay as they were
        else:
            obs = self._observe() if not self.done else self._final_observation()
        info = self._info()
        info.update(outcome.info)
        if self.done:
            info["success"] = bool(self._success())
            info["cost"] = -self.total_reward
        return obs, float(outcome.reward), bool(outcome.terminated), bool(truncated), info

    def _decide(self, index: int) -> Outcome:
        """Apply action ``index``, the first decision as the bandit modes shape it (see the module docstring)."""
        if not (self.oracle_completion and self.steps == 1):
            outcome = self._act(index)
            outcome.terminated = outcome.terminated or self.first_step
            return outcome
        best = self._oracle_return()
        outcome = self._act(index)
        if not outcome.terminated:
            self._play_oracle_out(outcome)
            outcome.terminated = True
        self._first_optimal = outcome.reward >= best - 1e-9 and self._solved(outcome.reward)
        return outcome

    def render(self):
        if self.render_mode == "ansi":
            return self._obs
        return None

    # --- helpers -----------------------------------------------------------------

    def _wasted_step_reward(self) -> float:
        """The reward of a step that changes nothing (an invalid label): the environment's step cost."""
        return 0.0

    def _truncation_reward(self) -> float:
        """Extra reward when the horizon runs out (AutoExplore charges the failure here)."""
        return 0.0

    def _final_observation(self) -> str:
        return self._observe()

    def _observe(self) -> str:
        self._actions = list(self._action_texts())
        if len(self._actions) > len(self.label_set):
            raise RuntimeError(f"{len(self._actions)} actions but only {len(self.label_set)} labels")
        count = len(self._actions)
        if self.shuffle_action:
            pool = count if self.shuffle_within_shown else len(self.label_set)
            picks = self.np_random.choice(pool, size=count, replace=False)
            self._labels = [self.label_set[i] for i in picks]
        else:
            self._labels = list(self.label_set[:count])
        shown = zip(self._labels, self._actions)
        if self.shuffle_within_shown:
            shown = sorted(shown, key=lambda pair: self.label_set.index(pair[0]))
        listing = "".join(menu_line(label, action) for label, action in shown)
        self._obs = f"{self._state_text()}{self.action_head}\n{listing}"
        return self._obs

    def _info(self) -> dict:
        index = None if self.done else self._oracle_index()
        return {
            "labels": list(self._labels),
            "actions": list(self._actions),
            "oracle_label": None if index is None else self._labels[index],
            "state_key": self._state_key(),
        }

    def _state_key(self) -> str:
        """What identifies the current state whatever path led to it (``info["state_key"]``): equal keys, the
        same situation. GiGPO groups the steps of a start's episodes by it (``rl_algorithms/gigpo.py``). The
        default is the state text; an environment whose text carries the history overrides it."""
        return self._state_text()

    @property
    def labels(self) -> list[str]:
        return list(self._labels)

    @property
    def observation(self) -> str:
        return self._obs

    def label_of(self, action: str) -> str:
        """The label currently shown for the command ``action``."""
        return self._labels[self._actions.index(action)]


def rng_seed(generator: np.random.Generator) -> int:
    """A seed for a component that takes an integer, drawn from ``generator``."""
    return int(generator.integers(2**31 - 1))
