"""Text environments behind one gymnasium API: DangerousTaxi, AutoExplore, ALFWorld.

``ENVS`` registers each environment's :class:`~envs.spec.EnvSpec` (one line each);
``make_env(name, **kwargs)`` builds one; ``env_kwargs(settings, ...)`` turns what the environments read of
the flags (:class:`~envs.spec.EnvSettings`, built once by the entry point) into the keyword arguments of
the chosen environment, so every script configures environments the same way. See ``envs/base.py`` for
the contract.
"""

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from envs import alfworld, auto_explore_spec, taxi
from envs.base import TextEnv
from envs.curriculum import Curriculum
from envs.spec import EnvSettings, EnvSpec
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


def env_kwargs(settings: EnvSettings, *, evaluation: bool = False, run_dir: Path | None = None,
               split: str | None = None, labels=None) -> dict:
    """Keyword arguments of ``make_env(settings.env, ...)`` from the shared flags (see EnvSpec.kwargs).

    ``evaluation`` turns training-only randomisation off (AutoExplore leave-out) and
    picks a held-out ALFWorld split unless ``split`` names one. ``labels``: the policy's
    choice labels (``rollout.labels``; default the paper's).
    """
    return env_spec(settings.env).kwargs(settings, evaluation=evaluation, run_dir=run_dir, split=split,
                                         labels=labels)


def check_inputs(settings: EnvSettings, *, evaluation: bool = False) -> None:
    """Stop with one line (``UsageError``) if a file or folder the flags name for ``--env`` cannot serve
    (``EnvSpec.inputs``); training's inputs, or with ``evaluation`` the held-out ones. RL and evaluation call
    it first, before a model is loaded or a run folder made."""
    env_spec(settings.env).inputs(settings, evaluation=evaluation)


def training_curriculum(settings: EnvSettings, max_steps: int | None = None) -> Curriculum:
    """The training curriculum the flags describe (a single level when no curriculum is on); with
    ``--curriculum_steps``, its first levels for the iterations given."""
    curriculum = env_spec(settings.env).curriculum(settings, max_steps or settings.max_steps)
    if settings.curriculum_steps is None:
        return curriculum
    if len(settings.curriculum_steps) > len(curriculum.levels):
        raise UsageError(f"--curriculum_steps: {len(settings.curriculum_steps)} counts, but the curriculum has "
                         f"{len(curriculum.levels)} levels ({', '.join(level.name for level in curriculum.levels)})")
    return curriculum.first(settings.curriculum_steps)


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
