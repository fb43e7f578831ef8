"""Text environments behind one gymnasium API: DangerousTaxi, AutoExplore, ALFWorld.

``ENVS`` registers each environment's :class:`~envs.spec.EnvSpec` (one line each);
``make_env(name, **kwargs)`` builds one; ``env_kwargs(args, ...)`` turns the shared
``ScriptArguments`` into the keyword arguments of the chosen environment, so every
script configures environments the same way. See ``envs/base.py`` for the contract.
"""

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from envs import alfworld, auto_explore_spec, taxi
from envs.base import TextEnv
from envs.curriculum import Curriculum
from envs.spec import EnvSpec
from utils.errors import UsageError

# The registry: one line per environment (its module declares the spec).
ENVS: dict[str, EnvSpec] = {spec.name: spec for spec in (taxi.SPEC, auto_explore_spec.SPEC, alfworld.SPEC)}


def env_spec(name: str) -> EnvSpec:
    try:
        return ENVS[name]
    except KeyError:
        raise ValueError(f"unknown environment {name!r}; choose from {tuple(ENVS)}") from None


def make_env(name: str, **kwargs) -> TextEnv:
    return env_spec(name).make(**kwargs)


def env_kwargs(args, *, evaluation: bool = False, run_dir: Path | None = None, split: str | None = None,
               labels=None) -> dict:
    """Keyword arguments of ``make_env(args.env, ...)`` from the shared flags (see EnvSpec.kwargs).

    ``evaluation`` turns training-only randomisation off (AutoExplore leave-out) and
    picks a held-out ALFWorld split unless ``split`` names one. ``labels``: the policy's
    choice labels (``rollout.labels``; default the paper's).
    """
    return env_spec(args.env).kwargs(args, evaluation=evaluation, run_dir=run_dir, split=split, labels=labels)


def check_inputs(args, *, evaluation: bool = False) -> None:
    """Stop with one line (``UsageError``) if a file or folder the flags name for ``--env`` cannot serve
    (``EnvSpec.inputs``); training's inputs, or with ``evaluation`` the held-out ones. RL and evaluation call
    it first, before a model is loaded or a run folder made."""
    env_spec(args.env).inputs(args, evaluation=evaluation)


def curriculum_from_args(args, max_steps: int | None = None) -> Curriculum:
    """The training curriculum the flags describe (a single level when no curriculum is on); with
    ``--curriculum_steps``, its first levels for the iterations given."""
    curriculum = env_spec(args.env).curriculum(args, max_steps or args.max_steps)
    if args.curriculum_steps is None:
        return curriculum
    if len(args.curriculum_steps) > len(curriculum.levels):
        raise UsageError(f"--curriculum_steps: {len(args.curriculum_steps)} counts, but the curriculum has "
                         f"{len(curriculum.levels)} levels ({', '.join(level.name for level in curriculum.levels)})")
    return curriculum.first(args.curriculum_steps)


class EnvPool:
    """Environments for work running on several threads: :meth:`env` lends one that no other thread
    is using, building a new one (``factory()``) only when all are lent. An episode started with
    ``reset(seed=..., options=...)`` does not depend on which environment plays it."""

    def __init__(self, factory: Callable[[], TextEnv]):
        self._factory = factory
        self._free: queue.SimpleQueue[TextEnv] = queue.SimpleQueue()
        self._all: list[TextEnv] = []
        self._lock = threading.Lock()

    @contextmanager
    def env(self) -> Iterator[TextEnv]:
        try:
            env = self._free.get_nowait()
        except queue.Empty:
            env = self._factory()
            with self._lock:
                self._all.append(env)
        try:
            yield env
        finally:
            self._free.put(env)

    def close(self) -> None:
        for env in self._all:
            env.close()
