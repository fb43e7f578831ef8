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
command into a plan. Its wording varies with a generator of its own, so an episode's
states and actions depend only on ``--seed`` and the episode's index, not on the writer.

Games that fail (engine error, timeout) are recorded by the env in
``<output_dir>/alfworld_blocklist.txt`` and skipped from then on; their episodes keep
the states played before the failure and are counted as engine errors.
"""

import logging
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from data_gen.common import (
    Journal,
    Unfinished,
    item_rng,
    print_counts,
    random_prob,
    reflect_with_api,
    usable_records,
    write_json,
)
from data_gen.common import journal_name as common_journal_name
from envs import env_kwargs, make_env
from envs.base import rng_seed
from experiment_args import parse_args, require_env
from llm import concurrency, make_client, model_name, stops_on_llm_error
from paths import DATA_DIR
from prompts import split_observation

logger = logging.getLogger(__name__)

DEFAULT_RANDOM_PROB = 0.7
OUT_DIR = DATA_DIR / "alfworld"
STEP = "alfworld.reflection"
RECORD_VERSION = 2  # 2: records keep the label taken

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


# --- reading the game's text ------------------------------------------------------------

_COMMANDS = (
    ("go", re.compile(r"go to (?P<recep>.+)")),
    ("take", re.compile(r"take (?P<obj>.+) from (?P<recep>.+)")),
    ("move", re.compile(r"move (?P<obj>.+) to (?P<recep>.+)")),
    ("move", re.compile(r"put (?P<obj>.+) (?:in/on|in|on) (?P<recep>.+)")),
    ("open", re.compile(r"open (?P<recep>.+)")),
    ("close", re.compile(r"close (?P<recep>.+)")),
    ("heat", re.compile(r"heat (?P<obj>.+) with (?P<recep>.+)")),
    ("cool", re.compile(r"cool (?P<obj>.+) with (?P<recep>.+)")),
    ("clean", re.compile(r"clean (?P<obj>.+) with (?P<recep>.+)")),
    ("slice", re.compile(r"slice (?P<obj>.+) with (?P<recep>.+)")),
    ("use", re.compile(r"use (?P<recep>.+)")),
    ("examine", re.compile(r"examine (?P<recep>.+)")),
    ("look", re.compile(r"look")),
    ("inventory", re.compile(r"inventory")),
    ("help", re.compile(r"help")),
)
_GERUNDS = {
    "go": "going to {recep}", "take": "taking {obj} from {recep}", "move": "putting {obj} in {recep}",
    "open": "opening {recep}", "close": "closing {recep}", "heat": "heating {obj} with {recep}",
    "cool": "cooling {obj} with {recep}", "clean": "cleaning {obj} with {recep}",
    "slice": "slicing {obj} with {recep}", "use": "using {recep}", "examine": "examining {recep}",
    "look": "looking around", "inventory": "checking my inventory", "help": "asking for help",
}
_PARTICIPLES = {"heat": "heated", "cool": "cooled", "clean": "cleaned", "slice": "sliced"}
# "put a tomato in microwave.", "put some tomato on microwave.", "clean some apple and put it in
# fridge.", "put a hot egg in countertop.", "find two soapbar and put them in cabinet.", "look at
# bowl under the desklamp." (alfworld's task grammar).
_TASK_OBJECT = re.compile(r"^(?:put|find|clean|heat|cool|look at|examine)\s+(?:a|an|some|two|the)?\s*"
                          r"(?:clean|hot|cool|cold)?\s*(\w+)")
_TASK_RECEP = re.compile(r"\b(?:in|on|in/on)\s+(?:the\s+)?(\w+)\s*\.?$")
_ARRIVE = re.compile(r"You arrive at (.+?)\.")
_SEE = re.compile(r"you see (.+?)\.(?:\s|$)")
_PICK = re.compile(r"You pick up the (.+?) from the (.+?)\.")
_PLACE = re.compile(r"You (?:move|put) the (.+?) (?:to|in|on) the (.+?)\.")


def parse_command(command: str) -> tuple[str, dict[str, str]]:
    """``("take", {"obj": "tomato 1", "recep": "countertop 1"})``; unknown commands → ``("other", {})``."""
    for verb, pattern in _COMMANDS:
        match = pattern.fullmatch(command.strip())
        if match:
            return verb, match.groupdict()
    return "other", {}


def gerund(command: str) -> str:
    """``"go to fridge 1"`` → ``"going to fridge 1"`` (for "... was a useful step")."""
    verb, parts = parse_command(command)
    return _GERUNDS[verb].format(**parts) if verb in _GERUNDS else f"the command {command!r}"


def _article(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiou" else f"a {noun}"


def _listed_items(text: str) -> list[str]:
    """``"a fork 2, a mug 1, and a tomato 1"`` → ``["fork 2", "mug 1", "tomato 1"]``."""
    items = []
    for part in re.split(r",\s*(?:and\s+)?|\s+and\s+", text):
        part = re.sub(r"^(?:a|an|some|the)\s+", "", part.strip())
        if part and part != "nothing":
            items.append(part)
    return items


@dataclass
class Memory:
    """What the agent has learnt in this episode, read from the game's replies."""

    task: str  # the task sentence without its final period
    target: str | None = None  # object type the task is about, e.g. "tomato"
    destination: str | None = None  # receptacle type it must end in, e.g. "microwave"
    location: str | None = None
    holding: str | None = None
    seen: dict[str, str] = field(default_factory=dict)  # target instance -> where it was seen

    @classmethod
    def from_task(cls, task_sentence: str) -> "Memory":
        task = task_sentence.strip().rstrip(".").strip()
        target, destination = _TASK_OBJECT.search(task), _TASK_RECEP.search(task)
        return cls(task=task, target=target.group(1) if target else None,
                   destination=destination.group(1) if destination else None)

    def is_target(self, name: str | None) -> bool:
        return bool(name and self.target and re.fullmatch(rf"{re.escape(self.target)} \d+", name))

    def is_destination(self, name: str | None) -> bool:
        return bool(name and self.destination and re.fullmatch(rf"{re.escape(self.destination)} \d+", name))

    def update(self, command: str, reply: str) -> list[str]:
        """Take in one step; returns target instances this reply revealed for the first time."""
        verb, parts = parse_command(command)
        arrive = _ARRIVE.search(reply)
        if arrive:
            self.location = arrive.group(1)
        elif verb in ("open", "examine") and reply != "Nothing happens.":
            self.location = parts.get("recep", self.location)
        revealed = []
        see = _SEE.search(reply)
        if see and self.location:
            for item in _listed_items(see.group(1)):
                if self.is_target(item):
                    if item not in self.seen:
                        revealed.append(item)
                    self.seen[item] = self.location
        pick, place = _PICK.search(reply), _PLACE.search(reply)
        if pick:
            self.holding = pick.group(1)
            self.seen.pop(self.holding, None)
        elif place:
            self.holding = None
            if self.is_target(place.group(1)):
                self.seen[place.group(1)] = place.group(2)
        return revealed


@dataclass
class LastStep:
    command: str
    reply: str
    was_expert: bool | None  # None: the expert had no command in that state
    revealed: list[str]


def last_reply(observation: str, command: str, action_head: str) -> str:
    """The game's answer to ``command``, read from the history section of the new observation."""
    before, _ = split_observation(observation, action_head)
    marker = f"> {command}\n"
    index = before.rfind(marker)
    return before[index + len(marker):].strip() if index >= 0 else ""


# --- the oracle writer ------------------------------------------------------------------


def _pick(rng, options: list[str]) -> str:
    return options[int(rng.integers(len(options)))]


def _situation(memory: Memory, last: LastStep | None, rng) -> str:
    """First sentence: the task, how the last command went, and what the agent holds."""
    opener = _pick(rng, ["The task is to {task}", "My goal is to {task}", "I need to {task}"]).format(
        task=memory.task)
    if last is None:
        verdict = "I have just started"
    elif last.reply == "Nothing happens.":
        verdict = f"{gerund(last.command)} did nothing"
    elif last.revealed and not last.was_expert:
        verdict = f"{gerund(last.command)} was not planned but showed me {' and '.join(last.revealed)}"
    elif last.was_expert is None:
        verdict = f"my last step was {gerund(last.command)}"
    elif last.was_expert:
        verdict = gerund(last.command) + _pick(rng, [" was a useful step", " moved me forward",
                                                      " was the right move"])
    else:
        verdict = gerund(last.command) + _pick(rng, [" was a detour", " did not bring me closer",
                                                      " did not help with that"])
    where = f"I am at {memory.location} holding" if memory.location else "I am holding"
    if memory.holding is None:
        thing = _article(memory.target) if memory.target else "anything"
        status = f"I am not holding {thing} yet" if memory.target else "I am not holding anything"
    elif memory.is_target(memory.holding) or memory.target is None:
        status = f"{where} {memory.holding}"
    else:
        status = f"I am holding {memory.holding}, which is not what the task needs"
    return f"{opener}; {verdict}, and {status}."


def _plan(memory: Memory, best: str, rng) -> str:
    """Second sentence: the expert's next command, phrased as the reason for doing it."""
    verb, parts = parse_command(best)
    recep, obj = parts.get("recep", ""), parts.get("obj", "")
    target = memory.target or "the object I need"
    a_target = _article(memory.target) if memory.target else target
    holds_target = memory.is_target(memory.holding)
    if verb == "go":
        if holds_target and memory.is_destination(recep):
            return _pick(rng, [f"Now I should carry it over to {recep}.",
                               f"Next I should bring {memory.holding} to {recep}."])
        if holds_target:
            return f"With {memory.holding} in hand, {recep} is where I should head next."
        spotted = [name for name, place in memory.seen.items() if place == recep]
        if spotted:
            return _pick(rng, [f"{spotted[0].capitalize()} should be at {recep}, so I should go there next.",
                               f"I saw {spotted[0]} at {recep}, so I should head back there."])
        if memory.target:
            return _pick(rng, [f"I have not found {a_target} yet, so I should search {recep} next.",
                               f"No {target} has turned up so far, so {recep} is the next place to check."])
        return f"{recep.capitalize()} is where I should head next."
    if verb == "open":
        if holds_target and memory.is_destination(recep):
            return f"I stand at {recep} with {memory.holding} but it is closed, so I should open it first."
        if holds_target:
            return f"With {memory.holding} in hand, I should open {recep} next."
        return _pick(rng, [f"{recep.capitalize()} is closed, so I should open it and look inside for {a_target}.",
                           f"{a_target.capitalize()} could be inside the closed {recep}, so I should open it."])
    if verb == "close":
        if holds_target:
            return f"I should close {recep} before moving on."
        return _pick(rng, [f"There is no {target} in {recep}, so I should close it and keep looking.",
                           f"{recep.capitalize()} holds nothing I need, so I should shut it and move on."])
    if verb == "take":
        return _pick(rng, [f"{obj.capitalize()} is right here at {recep}, so I should pick it up.",
                           f"I can see {obj} at {recep}, so I should take it."])
    if verb == "move":
        return _pick(rng, [f"Now I can place {obj} in {recep} as the task asks.",
                           f"All that is left is to put {obj} in {recep}."])
    if verb in _PARTICIPLES:
        return f"{obj.capitalize()} still needs to be {_PARTICIPLES[verb]}, so I should use {recep} for that now."
    if verb == "use":
        return f"I should turn on {recep} now."
    if verb == "examine":
        return f"I should examine {recep} more closely."
    if verb == "look":
        return _pick(rng, ["I should first look around to get my bearings.",
                           "A look around would tell me where I am before I move on."])
    if verb == "inventory":
        return "I should check what I am carrying."
    return f"The next thing to do is to {best}."


def oracle_reflection(memory: Memory, best: str, last: LastStep | None, rng) -> str:
    """Two sentences from what the environment knows: the task, the episode so far, the expert's plan."""
    return f"{_situation(memory, last, rng)} {_plan(memory, best, rng)}"


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
                               *([] if args.alfworld_spoiler else ["no spoiler"]))


@stops_on_llm_error(STEP, "episodes")
def main(args) -> int:
    require_env(args, "alfworld", STEP)
    out_dir = Path(OUT_DIR if args.output_dir is None else args.output_dir)
    # The env names --alfworld_data and $ALFWORLD_DATA when neither gives a data root.
    env = make_env("alfworld", **env_kwargs(args, run_dir=out_dir))
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
    sys.exit(main(parse_args(prog="python -m data_gen.alfworld.reflection", env="alfworld")))
