"""python -m data_gen.taxi.reflection: reflections on "oracle + random p" Taxi rollouts.

Each episode takes a random action with probability ``--random_prob`` (0.9, as the
paper) and the BFS oracle's otherwise. At every state the writer gives a reflection of
at most two sentences, knowing (as a spoiler it must not reveal) the best next action.
Output ``data/taxi/data_reflection.json``: records ``{state, reflection, action,
command, taken, model, ...}`` where ``action`` is the oracle's label in ``state`` and
``taken`` the label the rollout took there (``gen_sft --sft_label`` picks one).

Writers: an API model (``--api openai|azure|local``) or ``--api oracle``, which states
where taxi, passenger and destination are, judges the last move against the oracle, and
names the direction that the BFS plan takes next.
"""

import sys

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
from envs import make_env
from envs.base import rng_seed
from envs.taxi import DangerousTaxiEnv, curriculum_at
from experiment_args import require_env, run_script
from utils.io import write_json
from utils.llm import concurrency, make_client, model_name, stops_on_llm_error
from utils.paths import DATA_DIR

DEFAULT_RANDOM_PROB = 0.9
OUT_DIR = DATA_DIR / "taxi"
STEP = "taxi.reflection"
RECORD_VERSION = 2  # 2: records keep the label taken

SYSTEM = ("You coach a taxi driver in a small grid game. You write short, concrete analyses of the "
          "current situation that help the driver decide the next move.")
# The API writer's request, as the paper's: one sentence at the first step, two later, with the best next
# action as a spoiler and, after the first step, whether the last move was the best one then.
PROMPT = """{observation}
{ask}
Spoiler, for you only: the best next action is "{best}".{last} Do not quote it or call it the best action; \
reason about the map so that the driver can find it."""
FIRST_ASK = ("Write one sentence: where the taxi, the passenger and the destination are, and what the taxi "
             "should aim for first.")
LATER_ASK = ("Write at most two sentences: where the taxi, the passenger and the destination are, whether the "
             "last move was a good one, and what the taxi should aim for next.")
LAST_GOOD = ' The last move, "{move}", was the best one then.'
LAST_DETOUR = ' The last move, "{move}", was not the best one then ("{better}" was).'


def writer_prompt(observation: str, best: str, last: tuple[str, str] | None) -> str:
    """What an API writer is asked at a state; ``last``: (the move taken, the best move then), after the first."""
    if last is None:
        return PROMPT.format(observation=observation, ask=FIRST_ASK, best=best, last="")
    move, better = last
    note = LAST_GOOD.format(move=move) if move == better else LAST_DETOUR.format(move=move, better=better)
    return PROMPT.format(observation=observation, ask=LATER_ASK, best=best, last=note)

_GOALS = {
    "Move south": "head south", "Move north": "head north", "Move east": "head east", "Move west": "head west",
    "Pickup passenger": "pick up here", "Drop off passenger": "drop off here",
}


def oracle_reflection(env: DangerousTaxiEnv, best: str, last_move_good: bool | None) -> str:
    """Two short sentences from what the environment knows: the positions and the BFS plan.

    Deterministic and compact on purpose: every word a small reflection model must learn
    to write costs training and generation time, and carries no information if random.
    """
    where = env.positions()
    row, col = where["taxi"]
    destination = where["destination"]
    dest_row, dest_col = where["depot_cells"][destination]
    if where["passenger"] is None:
        facts = (f"Taxi at row {row}, column {col} with the passenger, going to {destination} "
                 f"(row {dest_row}, column {dest_col}).")
        purpose = "to reach the destination" if best.startswith("Move") else "to finish the ride"
    else:
        pass_row, pass_col = where["depot_cells"][where["passenger"]]
        facts = (f"Taxi at row {row}, column {col}; passenger at {where['passenger']} "
                 f"(row {pass_row}, column {pass_col}), going to {destination}.")
        purpose = "to reach the passenger" if best.startswith("Move") else "to start the ride"
    verdict = {None: "First move", True: "Last move was good", False: "Last move was a detour"}[last_move_good]
    return f"{facts} {verdict}; now {_GOALS[best]} {purpose}."


def advised_command(reflection: str | None) -> str | None:
    """The action an oracle-style reflection advises ("... now head south ..." -> "Move south"), or None."""
    if not reflection:
        return None
    found = [(reflection.find(f"now {goal} "), command) for command, goal in _GOALS.items()]
    found = [(at, command) for at, command in found if at >= 0]
    return min(found)[1] if found else None


def play(args, index: int, oracle_writer: bool) -> tuple[list[dict], list[tuple[str, str]]]:
    """One episode: a record per state visited, and what to ask an API writer for each (its prompt and
    spoiler). The actions taken do not depend on the reflections, so all of them can be asked at once;
    the oracle writer fills them in as it goes."""
    rng = item_rng(args.seed, "taxi", index)
    p_random = random_prob(args, DEFAULT_RANDOM_PROB)
    env = data_env(args)
    observation, info = env.reset(seed=rng_seed(rng))
    records, asks, last = [], [], None  # last: (the move taken, the best move then)
    while True:
        best_label = info["oracle_label"]
        best = info["actions"][info["labels"].index(best_label)]
        reflection = oracle_reflection(env, best, None if last is None else last[0] == last[1]) if oracle_writer \
            else None
        asks.append((writer_prompt(observation, best, last), best))
        label = str(rng.choice(info["labels"])) if rng.random() < p_random else best_label
        records.append({"state": observation, "reflection": reflection, "action": best_label, "command": best,
                        "taken": label, "model": model_name(args), "episode": index, "step": env.steps,
                        "curriculum": env.stage})
        last = (info["actions"][info["labels"].index(label)], best)
        observation, _, terminated, truncated, info = env.step(label)
        if terminated or truncated:
            return records, asks


def episode(args, client, index: int) -> list[dict] | Unfinished:
    """One episode's records, with their reflections; :class:`Unfinished` if some state got none."""
    records, asks = play(args, index, oracle_writer=client is None)
    if client is None:
        return records
    return reflect_with_api(client, SYSTEM, records, asks, records)


def journal_name(args) -> str:
    """The journal of one configuration: a change of any setting starts a fresh one."""
    return common_journal_name("taxi_reflection", model_name(args), args.seed, data_curriculum(args), args.horizon,
                               random_prob(args, DEFAULT_RANDOM_PROB),
                               args.shuffle_action, args.with_prompt, args.with_history, RECORD_VERSION,
                               *_text_settings(args))


def _text_settings(args) -> tuple:
    """What changes the observations' text beyond the flags above (none: the journal name stays as it was)."""
    changed = (args.text_layout != "ours", not args.taxi_depot_letters, not args.danger_on_first_step)
    return (args.text_layout, args.taxi_depot_letters, args.danger_on_first_step) if any(changed) else ()


def data_curriculum(args) -> str:
    """The task a Taxi data step plays: ``--taxi_curriculum --curriculum_index``'s level, else the full task."""
    return curriculum_at(args.curriculum_index if args.taxi_curriculum else None)


def data_env(args):
    """The environment a Taxi data step plays (reflection, brute_force)."""
    return make_env("taxi", horizon=args.horizon, shuffle_action=args.shuffle_action, with_prompt=args.with_prompt,
                    with_history=args.with_history, curriculum=data_curriculum(args), text_layout=args.text_layout,
                    depot_letters=args.taxi_depot_letters, danger_on_first_step=args.danger_on_first_step)


@stops_on_llm_error(STEP, "episodes")
def main(args) -> int:
    require_env(args, "taxi", STEP)
    out_dir = OUT_DIR if args.output_dir is None else args.output_dir
    client = make_client(args)
    journal = Journal(out_dir, journal_name(args))
    items = [(f"episode-{i}", i) for i in range(args.num_episodes)]
    episodes = journal.run(items, lambda i: episode(args, client, i), desc="taxi reflections",
                           **concurrency(client))
    records, missing = usable_records(episodes)
    path = f"{out_dir}/data_reflection.json"
    write_json(path, records)
    counts = {"episodes": len(episodes), "states": len(records), "output": path}
    print_counts(STEP, counts, client, missing=missing, unfinished=len(journal.unfinished))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m data_gen.taxi.reflection", env="taxi"))
