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

Before the first episode, every configuration is checked (``evaluation/configs.py``): its keys and env,
and each checkpoint (it exists, is one, of the player it is given as, with this model's choice labels and, for an RL
checkpoint, the settings of what it reads: ``utils/checkpoint_checks.py``), and that no two share a name (each
is a row of the results, found by its name; one without a name takes its checkpoints'). Any bad one stops
the run with one line naming each bad entry, its number and name; nothing is played or written.

Every configuration plays the same test episodes (``evaluation/episodes.py``) through the rollout used in
RL (``rollout/``), with the same seeds and sampling randomness:

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
curriculum order), with the number of episodes behind each figure, are printed and saved (``evaluation/report.py``) as
``results.json`` and ``results.md`` in ``results/<id>_evaluate/``, made once every configuration
has played.
"""

import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from data_gen.common import Journal, journal_name
from envs import EnvSettings, env_kwargs, make_env
from evaluation.configs import config_key, load_configs, policy_dir
from evaluation.episodes import HELD_OUT_SEED, test_episodes, validation_episodes
from evaluation.report import figures, save_results, success_name, summarise
from experiment_args import run_script
from rollout import EpisodeStart, TwoPlayerRollout
from utils import checkpoints, models
from utils.errors import UsageError
from utils.io import write_json, write_jsonl

SCRIPT = "evaluate"
EPISODES = "episodes.jsonl"  # in a run's folder: every episode of every configuration (episode_record)
SECONDS = "seconds.json"  # in a run's folder: where each configuration's time went (evaluate_config)
PROG = "python -m evaluation.evaluate"
logger = logging.getLogger(__name__)
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
        settings = EnvSettings.from_args(args)
        self.envs = [make_env(args.env, **env_kwargs(settings, evaluation=True, run_dir=run_dir, labels=labels))
                     for _ in range(args.per_device_eval_batch_size)]
        self.starts = validation_episodes(args, self.envs[0], args.eval_panel)

    def evaluate(self, rollout: TwoPlayerRollout) -> dict:
        episodes = play_all(rollout, self.envs, self.starts, np.random.default_rng(HELD_OUT_SEED))
        summary = figures(episodes)
        return {"heldout_success": summary["success"], "heldout_cost": summary["cost"],
                "heldout_episodes": summary["episodes"]}


def run(args, eval_load_list: list[dict]) -> EvaluationRun:
    """Check every configuration, play those the journal does not hold, then write the run folder."""
    configs = load_configs(args, eval_load_list)
    labels = models.policy_labels(args.model_name)  # every configuration shares the base model, so its choice labels
    settings = EnvSettings.from_args(args)
    envs = [make_env(args.env, **env_kwargs(settings, evaluation=True, labels=labels))
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
