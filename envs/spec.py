"""What the rest of the code asks of an environment, in one place: its :class:`EnvSpec`.

Each environment module declares one ``SPEC``; ``envs.ENVS`` registers it by name. ``make_env``,
the flags' keywords (``env_kwargs``), the training curriculum, the held-out evaluation
episodes, ``envs.play`` and the flag checks all ask the spec, so that nothing outside ``envs/``
branches on an environment's name. A new environment is one file and one registry line.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from envs.base import TextEnv
from envs.curriculum import Curriculum


def _no_options(args, rng: np.random.Generator) -> dict:
    return {}


def _no_inputs(args, *, evaluation: bool) -> None:
    pass


@dataclass(frozen=True)
class EnvSpec:
    """One environment's entry in the registry.

    * ``make``: the environment class (or any factory taking its keywords).
    * ``settings(args, evaluation, run_dir, split)``: its own constructor keywords from the flags
      (``horizon``, ``shuffle_action``, ``text_layout`` and ``labels`` are every environment's, added by
      ``env_kwargs``);
      ``evaluation`` turns training-only randomisation off.
    * ``curriculum(args, max_steps)``: the training curriculum the flags describe (its training
      starts; a single level when no curriculum is on).
    * ``held_out(args, env)``: ``(reset options, level name)`` of each held-out unit (a curriculum
      level, a task, a problem); evaluation plays each from the held-out seeds, disjoint from training's.
    * ``validation(args, env)``: the same for the RL validation panel (``--eval_steps``), played from
      validation seeds, disjoint from the held-out and the training seeds; None: the held-out units.
    * ``play_options(args, rng)``: the reset options of one ``envs.play`` episode.
    * ``inputs(args, evaluation)``: check the files and folders the flags name (task files, repositories,
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
    curriculum: Callable[[Any, int], Curriculum]
    held_out: Callable[[Any, TextEnv], list[tuple[dict, str]]]
    validation: Callable[[Any, TextEnv], list[tuple[dict, str]]] | None = None
    play_options: Callable[[Any, np.random.Generator], dict] = _no_options
    inputs: Callable[..., None] = _no_inputs
    data_steps: tuple[str, ...] = ()
    own_flags: tuple[str, ...] = ()
    exclusive_flags: tuple[str, ...] = ()
    api_instructions: str | None = None
    api_evaluator: str = "evaluation.evaluate_gpt"

    def validation_units(self, args, env) -> list[tuple[dict, str]]:
        """``(reset options, level name)`` of each unit of the RL validation panel."""
        return (self.validation or self.held_out)(args, env)

    def kwargs(self, args, *, evaluation: bool = False, run_dir: Path | None = None, split: str | None = None,
               labels=None) -> dict:
        """All constructor keywords of ``make`` from the shared flags."""
        return {"horizon": args.horizon, "shuffle_action": args.shuffle_action, "labels": labels,
                "text_layout": args.text_layout,
                **self.settings(args, evaluation=evaluation, run_dir=run_dir, split=split)}
