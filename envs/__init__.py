"""Text environments behind one gymnasium API: DangerousTaxi, AutoExplore, ALFWorld.

``make_env(name, **kwargs)`` builds one; ``env_kwargs(args, ...)`` turns the shared
``ScriptArguments`` into the keyword arguments of the chosen environment, so every
script configures environments the same way. See ``envs/base.py`` for the contract.
"""

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from envs.base import TextEnv

ENV_NAMES = ("taxi", "auto_explore", "alfworld")


def make_env(name: str, **kwargs) -> TextEnv:
    if name == "taxi":
        from envs.taxi import DangerousTaxiEnv

        return DangerousTaxiEnv(**kwargs)
    if name == "auto_explore":
        from envs.auto_explore import AutoExploreEnv

        return AutoExploreEnv(**kwargs)
    if name == "alfworld":
        from envs.alfworld import ALFWorldEnv

        return ALFWorldEnv(**kwargs)
    raise ValueError(f"unknown environment {name!r}; choose from {ENV_NAMES}")


def env_kwargs(args, *, evaluation: bool = False, run_dir: Path | None = None, split: str | None = None,
               labels=None) -> dict:
    """Keyword arguments of ``make_env(args.env, ...)`` from the shared flags.

    ``evaluation`` turns training-only randomisation off (AutoExplore leave-out) and
    picks a held-out ALFWorld split unless ``split`` names one. ``labels``: the policy's
    choice labels (``rollout.labels``; default the paper's).
    """
    kwargs: dict = {"horizon": args.horizon, "shuffle_action": args.shuffle_action, "labels": labels}
    if args.env == "taxi":
        kwargs.update(with_prompt=args.with_prompt, with_history=args.with_history, first_step=args.first_step,
                      pickup_reward=args.pickup_reward)
    elif args.env == "auto_explore":
        # Tasks name their repository relative to --repo_dir (the filtered repositories; None: the default).
        kwargs.update(leaveout_prob=0.0 if evaluation else args.leaveout_prob, easy=args.easy,
                      first_step=args.first_step, repos_dir=args.repo_dir, cost_rule=args.auto_explore_costs)
    elif args.env == "alfworld":
        kwargs.update(
            data_root=args.alfworld_data,
            task=args.alfworld_task,
            split=split or ("valid" if evaluation else args.alfworld_split),
            expert=args.alfworld_expert,
            timeout=args.alfworld_timeout,
            block_list=None if run_dir is None else Path(run_dir) / "alfworld_blocklist.txt",
            few_data=0 if evaluation else args.few_data,
        )
    return kwargs


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
