"""Evaluate several configurations of one environment in one run.

    python -m evaluation.evaluate --env=taxi --eval_load_list=configs.yaml --eval_reps=64

Configurations come from ``EVAL_LOAD_LIST`` in :func:`main` (edit it, as the paper's
users do), or from ``--eval_load_list FILE.yaml`` (a list of ``{env, load_dir,
reflect_load_dir, name}``); if both are empty, the command line's ``--load_dir`` and
``--reflect_load_dir`` make the one configuration. A ``load_dir`` of null evaluates the
base model with a fresh (untrained) LoRA.

Every configuration plays the same test episodes through the rollout used in RL
(``rollout.py``), with the same seeds and sampling randomness:

* Taxi: ``--eval_reps`` held-out seeds per curriculum level (pickup, dropoff, full;
  ``--curriculum_index`` picks one);
* AutoExplore: every task of ``--task_file`` (a test split), ``--eval_reps`` times, by depth;
* ALFWorld: every problem of the ``valid`` splits, ``--eval_reps`` times.

Success rate and average cost per level, with the number of episodes behind each figure,
are printed and saved as ``results.json`` and ``results.md`` in
``results/<id>_evaluate/``.
"""

import json
import logging
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from tqdm.auto import tqdm

from envs import env_kwargs, env_spec, make_env
from experiment_args import run_script
from rollout import EpisodeStart, TwoPlayerRollout
from utils import checkpoints, models
from utils.errors import UsageError

SCRIPT = "evaluate"
logger = logging.getLogger(__name__)
# Evaluation seeds start here. Training episodes and data-generation episodes draw their
# seeds below 2**31 - 1 (envs.base.rng_seed, rl_finetune.episode_starts), so no training
# seed of any run is ever an evaluation seed.
HELD_OUT_SEED = 2**31
# The RL validation panel's seeds (--eval_steps) start here, far above any evaluation seed
# (HELD_OUT_SEED + episode number): the episodes a run's choices are judged on are never the ones
# its final table is measured on.
VALIDATION_SEED = HELD_OUT_SEED + 2**30


@dataclass
class EvaluationRun:
    """What one evaluation run wrote: its folder and, per configuration, the configuration
    with its figures per level under ``"levels"`` (as in ``results.json``)."""

    run_dir: Path
    results: list[dict]


def test_episodes(args, env, reps: int, level_episodes: int = 0) -> list[EpisodeStart]:
    """The fixed test episodes of ``args.env``, ``reps`` per level, task or problem (its spec's held-out
    units; only those at ``--eval_levels`` if given), each labelled with its level; a level of few units
    repeats each ``ceil(level_episodes / units)`` times where that is more than ``reps``."""
    units = at_eval_levels(args, env_spec(args.env).held_out(args, env))
    per_level = Counter(level for _, level in units)
    return [EpisodeStart(seed=HELD_OUT_SEED + i, options=options, level=level)
            for options, level in units for i in range(max(reps, math.ceil(level_episodes / per_level[level])))]


def validation_episodes(args, env, reps: int) -> list[EpisodeStart]:
    """The fixed validation episodes of ``args.env``, ``reps`` per validation unit (its spec's
    ``validation``; only those at ``--eval_levels`` if given), from seeds disjoint from
    :func:`test_episodes`' and from training's."""
    return [EpisodeStart(seed=VALIDATION_SEED + i, options=options, level=level)
            for options, level in at_eval_levels(args, env_spec(args.env).validation_units(args, env))
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


def load_configs(args, eval_load_list: list[dict]) -> list[dict]:
    configs = list(eval_load_list)
    if args.eval_load_list:
        path = Path(args.eval_load_list)
        if not path.is_file():
            raise ValueError(f"--eval_load_list: no such file {args.eval_load_list!r}")
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or []
        if not isinstance(loaded, list) or not all(isinstance(c, dict) for c in loaded):
            raise ValueError(f"--eval_load_list: {path} must hold a list of {{env, load_dir, reflect_load_dir}}")
        configs += loaded
    if not configs:
        configs = [{"env": args.env, "load_dir": args.load_dir, "reflect_load_dir": args.reflect_load_dir}]
    for number, config in enumerate(configs, 1):
        unknown = set(config) - {"env", "load_dir", "reflect_load_dir", "name"}
        if unknown:
            raise ValueError(f"evaluation configuration {number} has unknown keys {sorted(unknown)}")
        if config.get("env", args.env) != args.env:
            raise ValueError(f"evaluation configuration {number} is for env {config['env']!r}, "
                             f"but this run evaluates --env={args.env}")
        config.setdefault("name", config.get("load_dir") or "base model")
    return configs


def evaluate_config(args, config: dict, envs, starts: list[EpisodeStart]) -> list:
    rollout = TwoPlayerRollout.load(args, config.get("load_dir"), config.get("reflect_load_dir"),
                                    reflect=bool(config.get("reflect_load_dir")))
    rng = np.random.default_rng(args.seed)  # the same sampling randomness for every configuration
    return play_all(rollout, envs, starts, rng, desc=f"eval {config['name']}")


def play_all(rollout: TwoPlayerRollout, envs, starts: list[EpisodeStart], rng, desc: str | None = None) -> list:
    """Play ``starts`` in batches of ``len(envs)``."""
    episodes = []
    batch = len(envs)
    for first in tqdm(range(0, len(starts), batch), desc=desc, unit="batch", disable=desc is None):
        chunk = starts[first:first + batch]
        episodes += rollout.run(envs[:len(chunk)], chunk, rng)
    return episodes


class HeldOutPanel:
    """A small fixed set of validation episodes that RL plays every ``--eval_steps`` iterations.

    ``--eval_panel`` :func:`validation_episodes` per level, task or problem: never trained on, and
    never among the episodes :func:`run` reports (other seeds; AutoExplore: the tasks of
    ``--validation_task_file``), on their own evaluation environments, with the same sampling
    randomness every time: differences between two points of the curve come from the policy, not
    from the draw. Choices (budgets, rates, early stopping) are made on this curve.
    """

    def __init__(self, args, run_dir: Path | None, labels=None):
        self.envs = [make_env(args.env, **env_kwargs(args, evaluation=True, run_dir=run_dir, labels=labels))
                     for _ in range(args.per_device_eval_batch_size)]
        self.starts = validation_episodes(args, self.envs[0], args.eval_panel)

    def evaluate(self, rollout: TwoPlayerRollout) -> dict:
        episodes = play_all(rollout, self.envs, self.starts, np.random.default_rng(HELD_OUT_SEED))
        summary = figures(episodes)
        return {"heldout_success": summary["success"], "heldout_cost": summary["cost"],
                "heldout_episodes": summary["episodes"]}



def figures(episodes) -> dict:
    """Success rate, average cost and length of ``episodes``, how many they are, and how many distinct
    held-out units (the options they were reset with: an AutoExplore task, an ALFWorld problem; a Taxi
    level is one unit whose episodes differ by seed) they repeat."""
    units = {json.dumps(e.options, sort_keys=True, default=str) for e in episodes}
    return {"success": float(np.mean([e.success for e in episodes])), "cost": float(np.mean([e.cost for e in episodes])),
            "episodes": len(episodes), "steps": float(np.mean([len(e.decisions) for e in episodes])),
            "units": len(units)}


def summarise(episodes) -> dict:
    """:func:`figures` per level, then over all episodes (``"all"``)."""
    levels: dict[str, list] = {}
    for episode in episodes:
        levels.setdefault(episode.level, []).append(episode)
    return {**{level: figures(group) for level, group in sorted(levels.items())}, "all": figures(episodes)}


def success_name(args) -> str:
    """What an episode's 'success' measures: under --oracle_completion, an optimal first decision (the
    oracle solves almost every played-out episode), not a solved task."""
    return "optimal 1st decision" if args.oracle_completion else "success"


def markdown_table(results: list[dict], success: str = "success") -> str:
    levels = [level for level in results[0]["levels"] if level != "all"] + ["all"]
    header = "| configuration | " + " | ".join(f"{level}: {success} (n) | {level}: cost" for level in levels) + " |"
    rule = "|---|" + "---:|---:|" * len(levels)
    rows = []
    for result in results:
        cells = []
        for level in levels:
            figure = result["levels"][level]
            cells += [f"{100 * figure['success']:.1f}% ({figure['episodes']})", f"{figure['cost']:.3f}"]
        rows.append(f"| {result['name']} | " + " | ".join(cells) + " |")
    return "\n".join([header, rule, *rows]) + "\n"


def save_results(run_dir: Path, results: list[dict], title: str, footer: str = "", success: str = "success") -> str:
    """Write ``results.json`` and ``results.md`` (the table under ``title``); return the table."""
    table = markdown_table(results, success)
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (run_dir / "results.md").write_text(f"# {title}\n\n{table}{footer}", encoding="utf-8")
    return table


def run(args, eval_load_list: list[dict]) -> EvaluationRun:
    configs = load_configs(args, eval_load_list)
    labels = models.policy_labels(args)  # every configuration shares the base model, so its choice labels
    run_dir = checkpoints.make_run_dir(args, SCRIPT)
    envs = [make_env(args.env, **env_kwargs(args, evaluation=True, run_dir=run_dir, labels=labels))
            for _ in range(args.per_device_eval_batch_size)]
    try:
        starts = test_episodes(args, envs[0], args.eval_reps, args.eval_level_episodes)
        results = []
        for config in configs:
            summary = summarise(evaluate_config(args, config, envs, starts))
            results.append({**config, "levels": summary})
    finally:
        for env in envs:
            env.close()
    table = save_results(run_dir, results, f"Evaluation on {args.env}", success=success_name(args))
    print(f"\n[evaluate] {args.env}: {len(starts)} episodes per configuration; saved in {run_dir}\n\n{table}")
    return EvaluationRun(run_dir, results)


def main(args) -> int:
    # Edit this list to evaluate several configurations in one run, e.g.
    # {"env": "taxi", "load_dir": "results/12_rl_finetune/checkpoint-100",
    #  "reflect_load_dir": "results/10_supervised_pretrain/checkpoint-500", "name": "Reflect-RL"}
    EVAL_LOAD_LIST: list[dict] = []  # noqa: N806 - the name the paper's users edit
    run(args, EVAL_LOAD_LIST)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m evaluation.evaluate"))
