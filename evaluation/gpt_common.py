"""What the two API-model evaluations share: episodes, concurrent play, resume, summary, files.

The test episodes are played side by side (``--max_concurrency``), each on an environment
of its own, and every finished episode is journalled in ``<ckpt_path>/.progress/``: a run
that stops (an API failure, Ctrl-C) keeps its finished episodes, and the same command
resumes. The run folder ``<ckpt_path>/<id>_<script>/`` is made once all episodes are played.
"""

import hashlib
import json
from pathlib import Path

from data_gen.common import Journal, journal_name
from envs import EnvPool, EnvSettings, env_kwargs, make_env
from evaluation.episodes import test_episodes
from evaluation.gpt_agent import api_instructions, as_episode, play_episode
from evaluation.report import save_results, success_name, summarise
from rollout import EpisodeStart
from utils import checkpoints
from utils.io import write_jsonl
from utils.llm import concurrency, make_client, stops_on_llm_error

UNUSABLE_FILE = "unusable_answers.jsonl"


def episode_key(start: EpisodeStart) -> str:
    """A test episode's name in the journal: its level, seed and options."""
    digest = hashlib.sha256(json.dumps(start.options, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{start.level}|{start.seed}|{digest}"


def run_gpt_evaluation(args, script: str, reps: int) -> int:
    """Play the test episodes (``reps`` per task or level) with the model behind ``--api``; save the results.
    An API failure ends it with one line (finished episodes are journalled; the same command resumes)."""
    if args.api == "oracle":
        raise ValueError("--api: evaluating a model needs --api openai, azure or local (oracle is a data writer)")
    return stops_on_llm_error(script, "episodes")(lambda args: _evaluate(args, script, reps))(args)


def _evaluate(args, script: str, reps: int) -> int:
    client = make_client(args)
    env_settings = EnvSettings.from_args(args)
    pool = EnvPool(lambda: make_env(args.env, **env_kwargs(env_settings, evaluation=True)))
    try:
        with pool.env() as env:
            starts = test_episodes(args, env, reps)
        # The journal is the model's (api, name), not the address's: a restarted server resumes it.
        settings = (args.env, sorted(env_kwargs(env_settings, evaluation=True).items()),
                    [episode_key(start) for start in starts], api_instructions(args.env), args.gpt_protocol)
        journal = Journal(args.ckpt_path, journal_name(script, f"{args.api}-{args.model}", args.seed, *settings))

        def play(start: EpisodeStart) -> dict:
            with pool.env() as env:
                return play_episode(client, env, args.env, start, temperature=0.0, protocol=args.gpt_protocol)

        played = journal.run([(episode_key(start), start) for start in starts], play,
                             desc=f"{args.model} on {args.env}", **concurrency(client))
    finally:
        pool.close()
        client.close()
    return _report(args, script, client, starts, played)


def _report(args, script: str, client, starts: list[EpisodeStart], played: list[dict]) -> int:
    run_dir = checkpoints.make_run_dir(args, script)
    answers = sum(episode["answers"] for episode in played)
    unusable = [dict(level=episode["level"], seed=episode["seed"], **answer)
                for episode in played for answer in episode["unusable"]]
    empty = sum(not answer["answer"].strip() for answer in unusable)
    name = f"{args.api}:{args.model}" + {"two_turn": "", "one_turn": " (one turn)", "react": " (ReAct)"}[
        args.gpt_protocol]
    episodes = [as_episode(episode, start) for episode, start in zip(played, starts)]
    results = [{"name": name, "levels": summarise(episodes), "answers": answers, "unusable_answers": len(unusable),
                "empty_answers": empty}]
    tally = (f"{len(unusable)} of {answers} answers unusable ({empty} empty, {len(unusable) - empty} naming no "
             "listed action), each played as a wasted step")
    write_jsonl(Path(run_dir) / UNUSABLE_FILE, unusable)
    table = save_results(run_dir, results, f"{name} on {args.env}", f"\n{tally}\n", success_name(args))
    print(f"\n[{script}] {name} on {args.env}: {len(episodes)} episodes; {tally} (listed in "
          f"{Path(run_dir) / UNUSABLE_FILE}); saved in {run_dir}\n\n{table}\n{client.usage.summary()}")
    return 0
