"""ALFWorld, the text version (TextWorld), as a :class:`~envs.base.TextEnv`.

Each problem is one ALFWorld trial folder (``traj_data.json`` + ``initial_state.pddl``),
found under ``<data root>/<split>/<task family>-<n>/<trial>/``. At every reset the game
file is rebuilt in a scratch folder owned by the env (never in the data folder) and played
by the real ``alfworld``/``textworld`` engine in a separate worker process
(``envs/alfworld_worker.py``), so that every reset and step can be given a timeout: a game
that raises, hangs or kills its process is reported, appended to the block list and
skipped from then on. (A spawned process imports the main script again, so a script that
builds this env must do so under ``if __name__ == "__main__":``.)

Observation (before the action head)::

    <the game's opening text: the room and "Your task is to: ...">

    --- History ---              (or "--- History (last 10 of 14 steps) ---")
    > go to microwave 1
    You arrive at microwave 1. The microwave 1 is closed.

The history holds every step since the start (the paper's), or the last ``history_steps``.
The actions are textworld's admissible commands in its (sorted) order; ``shuffle_action``
permutes the labels 0..n-1 among them and lists them in label order (the paper's). Reward is
the change of the game's score (1 when the task is done), the episode terminates when the
game is won, and the oracle is the next command of alfworld's expert (``handcoded`` or
``planner``; ``none``, the paper's default outside data generation, gives no oracle). Randomness: the problem and the game's own seed (Python's ``random``, which
picks the task sentence and drives the handcoded expert, seeded inside the worker) are
drawn from ``self.np_random``.

Problem discovery is in ``envs/alfworld_problems.py``, the env's end of the worker process
in ``envs/alfworld_client.py``; this module holds the env itself and its block list.
"""

import logging
import os
import re
import tempfile
import weakref
from pathlib import Path

from envs.alfworld_client import _GameFailure, _release, _Worker
from envs.alfworld_problems import _as_trial, find_problems, resolve_data_root
from envs.base import Outcome, TextEnv, rng_seed
from envs.curriculum import Curriculum, single_level
from envs.scratch import process_folder
from envs.spec import EnvSettings, EnvSpec

logger = logging.getLogger(__name__)

EXPERTS = ("handcoded", "planner", "none")
_BANNER = re.compile(r"^\s*-=.*?=-\s*")


class ALFWorldEnv(TextEnv):
    """ALFWorld text games; see the module docstring.

    ``options={"problem": path}`` at reset plays that trial folder (``RuntimeError`` if it
    fails or is blocked); otherwise a problem is drawn from ``self.problems`` minus the blocked
    ones. ``info["problem"]`` names the trial folder being played. ``few_data`` (``--few_data``) keeps
    the first N problems only. ``memoise_engine=False`` turns off the worker's memo of the engine's pure
    answers (``alfworld_worker.memoise_engine``: the same episodes, slower), for comparisons;
    ``keep_translations=False`` keeps the memo's game translations in the worker only, not also on disk in the
    project's cache (``alfworld_worker.engine_store``), where every worker and later run finds them;
    ``shallow_contexts=False`` keeps textworld's deep copies of its grammar's contexts
    (``alfworld_worker.copy_contexts_shallowly``: the same episodes, slower).
    """

    default_horizon = 30
    plays_elsewhere = True  # each env's game runs in its own worker process
    action_head = "The actions you can take now is:"
    analyze_instruction = (
        "Analyze the situation: what has happened so far, was the last action useful, "
        "and what should be done next to complete the task?\n"
    )
    shuffle_within_shown = True

    def __init__(self, horizon: int | None = None, shuffle_action: bool = False,
                 data_root: str | os.PathLike | None = None,
                 task: str = "pick_and_place_simple-Tomato-None-Microwave", split: str = "train",
                 expert: str = "handcoded", timeout: float = 60.0,
                 block_list: str | os.PathLike | None = None, scratch_dir: str | os.PathLike | None = None,
                 problems: list | None = None, render_mode: str | None = None, labels=None, few_data: int = 0,
                 history_steps: int = 0, text_layout: str = "ours", memoise_engine: bool = True,
                 keep_translations: bool = True, shallow_contexts: bool = True):
        super().__init__(horizon=horizon, shuffle_action=shuffle_action, render_mode=render_mode, labels=labels,
                         text_layout=text_layout)
        if history_steps < 0:
            raise ValueError(f"ALFWorld history_steps must be >= 0 (0: every step; --alfworld_history_steps), "
                             f"got {history_steps}")
        self.history_steps = history_steps  # steps shown in the observation (0: all); the opening text stays
        if expert not in EXPERTS:
            raise ValueError(f"ALFWorld expert must be one of {EXPERTS} (--alfworld_expert), got {expert!r}")
        if not timeout > 0:
            raise ValueError(f"ALFWorld timeout must be > 0 seconds (--alfworld_timeout), got {timeout}")
        self.task, self.split, self.expert, self.timeout = task, split, expert, float(timeout)
        if problems is not None:
            self.data_root = None
            self.problems = sorted({_as_trial(path) for path in problems})
            if not self.problems:
                raise ValueError("ALFWorldEnv(problems=[]) has no problem to play")
        else:
            self.data_root = resolve_data_root(data_root)
            self.problems = find_problems(self.data_root, split, task)
        if few_data:  # --few_data: the first N problems only
            self.problems = self.problems[:few_data]
        self.block_list = None if block_list is None else Path(block_list)
        self.blocked: dict[Path, str] = {}  # trial folder -> why it was blocked
        self._read_block_list()

        if scratch_dir is not None:
            scratch_parent = Path(scratch_dir).resolve()
            protected = [self.data_root] if self.data_root else [trial.parent for trial in self.problems]
            if any(scratch_parent.is_relative_to(path) for path in protected):
                raise ValueError(f"scratch_dir {scratch_parent} is inside the ALFWorld data; choose another folder")
            scratch_parent.mkdir(parents=True, exist_ok=True)
        # Without a scratch_dir, in this process's scratch folder, which a later run removes if this one is killed.
        self.scratch = Path(tempfile.mkdtemp(prefix="alfworld_", dir=scratch_dir or process_folder()))
        self._worker = _Worker(self.scratch, memoise_engine, keep_translations, shallow_contexts)
        self._finalizer = weakref.finalize(self, _release, self._worker, self.scratch)

        self.problem: Path | None = None
        self._game: dict = {}  # the worker's last state (see alfworld_worker._state)
        self._intro = ""
        self._history: list[tuple[str, str]] = []
        self._score = 0.0

    # --- TextEnv hooks ----------------------------------------------------------------

    def _reset(self, options: dict) -> None:
        # Until a game starts, step() must refuse rather than play on in a previous game.
        self.done, self.problem, self._game = True, None, {}
        self._read_block_list()
        if options.get("problem") is not None:
            trial = _as_trial(options["problem"])
            if trial in self.blocked:
                raise RuntimeError(f"ALFWorld problem {trial} is blocked: {self.blocked[trial]}")
            reason = self._start(trial)
            if reason is not None:
                raise RuntimeError(f"ALFWorld problem {trial} failed: {reason}")
            return
        candidates = [trial for trial in self.problems if trial not in self.blocked]
        blocked_before = len(self.problems) - len(candidates)
        failures = []
        while candidates:
            trial = candidates.pop(int(self.np_random.integers(len(candidates))))
            reason = self._start(trial)
            if reason is None:
                return
            failures.append(f"{trial}: {reason}")
        raise RuntimeError(
            f"every ALFWorld problem of split {self.split!r}, task {self.task!r} failed or is blocked "
            f"({blocked_before} blocked before this reset; block list: {self.block_list}). Failed now:\n"
            + "\n".join(failures)
        )

    def _start(self, trial: Path) -> str | None:
        """Start ``trial``; on failure block it and return why."""
        seed = rng_seed(self.np_random)
        request = ("reset", str(trial), str(self.scratch / "game"), self.expert, seed)
        try:
            state = self._worker.request(request, self.timeout)
        except _GameFailure as failure:
            self._block(trial, failure)
            return failure.reason
        self.problem, self._game, self.done = trial, state, False
        self._intro = _BANNER.sub("", state["obs"]).strip()
        self._history = []
        self._score = state["score"]
        return None

    def _state_text(self) -> str:
        sections = [self._intro]
        if self._history:
            shown = self._history[-self.history_steps:] if self.history_steps else self._history
            header = ("--- History ---" if len(shown) == len(self._history)
                      else f"--- History (last {len(shown)} of {len(self._history)} steps) ---")
            sections.append("\n".join([header] + [f"> {command}\n{reply}" for command, reply in shown]))
        return "\n\n".join(sections) + "\n\n"

    def _action_texts(self) -> list[str]:
        return list(self._game.get("admissible_commands", []))

    def _state_key(self) -> str:
        """The game, the last observation and the admissible commands (which say where the agent is and what it
        holds: "put X in/on Y" only while holding X); the history in the text is left out."""
        last = self._history[-1][1] if self._history else self._intro
        return "\n".join([str(self.problem), last, *self._game.get("admissible_commands", [])])

    def _act(self, index: int) -> Outcome:
        command = self._actions[index]
        try:
            state = self._worker.request(("step", command), self.timeout)
        except _GameFailure as failure:
            self._block(self.problem, failure)
            # The game cannot go on: end the episode as cut short, not as an outcome of the task.
            return Outcome(reward=0.0, truncated=True, info={"engine_error": failure.reason})
        reward = state["score"] - self._score
        self._score = state["score"]
        self._game = state
        self._history.append((command, state["obs"].strip()))
        return Outcome(reward=reward, terminated=state["done"] or state["won"])

    def _oracle_index(self) -> int | None:
        plan = self._game.get("expert_plan") or []
        commands = self._game.get("admissible_commands", [])
        return commands.index(plan[0]) if plan and plan[0] in commands else None

    def _success(self) -> bool:
        return bool(self._game.get("won", False))

    def _info(self) -> dict:
        info = super()._info()
        info["problem"] = None if self.problem is None else str(self.problem)
        return info

    # --- extras -----------------------------------------------------------------------

    @property
    def expert_plan(self) -> list[str]:
        """The expert's plan from the current state (handcoded: the next command only)."""
        return list(self._game.get("expert_plan", []))

    @property
    def task_description(self) -> str:
        """The task sentence of the current game, e.g. "put some tomato on microwave."."""
        match = re.search(r"Your task is to:\s*(.*)", self._intro)
        return match.group(1).strip() if match else ""

    @property
    def worker_pid(self) -> int | None:
        """Process id of the game worker, None when none runs."""
        return self._worker.pid if self._worker.alive() else None

    def close(self) -> None:
        self._finalizer()
        super().close()

    # --- the block list ---------------------------------------------------------------

    def _block(self, trial: Path, failure: _GameFailure) -> None:
        reason = " ".join(failure.reason.split())
        logger.warning("ALFWorld problem %s failed (%s); skipping it from now on", trial, reason)
        if failure.details:
            logger.debug("ALFWorld failure of %s:\n%s", trial, failure.details)
        self.blocked[trial] = reason
        if self.block_list is not None:
            self.block_list.parent.mkdir(parents=True, exist_ok=True)
            with open(self.block_list, "a") as handle:
                handle.write(f"{trial}\t{reason}\n")

    def _read_block_list(self) -> None:
        """Merge the block-list file (one ``path<TAB>reason`` per line): other envs of the run add to it."""
        if self.block_list is None or not self.block_list.is_file():
            return
        for line in self.block_list.read_text().splitlines():
            path, _, reason = line.partition("\t")
            if path.strip():
                self.blocked.setdefault(Path(path.strip()), reason)


# --- the registry's view of ALFWorld -----------------------------------------------------------


def _settings(settings: EnvSettings, *, evaluation: bool, run_dir, split) -> dict:
    return {"data_root": settings.alfworld_data, "task": settings.alfworld_task,
            "split": split or ("valid" if evaluation else settings.alfworld_split),
            "expert": settings.alfworld_expert, "timeout": settings.alfworld_timeout,
            "block_list": None if run_dir is None else Path(run_dir) / "alfworld_blocklist.txt",
            "few_data": 0 if evaluation else settings.few_data, "history_steps": settings.alfworld_history_steps}


def _inputs(settings: EnvSettings, *, evaluation: bool) -> None:
    """The data root, and a problem in the split training (or evaluation) plays."""
    find_problems(resolve_data_root(settings.alfworld_data), "valid" if evaluation else settings.alfworld_split,
                  settings.alfworld_task)


def _curriculum(settings: EnvSettings, max_steps: int) -> Curriculum:
    # The envs draw their problems themselves, skipping any the block list names.
    return single_level(settings.alfworld_task or "alfworld", [{}], max_steps)


def family(problem: str | os.PathLike) -> str:
    """A trial's task family, its level: 'pick_and_place_simple-Tomato-None-Microwave' for
    '.../pick_and_place_simple-Tomato-None-Microwave-13/trial_T2019...'."""
    return re.sub(r"-\d+$", "", Path(problem).parent.name)


def _held_out(settings: EnvSettings, env) -> list[tuple[dict, str]]:
    """Every problem of the held-out split (the valid trials), at its family's level."""
    return [({"problem": str(problem)}, family(problem)) for problem in env.problems]


def _validation(settings: EnvSettings, env) -> list[tuple[dict, str]]:
    """The RL panel's problems: those of the training split (``--alfworld_split``), played at validation seeds,
    never the held-out trials (a family of a few trials, such as the paper's 7, leaves none to split off)."""
    problems = (find_problems(env.data_root, settings.alfworld_split, settings.alfworld_task) if env.data_root
                else env.problems)
    return [({"problem": str(problem)}, family(problem)) for problem in problems]


# The system message of an API model playing it (evaluation.gpt_agent).
API_INSTRUCTIONS = (
    "You are a household robot in a text world. Read the task after 'Your task is to:' and complete it "
    "with the listed commands: go to places, open and close receptacles, take objects from where they "
    "are and move them to where they belong. Search likely places for the object you need."
)


SPEC = EnvSpec(name="alfworld", make=ALFWorldEnv, settings=_settings, curriculum=_curriculum, held_out=_held_out,
               validation=_validation,
               data_steps=("data_gen.alfworld.reflection", "data_gen.alfworld.gen_sft"),
               own_flags=("alfworld_data", "alfworld_task", "alfworld_split", "alfworld_expert",
                          "alfworld_history_steps", "alfworld_timeout", "alfworld_spoiler", "sft_label", "random_prob"),
               exclusive_flags=("few_data",), inputs=_inputs, api_instructions=API_INSTRUCTIONS)
