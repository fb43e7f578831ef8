"""Evaluate several configurations of one environment in one run.

    python -m evaluation.evaluate --env=taxi --eval_load_list=configs.yaml --eval_reps=64

Configurations come from ``EVAL_LOAD_LIST`` in :func:`main` (edit it, as the paper's
users do), or from ``--eval_load_list FILE.yaml`` (a list of ``{env, load_dir,
reflect_load_dir, name}``); if both are empty, the command line's ``--load_dir`` and
``--reflect_load_dir`` make the one configuration (beside a list they are ignored, with a
warning: the list is what a run evaluates, as documented, and a flag that does nothing is said,
not refused). Each entry names its policy: ``load_dir: base`` evaluates the base model with a fresh
(untrained) LoRA, and an entry without a ``load_dir`` (or with a null one) is refused, as it would have
shown the base model's figures under the entry's name. Without a ``reflect_load_dir`` an entry plays
without reflection.

Before the first episode, every configuration is checked: its keys and env, and each checkpoint
(it exists, is one, of the player it is given as, with this model's choice labels and, for an RL
checkpoint, the settings of what it reads: ``utils/checkpoints.py``), and that no two share a name (each
is a row of the results, found by its name; one without a name takes its checkpoints'). Any bad one stops
the run with one line naming each bad entry, its number and name; nothing is played or written.

Every configuration plays the same test episodes through the rollout used in RL
(``rollout/``), with the same seeds and sampling randomness:

* Taxi: ``--eval_reps`` held-out seeds per curriculum level (pickup, dropoff, full;
  ``--curriculum_index`` picks one);
* AutoExplore: every task of ``--task_file`` (a test split), ``--eval_reps`` times, by depth;
* ALFWorld: every problem of the ``valid`` splits, ``--eval_reps`` times.

Each configuration's figures are journalled as soon as it has played, in
``<ckpt_path>/.progress/evaluate_*.jsonl`` (the journal of the API-model evaluations,
``data_gen/common.py``), named by the run's settings (all flags but those naming the list and the
output folder) and keyed by the configuration (its name, and its checkpoints down to their files'
sizes and times: one trained again is played again). A run that stops (kill -9, Ctrl-C, a crash)
keeps what finished, and **the same command** plays only the configurations not finished, then writes
what an uninterrupted run writes; there is no run folder to find, as it is made at the end. A
configuration that fails while playing (an unexpected exception) is logged with its traceback and the
others play on: their results are written, and the run exits with status 1 naming the failed one (its
journal kept for the same command). A run where every configuration played removes its journal: the
journal resumes an unfinished run, and never answers a later run (after a code change, say) from an
old one.

Success rate and average cost per level (in the order the environment lists its held-out units: Taxi's
curriculum order), with the number of episodes behind each figure, are printed and saved as
``results.json`` and ``results.md`` in ``results/<id>_evaluate/``, made once every configuration
has played.
"""

import hashlib
import json
import logging
import math
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from tqdm.auto import tqdm

from data_gen.common import Journal, journal_name
from envs import env_kwargs, env_spec, make_env
from experiment_args import run_script
from rollout import EpisodeStart, TwoPlayerRollout
from utils import checkpoints, models
from utils.errors import UsageError
from utils.io import read_input, write_json, write_jsonl

SCRIPT = "evaluate"
EPISODES = "episodes.jsonl"  # in a run's folder: every episode of every configuration (episode_record)
SECONDS = "seconds.json"  # in a run's folder: where each configuration's time went (evaluate_config)
PROG = "python -m evaluation.evaluate"
logger = logging.getLogger(__name__)
# Evaluation seeds start here. Training episodes and data-generation episodes draw their
# seeds below 2**31 - 1 (envs.base.rng_seed, rl_finetune.episode_starts), so no training
# seed of any run is ever an evaluation seed.
HELD_OUT_SEED = 2**31
# The RL validation panel's seeds (--eval_steps) start here, far above any evaluation seed
# (HELD_OUT_SEED + episode number): the episodes a run's choices are judged on are never the ones
# its final table is measured on.
VALIDATION_SEED = HELD_OUT_SEED + 2**30


# The keys of a configuration.
CONFIG_KEYS = ("env", "load_dir", "reflect_load_dir", "name")
# The load_dir of an entry that evaluates the base model (with a fresh LoRA, no adapter): said, as a load_dir
# left out (a slip, a misspelt key) would evaluate it under the entry's name. A folder of that name: ./base.
BASE = "base"
# Flags that name the configurations or where the results go, not how they are played: left out of the
# journal's name, so the same entries listed in another file reuse what finished.
_NOT_PLAYING = ("eval_load_list", "load_dir", "reflect_load_dir", "ckpt_path", "config", "resume_from")


@dataclass
class EvaluationRun:
    """What one evaluation run wrote: its folder (None if no configuration finished) and, per configuration
    that finished, the configuration with its figures per level under ``"levels"`` (as in ``results.json``);
    ``failed``: "configuration N (name): error" of each that failed while playing."""

    run_dir: Path | None
    results: list[dict]
    failed: list[str] = field(default_factory=list)


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
    """The configurations to evaluate (see the module's docstring), each with its name; all checked
    (:func:`check_configs`) before any is played."""
    configs = [dict(c) if isinstance(c, dict) else c for c in eval_load_list]
    if args.eval_load_list:
        configs += read_eval_load_list(args.eval_load_list)
    from_flags = not configs
    if from_flags:
        # no --load_dir: the base model; --load_dir=base: a folder of that name (BASE is a list entry's word)
        policy = os.path.join(".", BASE) if args.load_dir == BASE else args.load_dir
        configs = [{"env": args.env, "load_dir": policy, "reflect_load_dir": args.reflect_load_dir}]
    elif (args.load_dir or args.reflect_load_dir) and not args.eval_load_list:
        # (beside --eval_load_list, the flags' own "does not apply" warning says it: experiment_args)
        logger.warning("--load_dir and --reflect_load_dir are ignored: EVAL_LOAD_LIST in evaluation/evaluate.py "
                       "names the checkpoints of each configuration")
    for config in configs:
        if isinstance(config, dict):
            config.setdefault("name", default_name(config))
    check_configs(args, configs, from_flags)
    return configs


def policy_dir(config: dict) -> str | None:
    """The checkpoint a configuration's policy loads; None for the base model (``load_dir: base``, or no
    ``--load_dir`` for the one configuration of the flags)."""
    directory = config.get("load_dir")
    return None if directory == BASE else directory


def default_name(config: dict) -> str:
    """The name of a configuration that gives none: its policy's checkpoint (or "base model"), and its
    reflector's where it reads one, so that two entries of one policy with and without a reflector differ."""
    name = policy_dir(config) or "base model"
    reflector = config.get("reflect_load_dir")
    return f"{name} + reflector {reflector}" if isinstance(reflector, str) and reflector else name


def read_eval_load_list(name: str) -> list:
    """The entries of ``--eval_load_list``: a YAML list, not empty."""
    path = Path(name)
    try:
        loaded = yaml.safe_load(read_input(path, "--eval_load_list"))
    except yaml.YAMLError as error:
        raise UsageError(f"--eval_load_list: {path} is not a YAML file ({' '.join(str(error).split())})") from None
    if not isinstance(loaded, list) or not loaded:
        raise UsageError(f"--eval_load_list: {path} must hold a list of {{env, load_dir, reflect_load_dir, name}}, "
                         f"not {'nothing' if not loaded else type(loaded).__name__}")
    return loaded


def check_configs(args, configs: list, from_flags: bool = False) -> None:
    """Stop with one line naming each bad configuration, by number and name, and what is wrong with it
    (:func:`config_problems`), and each name several share (:func:`shared_names`), before any is played; log
    the checkpoints' warnings. ``from_flags``: the one configuration of ``--load_dir`` and
    ``--reflect_load_dir``, named by those flags."""
    bad = [problem for number, config in enumerate(configs, 1)
           if (problem := config_problems(args, config, number, from_flags)) is not None]
    if bad and from_flags:
        raise UsageError("; ".join(bad))
    shared = shared_names(configs)
    if bad or shared:
        said = (f"{len(bad)} of the {len(configs)} evaluation configurations cannot run, so none was played: " if bad
                else "no evaluation configuration was played: ")
        raise UsageError(said + "; ".join(bad + shared))


def shared_names(configs: list) -> list[str]:
    """A phrase for each name that several configurations give: each is a row of the results (and a curve of
    the figures), found by its name, so a shared one would show one configuration's figures for another's."""
    numbers: dict[str, list[int]] = {}
    for number, config in enumerate(configs, 1):
        if isinstance(config, dict) and isinstance(config.get("name"), str):
            numbers.setdefault(config["name"], []).append(number)
    return [f"configurations {', '.join(map(str, found[:-1]))} and {found[-1]} share the name {name!r}; give each "
            f"its own (name: ...)" for name, found in numbers.items() if len(found) > 1]


def config_problems(args, config, number: int, from_flags: bool = False) -> str | None:
    """What is wrong with configuration ``number`` (its keys, its env, its checkpoints:
    ``checkpoints.checkpoint_problems``), in one phrase that names it; None if nothing is."""
    if not isinstance(config, dict):
        return f"configuration {number} is not a mapping of {{env, load_dir, reflect_load_dir, name}}: {config!r}"
    label = f"configuration {number} ({config['name']})"
    problems = []
    unknown = set(config) - set(CONFIG_KEYS)
    if unknown:
        problems.append(f"unknown keys {sorted(unknown)} (known: {', '.join(CONFIG_KEYS)})")
    if config.get("env", args.env) != args.env:
        problems.append(f"it is for env {config['env']!r}, but this run evaluates --env={args.env}")
    if not isinstance(config["name"], str):
        problems.append(f"its name must be a string, not {config['name']!r}")
    if not from_flags and config.get("load_dir") is None:
        problems.append(f"it names no load_dir (give its policy's checkpoint, or load_dir: {BASE} for the base "
                        "model with a fresh LoRA)")
    for key, player in (("load_dir", checkpoints.POLICY), ("reflect_load_dir", checkpoints.REFLECTOR)):
        directory = config.get(key)
        where = f"--{key}" if from_flags else key
        if directory is None or (key, directory) in (("load_dir", BASE), ("reflect_load_dir", "")):
            continue  # the base model (from the flags: no --load_dir); no reflector
        if not isinstance(directory, str):
            problems.append(f"{where} must name a folder, not {directory!r}")
            continue
        errors, warnings = checkpoints.checkpoint_problems(args, directory, player)
        if errors:
            problems.append(checkpoints.describe(where, directory, errors))
        checkpoints.warn_once(where if from_flags else f"{label}: {where}", directory, warnings)
    if not problems:
        return None
    return "; ".join(problems) if from_flags else f"{label}: " + "; ".join(problems)


def config_key(config: dict) -> str:
    """A configuration's key in the journal: its name and what its checkpoints hold."""
    held = [checkpoints.fingerprint(directory) if directory else None
            for directory in (policy_dir(config), config.get("reflect_load_dir"))]
    return f"{config['name']}|{hashlib.sha256(json.dumps(held).encode()).hexdigest()[:16]}"


def evaluate_config(args, config: dict, envs, starts: list[EpisodeStart]) -> dict:
    """A configuration's episodes on ``starts``, and where its time went (``"seconds"``: loading the two players,
    playing, and inside playing the reflector's generation and the policy's scoring)."""
    tic = time.time()
    rollout = TwoPlayerRollout.load(args, policy_dir(config), config.get("reflect_load_dir"),
                                    reflect=bool(config.get("reflect_load_dir")),
                                    flags=(f"{config.get('name')}: load_dir", f"{config.get('name')}: reflect_load_dir"))
    loaded = time.time()
    rng = np.random.default_rng(args.seed)  # the same sampling randomness for every configuration
    episodes = play_all(rollout, envs, starts, rng, desc=f"eval {config['name']}")
    return {"episodes": episodes, "seconds": {"load": loaded - tic, "play": time.time() - loaded,
                                              "reflector": rollout.stats.reflect_seconds,
                                              "policy": rollout.stats.policy_seconds}}


def episode_record(name: str, episode) -> dict:
    """One line of a run's ``episodes.jsonl``: a configuration's episode, each decision's label indices (the one
    picked, the oracle's), reward and reflection."""
    return {"name": name, "level": episode.level, "seed": episode.seed, "options": episode.options,
            "success": episode.success, "cost": episode.cost,
            "decisions": [{"action": d.action, "oracle": d.oracle, "reward": d.reward, "reflection": d.reflection}
                          for d in episode.decisions]}


def played(args, config: dict, envs, starts: list[EpisodeStart]) -> dict:
    """What the journal keeps of a configuration: its figures per level, its seconds, its episodes' records."""
    found = evaluate_config(args, config, envs, starts)
    return {"levels": summarise(found["episodes"]), "seconds": found["seconds"],
            "episodes": [episode_record(config["name"], episode) for episode in found["episodes"]]}


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
    """:func:`figures` per level, in the order the episodes reach them (:func:`test_episodes` lists them in
    the order of the environment's held-out units: Taxi's curriculum, pickup, dropoff, full), then over
    all episodes (``"all"``)."""
    levels: dict[str, list] = {}
    for episode in episodes:
        levels.setdefault(episode.level, []).append(episode)
    return {**{level: figures(group) for level, group in levels.items()}, "all": figures(episodes)}


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
    """Check every configuration, play those the journal does not hold, then write the run folder."""
    configs = load_configs(args, eval_load_list)
    labels = models.policy_labels(args)  # every configuration shares the base model, so its choice labels
    envs = [make_env(args.env, **env_kwargs(args, evaluation=True, labels=labels))
            for _ in range(args.per_device_eval_batch_size)]
    try:
        starts = test_episodes(args, envs[0], args.eval_reps, args.eval_level_episodes)
        # named by the model's file or folder name (its whole name is among the settings hashed)
        journal = Journal(args.ckpt_path, journal_name(SCRIPT, Path(args.model_name).name, args.seed,
                                                       *played_settings(args, starts)))
        results, failed, records, clocks = [], [], [], {}
        for number, config in enumerate(configs, 1):
            label = f"configuration {number} ({config['name']})"
            try:
                # played in this thread (the journal's ``prepare``), journalled as soon as it ends
                (kept,) = journal.run([(config_key(config), config)], _as_is, desc=label,
                                      prepare=lambda config: played(args, config, envs, starts))
            except UsageError:
                raise  # bad input, the same for every configuration
            except Exception as error:
                logger.exception("%s failed while playing; the others play on", label)
                failed.append(f"{label}: {type(error).__name__}: {' '.join(str(error).split())}")
                continue
            results.append({**config, "levels": kept["levels"]})
            records += kept["episodes"]
            clocks[config["name"]] = kept["seconds"]
    finally:
        for env in envs:
            env.close()
    if not results:
        return EvaluationRun(None, results, failed)
    run_dir = checkpoints.make_run_dir(args, SCRIPT)
    table = save_results(run_dir, results, f"Evaluation on {args.env}", success=success_name(args))
    write_jsonl(run_dir / EPISODES, records)
    write_json(run_dir / SECONDS, clocks)  # apart from results.json, which the same episodes make the same
    if not failed:
        journal.path.unlink()  # finished: a later run plays afresh
    print(f"\n[evaluate] {args.env}: {len(starts)} episodes per configuration; saved in {run_dir}\n\n{table}")
    return EvaluationRun(run_dir, results, failed)


def _as_is(levels: dict) -> dict:
    return levels


def played_settings(args, starts: list[EpisodeStart]) -> tuple:
    """What the figures of a configuration depend on besides its checkpoints: every flag but
    :data:`_NOT_PLAYING`, and the test episodes."""
    flags = sorted((name, value) for name, value in args.to_dict().items() if name not in _NOT_PLAYING)
    return flags, [(start.seed, start.level, start.options) for start in starts]


def main(args) -> int:
    # Edit this list to evaluate several configurations in one run, e.g.
    # {"env": "taxi", "load_dir": "results/12_rl_finetune/checkpoint-100",
    #  "reflect_load_dir": "results/10_supervised_pretrain/checkpoint-500", "name": "Reflect-RL"},
    # {"env": "taxi", "load_dir": "base", "name": "base model"}
    EVAL_LOAD_LIST: list[dict] = []  # noqa: N806 - the name the paper's users edit
    evaluation = run(args, EVAL_LOAD_LIST)
    if evaluation.failed:
        kept = (f"the results of the {len(evaluation.results)} others are in {evaluation.run_dir}" if evaluation.results
                else "no configuration finished")
        print(f"{PROG}: error: {'; '.join(evaluation.failed)} (failed while playing, traceback above); {kept}; the "
              "same command plays again only what did not finish", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, PROG))
