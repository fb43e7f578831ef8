"""The reflector's accuracy, for any recipe whose oracle writer's reflections name a move: how often the
SFT reflector, reading held-out (or validation) states, advises the move the environment's oracle would make."""

from collections.abc import Callable

import numpy as np

from envs import EnvSettings, env_kwargs, make_env
from evaluation.episodes import test_episodes, validation_episodes
from evaluation.evaluate import evaluate_config
from prompts import shown_menu
from utils import models

# The episodes a reflector can be judged on: the held-out ones (the runner's report) or the validation ones
# (choices, such as its SFT budget: ``demo.py --check_reflectors``).
SPLITS = {"held-out": test_episodes, "validation": validation_episodes}


def reflector_accuracy(advised_command: Callable[[str | None], str | None]) -> Callable[..., dict]:
    """A ``Recipe.accuracy``: plays ``budget["accuracy_episodes"]`` episodes of ``split`` per unit with a row
    that reads the SFT reflector, and compares ``advised_command(reflection)`` with the oracle's action at
    every step. Per step number: [step, accuracy, states]; over all: [accuracy, states]; "episodes": [the
    share of episodes whose every judged advice was right, episodes]."""

    def accuracy(recipe, eval_args, config: dict, split: str = "held-out") -> dict[str, list]:
        labels = models.policy_labels(eval_args.model_name)
        settings = EnvSettings.from_args(eval_args)
        envs = [make_env(eval_args.env, **env_kwargs(settings, evaluation=True, labels=labels))
                for _ in range(eval_args.per_device_eval_batch_size)]
        try:
            starts = SPLITS[split](eval_args, envs[0], recipe.budget["accuracy_episodes"])
            episodes = evaluate_config(eval_args, config, envs, starts)["episodes"]
        finally:
            for env in envs:
                env.close()
        right: dict[int, list[bool]] = {}
        throughout = []
        for episode in episodes:
            throughout.append(True)
            for step, decision in enumerate(episode.decisions):
                if decision.oracle is None:
                    continue  # the oracle has no move among the offered actions
                shown = dict(shown_menu(decision.obs, labels)).get(labels[decision.oracle])
                ok = shown is not None and advised_command(decision.reflection) == shown
                right.setdefault(step, []).append(ok)
                throughout[-1] &= ok
        every = [ok for oks in right.values() for ok in oks]
        return {"steps": [[step, float(np.mean(oks)), len(oks)] for step, oks in sorted(right.items())],
                "all": [float(np.mean(every)) if every else float("nan"), len(every)],
                "episodes": [float(np.mean(throughout)) if throughout else float("nan"), len(throughout)]}

    return accuracy
