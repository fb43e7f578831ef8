"""python -m data_gen.alfworld.reflection: reflections on "oracle + random p" ALFWorld rollouts.

Each episode plays a game of ``--alfworld_split`` / ``--alfworld_task`` (the paper's
tomato→microwave family by default; data root from ``--alfworld_data`` or
``$ALFWORLD_DATA``) and takes a random admissible command with probability
``--random_prob`` (0.7, as the paper) and the expert's otherwise. At every state the
writer gives a reflection of one sentence at the first state and at most two later, knowing
(as a spoiler it must not reveal) the expert's next command; ``--no_alfworld_spoiler``: not
knowing it, as the paper's ALFWorld writer. Output ``data/alfworld/data_reflection.json``:
records ``{state, reflection, action, command, model, episode, step, problem}`` where
``action`` is the expert's label in ``state``, ``command`` its text and ``problem`` the
trial folder relative to the data root. States where the expert has no admissible
command get no record (they are counted).

Writers: an API model (``--api openai|azure|local``) or ``--api oracle``, which reads
the task sentence, tracks what the agent holds, where it stands and where it saw the
target object, judges the last command against the expert, and turns the expert's next
command into a plan (``data_gen/alfworld/oracle_writer.py``). Its wording varies with a generator
of its own, so an episode's states and actions depend only on ``--seed`` and the episode's index,
not on the writer.

Games that fail (engine error, timeout) are recorded by the env in
``<output_dir>/alfworld_blocklist.txt`` and skipped from then on; their episodes keep
the states played before the failure and are counted as engine errors.
"""

import logging
import sys
from pathlib import Path

from data_gen.alfworld.oracle_writer import LastStep, Memory, last_reply, oracle_reflection
from data_gen.common import (
    Journal,
    Unfinished,
    item_rng,
    print_counts,
    random_prob,
    reflect_with_api,
    usable_records,
)
from data_gen.common import journal_name as common_journal_name
from envs import EnvSettings, env_kwargs, make_env
from envs.base import rng_seed
from experiment_args import require_env, run_script
from utils.errors import UsageError
from utils.io import write_json
from utils.llm import concurrency, make_client, model_name, stops_on_llm_error
from utils.paths import DATA_DIR

logger = logging.getLogger(__name__)

DEFAULT_RANDOM_PROB = 0.7
OUT_DIR = DATA_DIR / "alfworld"
STEP = "alfworld.reflection"
RECORD_VERSION = 3  # 2: records keep the label taken; 3: states show the whole history

SYSTEM = ("You coach an agent in a text-based household game (ALFWorld). You write short, concrete "
          "analyses of the current situation that help the agent choose its next command.")
# The API writer's request: one sentence at the first step, two later, as the paper's; with the expert's
# next command as a spoiler (--alfworld_spoiler; the paper's ALFWorld writer had none).
FIRST_ASK = "Write one sentence: what the task needs and what the agent should aim for first."
LATER_ASK = ("Write at most two sentences: what the task needs, what the last command achieved, and what the "
             "agent should aim for next.")
SPOILER = ('\nSpoiler, for you only: the best next command is "{best}". Do not quote it or call it the best '
           "command; reason about the task, the room and the history so that the agent can find it.")


def writer_prompt(observation: str, best: str | None, first: bool) -> str:
    """What an API writer is asked at a state; ``best``: the spoiler, or None for none."""
    ask = FIRST_ASK if first else LATER_ASK
    return f"{observation}\n{ask}" + ("" if best is None else SPOILER.format(best=best))


# --- rollouts ---------------------------------------------------------------------------


def play(args, env, index: int, oracle_writer: bool) -> tuple[dict, list[tuple[str, str]]]:
    """One episode on the shared ``env``: a record per state where the expert has a command, what
    happened, and what to ask an API writer for each record (its prompt and spoiler). The actions
    do not depend on the reflections, so all of them can be asked at once, after the episode."""
    rng = item_rng(args.seed, "alfworld", index)
    # Wording draws from its own generator, so the trajectories do not depend on the writer.
    wording = item_rng(args.seed, "alfworld", index, "wording")
    p_random = random_prob(args, DEFAULT_RANDOM_PROB)
    observation, info = env.reset(seed=rng_seed(rng))
    problem = Path(info["problem"])
    if env.data_root is not None and problem.is_relative_to(env.data_root):
        problem = problem.relative_to(env.data_root)
    memory = Memory.from_task(env.task_description)
    records, asks, skipped, last = [], [], 0, None
    while True:
        best_label = info["oracle_label"]
        if best_label is None:
            skipped += 1
        else:
            best = info["actions"][info["labels"].index(best_label)]
            reflection = oracle_reflection(memory, best, last, wording) if oracle_writer else None
            spoiler = best if args.alfworld_spoiler else None
            asks.append((writer_prompt(observation, spoiler, first=env.steps == 0), spoiler))
        explore = rng.random() < p_random
        label = best_label if best_label is not None and not explore else str(rng.choice(info["labels"]))
        if best_label is not None:
            records.append({"state": observation, "reflection": reflection, "action": best_label, "command": best,
                            "taken": label, "model": model_name(args), "episode": index, "step": env.steps,
                            "problem": str(problem)})
        command = info["actions"][info["labels"].index(label)]
        observation, _, terminated, truncated, info = env.step(label)
        reply = last_reply(observation, command, env.action_head)
        revealed = memory.update(command, reply)
        last = LastStep(command, reply, None if best_label is None else label == best_label, revealed)
        if terminated or truncated:
            if info.get("engine_error"):
                logger.warning("episode %d: game %s failed (%s); its %d states so far are kept and the "
                               "problem is on the block list", index, problem, info["engine_error"], len(records))
            return {"records": records, "skipped_states": skipped, "won": bool(info["success"]),
                    "engine_error": info.get("engine_error"), "problem": str(problem)}, asks


def reflect(client, played: tuple[dict, list[tuple[str, str]]]) -> dict | Unfinished:
    """An episode played by :func:`play`, with the API writer's reflections (the oracle's are there)."""
    result, asks = played
    if client is None:
        return result
    return reflect_with_api(client, SYSTEM, result["records"], asks, result)


def journal_name(args) -> str:
    """The journal of one configuration: a change of any setting starts a fresh one."""
    return common_journal_name("alfworld_reflection", model_name(args), args.seed, args.alfworld_task,
                               args.alfworld_split, args.alfworld_expert, random_prob(args, DEFAULT_RANDOM_PROB),
                               args.horizon, args.shuffle_action, RECORD_VERSION,
                               *([] if args.alfworld_spoiler else ["no spoiler"]),
                               *([] if args.alfworld_history_steps == 0 else [f"history {args.alfworld_history_steps}"]),
                               *([] if args.text_layout == "ours" else [f"{args.text_layout} text"]))


@stops_on_llm_error(STEP, "episodes")
def main(args) -> int:
    require_env(args, "alfworld", STEP)
    if args.alfworld_expert == "none":
        raise UsageError(f"--alfworld_expert none: {STEP} needs an expert (its oracle labels the data); "
                         "give handcoded or planner")
    out_dir = Path(OUT_DIR if args.output_dir is None else args.output_dir)
    # The env names --alfworld_data and $ALFWORLD_DATA when neither gives a data root.
    env = make_env("alfworld", **env_kwargs(EnvSettings.from_args(args), run_dir=out_dir))
    try:
        client = make_client(args)
        journal = Journal(out_dir, journal_name(args))
        items = [(f"episode-{i}", i) for i in range(args.num_episodes)]
        # The shared env plays the episodes in order; their reflections are asked for concurrently.
        episodes = journal.run(items, lambda played: reflect(client, played), desc="alfworld reflections",
                               prepare=lambda i: play(args, env, i, oracle_writer=client is None),
                               **concurrency(client))
        blocked = len(env.blocked)
    finally:
        env.close()
    records, missing = usable_records([episode["records"] for episode in episodes])
    path = out_dir / "data_reflection.json"
    write_json(path, records)
    failed = sum(1 for episode in episodes if episode["engine_error"])
    counts = {"episodes": len(episodes), "won": sum(episode["won"] for episode in episodes),
              "states": len(records), "skipped states (no expert command)": sum(
                  episode["skipped_states"] for episode in episodes),
              "engine errors": failed, "blocked problems": blocked, "output": str(path)}
    if blocked:
        counts["block list"] = str(env.block_list)
    print_counts(STEP, counts, client, missing=missing, unfinished=len(journal.unfinished))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m data_gen.alfworld.reflection", env="alfworld"))
