"""ALFWorld's offline oracle writer (``--api oracle`` of ``data_gen.alfworld.reflection``).

It reads the game's text (the task sentence, where the agent stands, what it holds, where it saw
the target object), judges the last command against the expert's, and turns the expert's next
command into a plan, with wording varied by a generator of its own.
"""

import re
from dataclasses import dataclass, field

from prompts import split_observation

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
