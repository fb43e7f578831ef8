"""Each learner's own defaults, for the flags whose best value depends on the learner.

A flag named here is declared with the default None (``utils/arg_groups.py``); a run that does not give it takes
its learner's value from :data:`LEARNER_DEFAULTS`, and ``--help`` lists them. The group learners' values are
what the ablation on validation episodes kept (docs/learners.md, "What the group learners needed"). This module
imports nothing, so that the flags are read without torch.
"""

LEARNER_DEFAULTS: dict[str, dict[str, object]] = {
    # the paper's learner: up to 4 replayed successes trained with the fresh episodes
    "pg": {"replay_batch_size": 4},
    # The group learners replay successes as PG does: on Taxi pickup's validation panel (seed 0, 1,920 episodes)
    # RLOO rose from 45% to 70% with it, GRPO (dr_grpo) from 47.5% to 82.5%, GiGPO (dr_grpo) from 42.5% to
    # 72.5% (docs/learners.md: every run).
    "rloo": {"replay_batch_size": 4},
    # GRPO and GiGPO without the standard-deviation scaling (Dr. GRPO): with it, both ended every episode at its
    # first move on seeds 0 and 1 (10% on the panel); without it 47.5 and 70.0% (GRPO), 42.5 and 67.5% (GiGPO).
    "grpo": {"replay_batch_size": 4, "grpo_variant": "dr_grpo"},
    "gigpo": {"replay_batch_size": 4, "grpo_variant": "dr_grpo"},
}


def learner_default(trainer: str, flag: str):
    """``flag``'s default for ``--trainer trainer``; a learner the flag does not apply to (one without an entry
    here) gets the first listed learner's value, which it never reads."""
    own = LEARNER_DEFAULTS.get(trainer, {})
    if flag in own:
        return own[flag]
    return next(values[flag] for values in LEARNER_DEFAULTS.values() if flag in values)


def learner_defaults(trainer: str) -> dict[str, object]:
    """Every flag of :data:`LEARNER_DEFAULTS` with its default for ``--trainer trainer``."""
    return {flag: learner_default(trainer, flag) for flag in {f for values in LEARNER_DEFAULTS.values() for f in values}}


def replays(trainer: str) -> bool:
    """Whether ``--trainer trainer`` replays successes unless told otherwise (a recipe gives such a learner its
    own replay count, ``rl_replay``)."""
    return trainer in LEARNER_DEFAULTS and bool(learner_default(trainer, "replay_batch_size"))


def defaults_help(flag: str) -> str:
    """The learners' defaults of ``flag`` for its ``--help``: 'pg 4, rloo 4, ...'."""
    return ", ".join(f"{name} {values[flag]}" for name, values in LEARNER_DEFAULTS.items() if flag in values)
