"""Text environments behind one gymnasium API: DangerousTaxi, AutoExplore, ALFWorld.

``make_env(name, **kwargs)`` builds one; ``env_kwargs(args, ...)`` turns the shared
``ScriptArguments`` into the keyword arguments of the chosen environment, so every
script configures environments the same way. See ``envs/base.py`` for the contract.
"""

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
        kwargs.update(with_prompt=args.with_prompt, with_history=args.with_history, first_step=args.first_step)
    elif args.env == "auto_explore":
        kwargs.update(leaveout_prob=0.0 if evaluation else args.leaveout_prob, easy=args.easy,
                      first_step=args.first_step)
    elif args.env == "alfworld":
        kwargs.update(
            data_root=args.alfworld_data,
            task=args.alfworld_task,
            split=split or ("valid" if evaluation else args.alfworld_split),
            expert=args.alfworld_expert,
            timeout=args.alfworld_timeout,
            block_list=None if run_dir is None else Path(run_dir) / "alfworld_blocklist.txt",
        )
    return kwargs
