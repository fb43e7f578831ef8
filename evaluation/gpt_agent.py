"""An API model (OpenAI, Azure, or a local OpenAI-compatible server) playing our environments.

It sees the same observations as the trained policy, behind a more detailed instruction
(in-context models need the rules spelled out), and answers with a choice label: by default
after reflecting on the episode so far, in one conversation per episode (the paper's
two-turn protocol), as a ReAct agent (``--gpt_protocol react``: a thought and an action per
answer), or with ``--gpt_protocol one_turn`` straight from each observation. Its
answers are parsed leniently ("3", "3.", "Action 3", "Action: c", "(b)", or the
command's own text). An answer that is empty or names no listed action is never mapped to an
action: it is counted and logged as unusable and played as a label outside the list, a wasted
step (the state stays as it was; the step costs what a step costs, see ``envs/base.py``).
At temperature 0 the same prompt is not sent twice (the client remembers the answer).
"""

import logging
import re

from envs import env_spec
from envs.base import TextEnv
from rollout import Decision, Episode, EpisodeStart
from utils.llm import ChatClient

logger = logging.getLogger(__name__)

ANSWER_RULE = ("Reply with the label of exactly one action from the list (the text before the '.' of its "
               "line), for example: Action: 3")
REFLECT_RULE = ("Before you act, reflect in at most two sentences: what has happened so far and what you should "
                "do next, and why. Do not name an action label yet.")
REACT_RULE = ("Answer in exactly this format:\nThought: <what you have learned and what to do next, in one or two "
              "sentences>\nAction: <the label of exactly one action from the list>")
PROTOCOLS = ("two_turn", "one_turn", "react")

_EXPLICIT = re.compile(r"\b(?:action|choice|answer|option|label|command)\s*(?:is|:|#|=)?\s*\(?([0-9]{1,3}|[A-Za-z])\)?"
                       r"(?![A-Za-z0-9])", re.IGNORECASE)
_TOKEN = re.compile(r"(?<![A-Za-z0-9])\(?([0-9]{1,3}|[A-Za-z])\)?(?=[.):,]?(?:\s|$))")


def api_instructions(env_name: str) -> str:
    """The system message of an API model playing ``env_name`` (its EnvSpec's ``api_instructions``)."""
    text = env_spec(env_name).api_instructions
    if not text:
        raise ValueError(f"--env {env_name}: its EnvSpec gives no api_instructions, which an API model needs")
    return text


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


NO_LABEL = "\u00d8"  # a label no environment lists: how an unusable answer is played


def play_episode(client: ChatClient, env: TextEnv, env_name: str, start: EpisodeStart,
                 temperature: float = 0.0, protocol: str = "two_turn") -> dict:
    """One episode played by the API model: its outcome, the rewards of its steps, how many answers
    the model gave, and the unusable ones (step and text), as a journal entry.

    ``two_turn`` (the paper's protocol): one conversation per episode; at each step the model reads
    the observation, writes a reflection, then answers with an action. ``react`` (the paper's ReAct
    baseline): one conversation; each answer is a thought and an action. ``one_turn``: each step is
    a fresh chat of the instruction and the observation, answered with an action.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"--gpt_protocol must be one of {PROTOCOLS}, got {protocol!r}")
    obs, info = env.reset(seed=start.seed, options=start.options)
    rewards, unusable, reflections = [], [], []
    conversation = [{"role": "system", "content": api_instructions(env_name)}]
    while True:
        if protocol == "one_turn":
            messages = [*conversation, {"role": "user", "content": f"{obs}\n{ANSWER_RULE}"}]
        elif protocol == "react":  # one conversation; each answer is a thought, then the action
            conversation.append({"role": "user", "content": f"{obs}\n{REACT_RULE}"})
            messages = conversation
        else:
            conversation.append({"role": "user", "content": f"{obs}\n{REFLECT_RULE}"})
            reflection = client.complete(conversation, temperature=temperature, max_tokens=120) or ""
            reflections.append(" ".join(reflection.split()))
            conversation += [{"role": "assistant", "content": reflection}, {"role": "user", "content": ANSWER_RULE}]
            messages = conversation
        reply = client.complete(messages, temperature=temperature, max_tokens=64) or ""  # None: no usable text
        if protocol != "one_turn":
            conversation.append({"role": "assistant", "content": reply})
        if protocol == "react":
            thought = re.search(r"thought\s*:\s*(.*?)(?:\n\s*action\s*:|$)", reply, re.IGNORECASE | re.DOTALL)
            reflections.append(" ".join(thought.group(1).split()) if thought else "")
        label = parse_choice(reply, info["labels"], info["actions"])  # None for an empty answer too
        if label is None:
            if not unusable or unusable[-1]["answer"] != reply:  # a repeated one is not logged again
                logger.info("episode %s (seed %d), step %d: unusable answer %.80r", start.level, start.seed,
                            len(rewards), reply)
            unusable.append({"step": len(rewards), "answer": reply})
        obs, reward, terminated, truncated, info = env.step(NO_LABEL if label is None else label)
        rewards.append(float(reward))
        if terminated or truncated:
            return {"level": start.level, "seed": start.seed, "success": bool(info["success"]),
                    "cost": float(info["cost"]), "rewards": rewards, "answers": len(rewards), "unusable": unusable,
                    "reflections": reflections}


def as_episode(played: dict, start: EpisodeStart) -> Episode:
    """A played episode (:func:`play_episode`) as the evaluation's :class:`rollout.Episode`."""
    episode = Episode(seed=start.seed, options=start.options, level=start.level)
    episode.decisions = [Decision(obs="", prompt="", valid=[], action=-1, logprob=0.0, entropy=0.0, reward=reward)
                         for reward in played["rewards"]]
    episode.success, episode.cost = played["success"], played["cost"]
    return episode
