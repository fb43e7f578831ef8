"""python -m data_gen.auto_explore.reflection_negative: trajectories with reflections, and negatives.

For each task of ``--task_file`` (default ``data/auto_explore/tasks_filtered/data.json``)
the writer drives an AutoExplore episode (no leave-out, ``--horizon``):

* **positive** (``info: "positive0"``): at every step the writer reads the observation,
  writes a reflection and chooses one listed command, until it identifies a file or
  runs out of steps. An API answer that names no listed command is asked again once; a
  second one ends the trajectory (counted; ``filename`` is then null), and the task is not
  journalled, so a re-run asks again. A positive trajectory with no step is counted apart.
* **negatives** (``info: "negativeK"``, K = depth of the folder): for each folder on the
  way to the target, follow the optimal path to that folder, ``cat`` a wrong file there
  (a seeded choice; folders with no other file are skipped), and ask the writer for a
  "that was a wrong file" reflection and the next command. At most
  :data:`MAX_NEGATIVES` per task (a seeded choice of folders). With ``--negatives_at
  target_folder`` (the paper's code) they are all in the target's folder, each reading another
  wrong file there (``info: "negative0"``, ``"negative1"``). The scripted steps
  (the optimal prefix and the wrong ``cat``) carry ``reflection: null``; only the
  corrective last step is written by the writer.

Writers: an API model, told the target file as a spoiler it must not reveal (so that
its trajectories are worth imitating), or ``--api oracle``, whose reflections reason
from the environment's next optimal command and the question.

Output ``data_reflection_negative.json`` next to the task file (or in ``--output_dir``):
each task with ``trajectories: [{model_name, trajectory: [{reflection, cmd}], filename,
info}]``. Finished tasks are journaled, so a re-run resumes. Tasks run side by side
(``--max_concurrency``), each on an environment of its own.
"""

import logging
import re
import shlex
import sys
from collections import Counter
from pathlib import Path

from data_gen.auto_explore import FILTERED_DIR, filtered_repos_dir, task_key
from data_gen.common import Journal, Unfinished, item_rng, journal_name, print_counts
from envs import EnvPool
from envs.auto_explore import AutoExploreEnv
from envs.auto_explore_tasks import load_tasks, optimal_path, task_targets
from envs.base import rng_seed
from envs.sandbox_paths import quote_path
from experiment_args import run_script
from utils.io import write_json
from utils.llm import concurrency, make_client, model_name, stops_on_llm_error

logger = logging.getLogger(__name__)

MAX_NEGATIVES = 2
OUTPUT_NAME = "data_reflection_negative.json"
STEP = "auto_explore.reflection_negative"

# --- API writer ------------------------------------------------------------------------------

SYSTEM = """You explore a software repository to find the one file that answers a user's question.
At each step you see the task, the current folder, the files in it, your command history, the \
output of your last command, and a numbered list of the commands you may run now:
- "cd DIR" enters a folder, "cd .." goes back to the parent folder;
- "cat FILE" shows the content of a file;
- "id FILE" identifies FILE as the answer and ends the search (a wrong file fails the task).
Every command costs a step, so move towards the answer directly and read a file before you identify it.
First write a reflection of one or two sentences: what you have learned so far, whether your last \
command helped, and what you will do next and why. Then choose exactly one command from the list.
Answer in exactly this format:
Reflection: <your reflection>
Command: <the label of the command, e.g. 3>"""
SPOILER = ("\nFor you only: the file that answers the question is {target}. Do not say that you were told; "
           "reason from what you see.")
WRONG_FILE = ("\nYour last command, `{wrong}`, read a file that does not answer the question. Say so in your "
              "reflection, and explain where the answer is more likely to be.")

_REFLECTION_RE = re.compile(r"reflection\s*:\s*(.*?)(?=^\s*command\s*:|\Z)", re.IGNORECASE | re.DOTALL | re.MULTILINE)
_COMMAND_RE = re.compile(r"^\s*command\s*:\s*(.+)$", re.IGNORECASE | re.MULTILINE)


def parse_answer(answer: str, labels: list[str], actions: list[str]) -> tuple[str, str] | None:
    """(reflection, listed command) from a "Reflection: ... / Command: ..." answer; None if unusable."""
    text = answer.replace("**", "").replace("__", "")
    reflection, command = _REFLECTION_RE.search(text), _COMMAND_RE.search(text)
    if reflection is None or command is None:
        return None
    reflection_text = " ".join(reflection.group(1).split())
    choice = command.group(1).strip().strip("`'\"").strip().rstrip(".").strip("`'\"").strip()
    if not reflection_text or not choice:
        return None
    if choice in labels:
        return reflection_text, actions[labels.index(choice)]
    if choice in actions:
        return reflection_text, choice
    label, _, rest = choice.partition(" ")
    label = label.rstrip(".):")
    if label in labels and (not rest.strip() or rest.strip() == actions[labels.index(label)]):
        return reflection_text, actions[labels.index(label)]
    return None


API_ATTEMPTS = 2  # answers asked for one step before the trajectory ends there (until a re-run)


def api_step(client, env: AutoExploreEnv, obs: str, info: dict, note: str = "") -> tuple[str, str] | None:
    """(reflection, command) of the writer's answer; None when no answer (of :data:`API_ATTEMPTS`) was usable."""
    user = obs + SPOILER.format(target=" or ".join(env.targets)) + note

    def unusable(answer: str) -> str | None:
        return None if parse_answer(answer, info["labels"], info["actions"]) else "no listed command"

    answer = client.complete([{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
                             temperature=0.7, max_tokens=200, accept=unusable, attempts=API_ATTEMPTS)
    return None if answer is None else parse_answer(answer, info["labels"], info["actions"])


# --- oracle writer -----------------------------------------------------------------------------

_TEMPLATES = {
    "enter_root": ["The question is about {topic}, and the file that answers it should be under {arg}/, "
                   "so I will enter {arg}.",
                   "To answer the question about {topic} I need to look inside {arg}/, so I will go there."],
    "enter": ["{cwd}/ is on the way: the answer about {topic} should be further down in {arg}/, "
              "so I will enter {arg}.",
              "I am in {cwd}/; the file about {topic} should be inside {arg}/, so I will enter it."],
    "up": ["Nothing in {cwd}/ answers the question about {topic}; I will go back up."],
    "cat": ["{arg} is in this folder and its name fits the question about {topic}; I will read it to check.",
            "The question is about {topic}, and {arg} looks like the place for it, so I will read it."],
    "id": ["{arg} covers {topic}, which is what the question asks about, so I will identify it as the answer.",
           "{arg} answers the question about {topic}; I will identify it."],
}
_CORRECTION_PREFIX = "I read {wrong}, but it does not answer the question about {topic}; "
_CORRECTIONS = {
    "enter": "the answer is not in this folder but under {arg}/, so I should go on into {arg}.",
    "up": "the answer is not here, so I should go back.",
    "cat": "the right file should be {arg} in this folder, so I will read it instead.",
    "id": "the right file is {arg}, which I have read already, so I will identify it.",
}


def question_topic(question: str) -> str:
    """What the question is about, as a short phrase: its first quoted term, the object of a "where is"
    question, or else the question itself in quotes."""
    quoted = re.search(r"`([^`]+)`|'([^']+)'", question)
    if quoted:
        return f"`{quoted.group(1)}`" if quoted.group(1) else f"'{quoted.group(2)}'"
    text = " ".join(question.strip().rstrip("?").split())
    where = re.match(r"(?:where (?:is|are)|which \w+ (?:defines|has|holds|contains|describes))\s+(.+)", text,
                     re.IGNORECASE)
    if where:
        return where.group(1)
    words = text.split()
    return '"' + " ".join(words[:15]) + ("..." if len(words) > 15 else "") + '"'


def _move(command: str, cwd: str) -> tuple[str, str]:
    """(template key, argument) of an oracle command."""
    word, arg = command.split(" ", 1)
    arg = shlex.split(arg)[0]
    if word == "cd":
        return ("up", arg) if arg == ".." else ("enter" if cwd else "enter_root", arg)
    return word, arg


def oracle_reflection(task: dict, env: AutoExploreEnv, command: str, rng) -> str:
    key, arg = _move(command, env.cwd)
    options = _TEMPLATES[key]
    return options[int(rng.integers(len(options)))].format(
        topic=question_topic(task["question"]), arg=arg, cwd=env.cwd)


def oracle_correction(task: dict, env: AutoExploreEnv, command: str, wrong: str) -> str:
    key, arg = _move(command, env.cwd)
    key = "enter" if key == "enter_root" else key
    return (_CORRECTION_PREFIX + _CORRECTIONS[key]).format(wrong=wrong, topic=question_topic(task["question"]), arg=arg)


def _template_pattern(template: str) -> str:
    """A regex matching what ``template`` writes: its {arg} captured, {topic} and {cwd} any text."""
    out, named = [], False
    for part in re.split(r"(\{\w+\})", template):
        if part == "{arg}":
            out.append("(?P=arg)" if named else "(?P<arg>.+?)")
            named = True
        else:
            out.append({"{topic}": ".+?", "{cwd}": ".*?", "{wrong}": ".+?"}.get(part, re.escape(part)))
    return "".join(out)


_READS = [(key, re.compile(_template_pattern(t) + "$")) for key, options in _TEMPLATES.items() for t in options] + [
    (key, re.compile(_template_pattern(_CORRECTION_PREFIX + t) + "$"))
    for key, t in _CORRECTIONS.items()]


def advised_command(reflection: str | None) -> str | None:
    """The command an oracle-writer reflection advises ("... so I will enter spaces." -> "cd spaces"), or
    None for any other text: the reflector's accuracy reads the SFT reflector's reflections with it."""
    text = (reflection or "").strip()
    for key, pattern in _READS:
        found = pattern.match(text)
        if found:
            if key == "up":
                return "cd .."
            word = "cd" if key in ("enter", "enter_root") else key
            return f"{word} {quote_path(found['arg'].rstrip('/'))}"
    return None


# --- trajectories --------------------------------------------------------------------------------


def oracle_command(info: dict) -> str:
    return info["actions"][info["labels"].index(info["oracle_label"])]


def positive(args, client, env: AutoExploreEnv, task: dict, rng, counts: Counter) -> dict:
    obs, info = env.reset(seed=rng_seed(rng), options={"task": task})
    steps, identified = [], None
    while True:
        if client is None:
            command = oracle_command(info)
            choice = (oracle_reflection(task, env, command, rng), command)
        else:
            choice = api_step(client, env, obs, info)
        if choice is None:
            counts["unusable answers"] += 1
            break
        steps.append({"reflection": choice[0], "cmd": choice[1]})
        obs, _, terminated, truncated, info = env.step(env.label_of(choice[1]))
        if terminated:
            identified = info.get("identified")
        if terminated or truncated:
            break
    return {"model_name": model_name(args), "trajectory": steps, "filename": identified, "info": "positive0"}


def wrong_files(env: AutoExploreEnv, info: dict) -> list[str]:
    """The ``cat`` commands of the current folder that read a file other than a target."""
    here = f"{env.cwd}/" if env.cwd else ""
    return [cmd for cmd in info["actions"]
            if cmd.startswith("cat ") and here + shlex.split(cmd[4:])[0] not in env.targets]


def negative_places(args, env: AutoExploreEnv, task: dict, folders: list[str], rng) -> list[tuple[int, str]]:
    """(folder level, wrong ``cat``) of each negative, by ``--negatives_at``: ``path``, one wrong file in
    each of up to :data:`MAX_NEGATIVES` folders on the optimal path; ``target_folder`` (the paper's code), up
    to :data:`MAX_NEGATIVES` different wrong files in the target's folder."""
    # One pass down the optimal path finds, per folder level, the wrong files there.
    _, info = env.reset(seed=rng_seed(rng), options={"task": task})
    choices = {}
    for level in range(len(folders) + 1):
        choices[level] = wrong_files(env, info)
        if level < len(folders):
            _, _, _, _, info = env.step(env.label_of(folders[level]))
    if args.negatives_at == "target_folder":
        wrong = choices[len(folders)]
        picks = rng.choice(len(wrong), size=min(MAX_NEGATIVES, len(wrong)), replace=False) if wrong else []
        return [(len(folders), wrong[int(i)]) for i in sorted(picks)]
    levels = [level for level, wrong in choices.items() if wrong]
    if len(levels) > MAX_NEGATIVES:
        levels = sorted(int(x) for x in rng.choice(levels, size=MAX_NEGATIVES, replace=False))
    return [(level, choices[level][int(rng.integers(len(choices[level])))]) for level in levels]


def negatives(args, client, env: AutoExploreEnv, task: dict, rng, counts: Counter) -> list[dict]:
    folders = [cmd for cmd in optimal_path(task) if cmd.startswith("cd ")]
    made = []
    for number, (level, wrong) in enumerate(negative_places(args, env, task, folders, rng)):
        obs, info = env.reset(seed=rng_seed(rng), options={"task": task})
        steps = []
        for command in [*folders[:level], wrong]:
            steps.append({"reflection": None, "cmd": command})
            obs, _, _, _, info = env.step(env.label_of(command))
        if client is None:
            command = oracle_command(info)
            choice = (oracle_correction(task, env, command, shlex.split(wrong[4:])[0]), command)
        else:
            choice = api_step(client, env, obs, info, WRONG_FILE.format(wrong=wrong))
        if choice is None:
            counts["unusable answers"] += 1
            continue
        steps.append({"reflection": choice[0], "cmd": choice[1]})
        made.append({"model_name": model_name(args), "trajectory": steps, "filename": None,
                     "info": f"negative{level}" if args.negatives_at == "path" else f"negative{number}"})
    return made


def task_trajectories(args, client, env: AutoExploreEnv, task: dict) -> dict | Unfinished:
    """A task's positive trajectory and negatives; :class:`Unfinished` (a re-run asks again) when an
    API writer gave no usable answer somewhere."""
    rng = item_rng(args.seed, "reflection_negative", task_key(task))
    counts: Counter = Counter()
    trajectories = [positive(args, client, env, task, rng, counts)]
    trajectories += negatives(args, client, env, task, rng, counts)
    result = {"trajectories": trajectories, "counts": dict(counts)}
    return Unfinished(result, "unusable answers") if counts["unusable answers"] else result


@stops_on_llm_error(STEP, "tasks")
def main(args) -> int:
    task_file = Path(args.task_file) if args.task_file else FILTERED_DIR / "data.json"
    tasks = load_tasks(task_file, whole_records=True)
    out_dir = Path(args.output_dir) if args.output_dir else task_file.parent
    repos_dir = filtered_repos_dir(args)
    pool = EnvPool(lambda: AutoExploreEnv(horizon=args.horizon, leaveout_prob=0.0, repos_dir=repos_dir))
    try:
        client = make_client(args)
        with pool.env() as env:
            horizon = env.horizon
        journal = Journal(out_dir, journal_name("reflection_negative", model_name(args), args.seed, horizon,
                                                *(["target_folder"] if args.negatives_at == "target_folder" else [])))
        items = [(task_key(task), task) for task in tasks]

        def work(task: dict) -> dict | Unfinished:
            with pool.env() as env:  # tasks run side by side, each on an environment of its own
                return task_trajectories(args, client, env, task)

        results = journal.run(items, work, desc="auto_explore trajectories", **concurrency(client))
    finally:
        pool.close()
    records = [dict(task, trajectories=result["trajectories"]) for task, result in zip(tasks, results)]
    path = out_dir / OUTPUT_NAME
    write_json(path, records)
    kinds = Counter()
    for record in records:
        for trajectory in record["trajectories"]:
            if trajectory["info"].startswith("positive") and not trajectory["trajectory"]:
                kinds["empty positives (no usable answer; a re-run asks again)"] += 1
            elif trajectory["info"].startswith("positive"):
                kinds["positives"] += 1
                kinds["positives identifying a target"] += trajectory["filename"] in task_targets(record["filename"])
            else:
                kinds["negatives"] += 1
    unusable = sum(result["counts"].get("unusable answers", 0) for result in results)
    print_counts(STEP, {"tasks": len(records), **kinds, "unusable answers": unusable, "output": str(path)}, client)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m data_gen.auto_explore.reflection_negative"))
