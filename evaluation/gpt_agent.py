"""An API model (OpenAI, Azure, or a local OpenAI-compatible server) playing our environments.

It sees the same observations as the trained policy, behind a more detailed instruction
(in-context models need the rules spelled out), and answers with a choice label. Its
answers are parsed leniently ("3", "3.", "Action 3", "Action: c", "(b)", or the
command's own text); an answer naming no listed action is counted as unusable and
played as a label outside the list (the state stays as it was; the step counts).
"""

import re
from dataclasses import dataclass

from envs.base import TextEnv
from llm import ChatClient
from rollout import Decision, Episode, EpisodeStart

INSTRUCTIONS = {
    "taxi": (
        "You drive a taxi in a 5x5 grid city shown as an ASCII map: '|' is a wall, ':' open road. "
        "The depots are R (top left), G (top right), Y (bottom left) and B (bottom). On the map T is the "
        "taxi, P the waiting passenger, D the destination, O the taxi standing on the passenger's cell, "
        "X the taxi carrying the passenger. Rows count from 0 at the top, columns from 0 at the left. "
        "South increases the row, east increases the column. Drive to the passenger, pick them up, drive "
        "to the destination and drop them off, in as few moves as possible. Driving into a wall, picking "
        "up where there is no passenger or dropping off where you may not ends the game with a penalty."
    ),
    "alfworld": (
        "You are a household robot in a text world. Read the task after 'Your task is to:' and complete it "
        "with the listed commands: go to places, open and close receptacles, take objects from where they "
        "are and move them to where they belong. Search likely places for the object you need."
    ),
    "auto_explore": (
        "You explore a software repository to find the one file that answers a user's question. 'cd DIR' "
        "enters a folder, 'cd ..' goes to the parent folder, 'cat FILE' shows a file, 'id FILE' identifies "
        "FILE as the answer and ends the search (a wrong file fails). Every command costs a step: move "
        "towards the answer directly, read a file before identifying it."
    ),
}
ANSWER_RULE = ("Reply with the label of exactly one action from the list (the text before the '.' of its "
               "line), for example: Action: 3")

_EXPLICIT = re.compile(r"\b(?:action|choice|answer|option|label|command)\s*(?:is|:|#|=)?\s*\(?([0-9]{1,3}|[A-Za-z])\)?"
                       r"(?![A-Za-z0-9])", re.IGNORECASE)
_TOKEN = re.compile(r"(?<![A-Za-z0-9])\(?([0-9]{1,3}|[A-Za-z])\)?(?=[.):,]?(?:\s|$))")


def parse_choice(answer: str, labels: list[str], actions: list[str]) -> str | None:
    """The label an answer names, or None if it names none (or several, ambiguously)."""
    text = answer.strip()
    if not text:
        return None
    bare = text.strip("`'\"*().: ")
    if bare in labels:
        return bare
    explicit = [m for m in _EXPLICIT.findall(text) if m in labels]
    if explicit:
        return explicit[-1]  # the final statement wins over earlier deliberation
    named = [label for label, action in zip(labels, actions) if action.lower() in text.lower()]
    if len(named) == 1:
        return named[0]
    first_line = text.splitlines()[0]
    tokens = [t for t in _TOKEN.findall(first_line) if t in labels and (t.isdigit() or len(first_line) <= 4)]
    if len(set(tokens)) == 1:
        return tokens[0]
    return None


@dataclass
class ApiPlay:
    """The episodes an API model played, how many answers it gave and how many named no listed action."""

    episodes: list[Episode]
    answers: int
    unusable: int


def play(client: ChatClient, env: TextEnv, env_name: str, starts: list[EpisodeStart],
         temperature: float = 0.0) -> ApiPlay:
    """Play ``starts`` one after another."""
    episodes, answers, unusable = [], 0, 0
    for start in starts:
        obs, info = env.reset(seed=start.seed, options=start.options)
        episode = Episode(seed=start.seed, options=start.options, level=start.level)
        while True:
            messages = [{"role": "system", "content": INSTRUCTIONS[env_name]},
                        {"role": "user", "content": f"{obs}\n{ANSWER_RULE}"}]
            reply = client.complete(messages, temperature=temperature, max_tokens=64)
            answers += 1
            label = parse_choice(reply, info["labels"], info["actions"])
            if label is None:
                unusable += 1
                label = "\u00d8"  # no listed label: the env keeps its state and counts the step
            obs, reward, terminated, truncated, info = env.step(label)
            episode.decisions.append(Decision(obs="", prompt="", valid=[], action=-1, logprob=0.0, entropy=0.0,
                                              reward=float(reward)))
            if terminated or truncated:
                episode.success, episode.cost = bool(info["success"]), float(info["cost"])
                break
        episodes.append(episode)
    return ApiPlay(episodes, answers, unusable)

