"""The fixed episodes an evaluation plays: the held-out test episodes (``evaluation.evaluate``, the API-model
evaluations) and the validation episodes of RL's held-out panel, each from seeds no training episode draws."""

import logging
import math
from collections import Counter

from envs import EnvSettings, env_spec
from rollout import EpisodeStart
from utils.errors import UsageError

logger = logging.getLogger(__name__)

# Evaluation seeds start here. Training episodes and data-generation episodes draw their
# seeds below 2**31 - 1 (envs.base.rng_seed, rl_finetune.episode_starts), so no training
# seed of any run is ever an evaluation seed.
HELD_OUT_SEED = 2**31
# The RL validation panel's seeds (--eval_steps) start here, far above any evaluation seed
# (HELD_OUT_SEED + episode number): the episodes a run's choices are judged on are never the ones
# its final table is measured on.
VALIDATION_SEED = HELD_OUT_SEED + 2**30


def test_episodes(args, env, reps: int, level_episodes: int = 0) -> list[EpisodeStart]:
    """The fixed test episodes of ``args.env``, ``reps`` per level, task or problem (its spec's held-out
    units; only those at ``--eval_levels`` if given), each labelled with its level; a level of few units
    repeats each ``ceil(level_episodes / units)`` times where that is more than ``reps``."""
    units = at_eval_levels(args, env_spec(args.env).held_out(EnvSettings.from_args(args), env))
    per_level = Counter(level for _, level in units)
    return [EpisodeStart(seed=HELD_OUT_SEED + i, options=options, level=level)
            for options, level in units for i in range(max(reps, math.ceil(level_episodes / per_level[level])))]


def validation_episodes(args, env, reps: int) -> list[EpisodeStart]:
    """The fixed validation episodes of ``args.env``, ``reps`` per validation unit (its spec's
    ``validation``; only those at ``--eval_levels`` if given), from seeds disjoint from
    :func:`test_episodes`' and from training's."""
    return [EpisodeStart(seed=VALIDATION_SEED + i, options=options, level=level)
            for options, level in at_eval_levels(
                args, env_spec(args.env).validation_units(EnvSettings.from_args(args), env))
            for i in range(reps)]


def at_eval_levels(args, units: list[tuple[dict, str]]) -> list[tuple[dict, str]]:
    """The ``(options, level)`` units at ``--eval_levels`` (all without it); a level named but absent is
    warned about, and none present is an error."""
    if args.eval_levels is None:
        return units
    present = {level for _, level in units}
    if not present & set(args.eval_levels):
        raise UsageError(f"--eval_levels: no held-out unit is at any of {args.eval_levels} "
                         f"(levels here: {sorted(present)})")
    for level in sorted(set(args.eval_levels) - present):
        logger.warning("--eval_levels: no held-out unit is at level %r; it gets no figure", level)
    return [(options, level) for options, level in units if level in args.eval_levels]
