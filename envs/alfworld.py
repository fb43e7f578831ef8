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

The actions are textworld's admissible commands in its (sorted) order. Reward is the
change of the game's score (1 when the task is done), the episode terminates when the game
is won, and the oracle is the next command of alfworld's expert (``handcoded`` or
``planner``). Randomness: the problem and the game's own seed (Python's ``random``, which
picks the task sentence and drives the handcoded expert, seeded inside the worker) are
drawn from ``self.np_random``.
"""

import logging
import multiprocessing
import os
import re
import shutil
import tempfile
import weakref
from multiprocessing.connection import wait
from pathlib import Path

from envs.alfworld_worker import serve
from envs.base import Outcome, TextEnv, rng_seed

logger = logging.getLogger(__name__)

SPLITS = ("train", "valid_seen", "valid_unseen", "valid_train")
VALID_SPLITS = ("valid_seen", "valid_unseen", "valid_train")  # what split="valid" means
EXPERTS = ("handcoded", "planner")
TRIAL_FILES = ("traj_data.json", "initial_state.pddl")
# Importing textworld and alfworld in a fresh worker takes 1-3 s; a game's timeout should
# not be spent on it.
STARTUP_TIMEOUT = 120.0
_BANNER = re.compile(r"^\s*-=.*?=-\s*")


# --- finding the problems ---------------------------------------------------------------


def resolve_data_root(data_root: str | os.PathLike | None) -> Path:
    """The data root from the argument, else ``$ALFWORLD_DATA``."""
    value = data_root or os.environ.get("ALFWORLD_DATA")
    if not value:
        raise ValueError("no ALFWorld data root: pass --alfworld_data (data_root=...) or set ALFWORLD_DATA")
    root = Path(value).expanduser()
    if not root.is_dir():
        raise ValueError(f"ALFWorld data root {root} (from --alfworld_data or ALFWORLD_DATA) is not a folder")
    return root.resolve()


def split_names(split: str) -> list[str]:
    """``"valid"`` → the three valid_* splits; a comma-separated list → each of its names."""
    names: list[str] = []
    for name in (part.strip() for part in split.split(",")):
        for expanded in VALID_SPLITS if name == "valid" else (name,):
            if expanded and expanded not in names:
                names.append(expanded)
    if not names:
        raise ValueError(f"empty ALFWorld split {split!r}; use one of {SPLITS}, 'valid' or a comma-separated list")
    return names


def find_problems(root: Path, split: str, task: str) -> list[Path]:
    """Every trial folder of ``split`` whose task folder name starts with ``task``, sorted.

    ``root`` may hold the split folders directly or inside ``json_2.1.1/``.
    """
    root = Path(root)
    problems: set[Path] = set()
    split_dirs = []
    for name in split_names(split):
        split_dir = root / name if (root / name).is_dir() else root / "json_2.1.1" / name
        if not split_dir.is_dir():
            if _holds_tasks(root, task) and not any((root / s).is_dir() for s in SPLITS):
                # A folder of task folders with no split level (e.g. the hand-made fixtures).
                logger.warning("%s has task folders but no split folders: playing them all (split %r ignored)",
                               root, split)
                split_dirs = [root]
                break
            raise ValueError(f"no ALFWorld split folder {name!r} in {root} (nor in {root / 'json_2.1.1'})")
        split_dirs.append(split_dir)
    for split_dir in split_dirs:
        for task_dir in split_dir.iterdir():
            if task_dir.is_dir() and task_dir.name.startswith(task):
                problems.update(trial for trial in task_dir.iterdir() if is_trial(trial))
    if not problems:
        raise ValueError(f"no ALFWorld problem in {root} for split {split!r} and task {task!r} "
                         f"(--alfworld_data, --alfworld_split, --alfworld_task)")
    return sorted(problems)


def _holds_tasks(root: Path, task: str) -> bool:
    return any(d.is_dir() and d.name.startswith(task) and any(is_trial(t) for t in d.iterdir())
               for d in root.iterdir())


def is_trial(path: Path) -> bool:
    return path.is_dir() and all((path / name).is_file() for name in TRIAL_FILES)


def _as_trial(path: str | os.PathLike) -> Path:
    trial = Path(path).expanduser().resolve()
    if not is_trial(trial):
        raise ValueError(f"{trial} is not an ALFWorld trial folder: it needs {' and '.join(TRIAL_FILES)}")
    return trial


# --- the worker process, seen from the env ----------------------------------------------


class _GameFailure(Exception):
    """A game raised, timed out or killed its worker; ``reason`` is one line for the block list."""

    def __init__(self, reason: str, details: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.details = details


class _Worker:
    """The parent's end of the game process: start, ask with a timeout, kill, shut down.

    Holds no reference to the env, so that the env's finalizer can shut it down.
    """

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.process = None
        self.conn = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self) -> None:
        # "spawn", not fork: the parent may hold torch threads and CUDA state.
        context = multiprocessing.get_context("spawn")
        conn, child_conn = context.Pipe()
        process = context.Process(target=serve, args=(child_conn, str(self.scratch)), daemon=True,
                                  name="alfworld-worker")
        process.start()
        # Closing our copy of the child's end is what lets a dead worker read as EOF here.
        child_conn.close()
        self.process, self.conn = process, conn
        try:
            answer = self._receive(STARTUP_TIMEOUT)
        except _GameFailure as failure:
            raise RuntimeError(
                f"the ALFWorld worker did not start: {failure.reason}. It is a spawned process, which "
                "imports the main script again: a script that builds ALFWorldEnv must run it under "
                "`if __name__ == \"__main__\":`"
            ) from None
        if answer[0] != "ready":
            self.kill()
            raise RuntimeError(f"the ALFWorld worker did not start: {answer[1]}\n{answer[2]}")
        logger.debug("ALFWorld worker started (pid %s)", self.process.pid)

    def request(self, message: tuple, timeout: float) -> dict:
        """Send ``message`` and wait at most ``timeout`` seconds for the game's state."""
        if not self.alive():
            self.kill()
            self.start()
        try:
            self.conn.send(message)
        except OSError as error:
            self.kill()
            raise _GameFailure(f"worker died before the {message[0]} ({error})") from None
        try:
            answer = self._receive(timeout)
        except _GameFailure:
            raise
        except BaseException:
            # Interrupted while the game runs (e.g. Ctrl-C): its late answer would be read as
            # the answer to the next request, so this worker cannot be trusted any more.
            self.kill()
            raise
        if answer[0] == "error":
            raise _GameFailure(answer[1], answer[2])
        return answer[1]

    def _receive(self, timeout: float) -> tuple:
        ready = wait([self.conn, self.process.sentinel], timeout)
        if self.conn in ready:
            try:
                return self.conn.recv()
            except (EOFError, OSError):
                pass  # the worker died; its exit code tells more below
        if not ready:
            self.kill()
            raise _GameFailure(f"timeout: no answer within {timeout:g} s, worker killed")
        self.process.join(5)
        code = self.process.exitcode
        self.kill()
        raise _GameFailure(f"worker died (exit code {code})")

    def kill(self) -> None:
        if self.process is not None:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(5)
            self.process = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def shutdown(self) -> None:
        """Ask the worker to exit; kill it if it does not within a few seconds."""
        if self.alive():
            try:
                self.conn.send(("close",))
            except OSError:
                pass  # already gone: kill() below reaps it
            else:
                self.process.join(5)
        self.kill()


def _release(worker: _Worker, scratch: Path) -> None:
    """Stop the worker and delete the scratch folder (at close, garbage collection or exit)."""
    worker.shutdown()
    if scratch.exists():
        shutil.rmtree(scratch)


# --- the environment --------------------------------------------------------------------


class ALFWorldEnv(TextEnv):
    """ALFWorld text games; see the module docstring.

    ``options={"problem": path}`` at reset plays that trial folder (``RuntimeError`` if it
    fails or is blocked); otherwise a problem is drawn from ``self.problems`` minus the blocked
    ones. ``info["problem"]`` names the trial folder being played.
    """

    default_horizon = 30
    action_head = "The actions you can take now is:"
    analyze_instruction = (
        "Analyze the situation: what has happened so far, was the last action useful, "
        "and what should be done next to complete the task?\n"
    )
    history_steps = 10  # steps shown in the observation; the opening text is always kept

    def __init__(self, horizon: int | None = None, shuffle_action: bool = False,
                 data_root: str | os.PathLike | None = None,
                 task: str = "pick_and_place_simple-Tomato-None-Microwave", split: str = "train",
                 expert: str = "handcoded", timeout: float = 60.0,
                 block_list: str | os.PathLike | None = None, scratch_dir: str | os.PathLike | None = None,
                 problems: list | None = None, render_mode: str | None = None):
        super().__init__(horizon=horizon, shuffle_action=shuffle_action, render_mode=render_mode)
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
        self.block_list = None if block_list is None else Path(block_list)
        self.blocked: dict[Path, str] = {}  # trial folder -> why it was blocked
        self._read_block_list()

        if scratch_dir is not None:
            scratch_parent = Path(scratch_dir).resolve()
            protected = [self.data_root] if self.data_root else [trial.parent for trial in self.problems]
            if any(scratch_parent.is_relative_to(path) for path in protected):
                raise ValueError(f"scratch_dir {scratch_parent} is inside the ALFWorld data; choose another folder")
            scratch_parent.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix="alfworld_", dir=scratch_dir))
        self._worker = _Worker(self.scratch)
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
            shown = self._history[-self.history_steps:]
            header = ("--- History ---" if len(shown) == len(self._history)
                      else f"--- History (last {len(shown)} of {len(self._history)} steps) ---")
            sections.append("\n".join([header] + [f"> {command}\n{reply}" for command, reply in shown]))
        return "\n\n".join(sections) + "\n\n"

    def _action_texts(self) -> list[str]:
        return list(self._game.get("admissible_commands", []))

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
