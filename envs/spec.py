"""What the rest of the code asks of an environment, in one place: its :class:`EnvSpec`, and the flags it reads.

Each environment module declares one ``SPEC``; ``envs.ENVS`` registers it by name. ``make_env``,
the flags' keywords (``env_kwargs``), the training curriculum, the held-out evaluation
episodes, ``envs.play`` and the flag checks all ask the spec, so that nothing outside ``envs/``
branches on an environment's name. A new environment is one file and one registry line.
What the environments read of the flags is :class:`EnvSettings`, built once at the entry point.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from envs.base import TextEnv
from envs.curriculum import Curriculum
from utils.arg_fields import flag_values


@dataclass(frozen=True)
class EnvSettings:
    """All the environments read of the flags, given to them explicitly (:meth:`from_args`): each spec's
    callables below take it."""

    env: str
    horizon: int | None
    shuffle_action: bool
    text_layout: str
    first_step: bool
    oracle_completion: bool
    # the training curriculum
    max_steps: int
    curriculum_steps: tuple[int, ...] | None
    curriculum_index: int | None
    taxi_curriculum: bool
    depth_curriculum: bool
    merge_first_two: bool
    merge_after_first_k: int
    few_data: int
    # Taxi's
    with_prompt: bool
    with_history: bool
    taxi_depot_letters: bool
    danger_on_first_step: bool
    pickup_reward: str
    # AutoExplore's
    easy: bool
    auto_explore_costs: str
    auto_explore_targets: str
    leaveout_prob: float
    auto_explore_view_tokens: int
    sandbox_dir: str | None
    repo_dir: str | None
    task_file: str | None
    validation_task_file: str | None
    eval_steps: int  # RL's validation panel: whether its task file is checked
    # ALFWorld's
    alfworld_data: str | None
    alfworld_task: str
    alfworld_split: str
    alfworld_expert: str
    alfworld_history_steps: int
    alfworld_timeout: float

    @classmethod
    def from_args(cls, args) -> "EnvSettings":
        return cls(**flag_values(cls, args))


def _no_options(settings: EnvSettings, rng: np.random.Generator) -> dict:
    return {}


def _no_inputs(settings: EnvSettings, *, evaluation: bool) -> None:
    pass


@dataclass(frozen=True)
class EnvSpec:
    """One environment's entry in the registry.

    Each callable takes the run's :class:`EnvSettings` (``env_settings``) first.

    * ``make``: the environment class (or any factory taking its keywords).
    * ``settings(env_settings, evaluation, run_dir, split)``: its own constructor keywords from the flags
      (``horizon``, ``shuffle_action``, ``text_layout`` and ``labels`` are every environment's, added by
      ``env_kwargs``);
      ``evaluation`` turns training-only randomisation off.
    * ``curriculum(env_settings, max_steps)``: the training curriculum the flags describe (its training
      starts; a single level when no curriculum is on).
    * ``held_out(env_settings, env)``: ``(reset options, level name)`` of each held-out unit (a curriculum
      level, a task, a problem); evaluation plays each from the held-out seeds, disjoint from training's.
    * ``validation(env_settings, env)``: the same for the RL validation panel (``--eval_steps``), played from
      validation seeds, disjoint from the held-out and the training seeds; None: the held-out units.
    * ``play_options(env_settings, rng)``: the reset options of one ``envs.play`` episode.
    * ``inputs(env_settings, evaluation)``: check the files and folders the flags name (task files, repositories,
      data roots), so that a bad one stops a run with one line (``UsageError``) before a model is loaded or
      a run folder made, not when the first environment is built.
    * ``data_steps``: the modules of its data pipeline, in order.
    * ``own_flags``: flags that mean something for this environment alone (set for another, they
      are reported); ``exclusive_flags``: the same, but an error for another environment.
    * ``api_instructions``: the system message of an API model playing it (``evaluation.gpt_agent``);
      ``api_evaluator``: the module that evaluates an API model on it.
    """

    name: str
    make: Callable[..., TextEnv]
    settings: Callable[..., dict]
    curriculum: Callable[[EnvSettings, int], Curriculum]
    held_out: Callable[[EnvSettings, TextEnv], list[tuple[dict, str]]]
    validation: Callable[[EnvSettings, TextEnv], list[tuple[dict, str]]] | None = None
    play_options: Callable[[EnvSettings, np.random.Generator], dict] = _no_options
    inputs: Callable[..., None] = _no_inputs
    data_steps: tuple[str, ...] = ()
    own_flags: tuple[str, ...] = ()
    exclusive_flags: tuple[str, ...] = ()
    api_instructions: str | None = None
    api_evaluator: str = "evaluation.evaluate_gpt"

    def validation_units(self, env_settings: EnvSettings, env) -> list[tuple[dict, str]]:
        """``(reset options, level name)`` of each unit of the RL validation panel."""
        return (self.validation or self.held_out)(env_settings, env)

    def kwargs(self, env_settings: EnvSettings, *, evaluation: bool = False, run_dir: Path | None = None,
               split: str | None = None, labels=None) -> dict:
        """All constructor keywords of ``make`` from the shared flags."""
        return {"horizon": env_settings.horizon, "shuffle_action": env_settings.shuffle_action, "labels": labels,
                "text_layout": env_settings.text_layout,
                **self.settings(env_settings, evaluation=evaluation, run_dir=run_dir, split=split)}
