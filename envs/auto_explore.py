"""AutoExplore: find and identify the file of a repository that answers a question.

The agent moves through a sandboxed copy of the repository (``envs/sandbox.py``) with
``cd``, reads files with ``cat`` and ends the episode with ``id FILE``. A task is a dict
(the schema of ``data/auto_explore/tasks*/*.json``)::

    {"question": str, "answer": str, "filename": "src/utils.py" or [several acceptable],
     "root": repo folder (absolute, or relative to repos_dir), "optimal_path": [...],
     "n_level": target depth, "model": who wrote the task}

given as ``reset(options={"task": task})``, or drawn from ``tasks=[...]`` passed to the
constructor when ``reset`` gets no task.

Costs (reward = -cost) are the class constants below. Each step costs STEP_COST and nothing
more (``cost_rule="step"``: what the paper's code charges in effect, since its keyword count never
matches), or plus ERROR_COST for a command that failed and WARNING_COST for one that told nothing
new (``"outcome"``), or plus those for the words "Error" / "Warning" anywhere in the output
(``"keywords"``: what the paper's code was written to charge). ``id`` ends the episode, gaining
``horizon`` if the file is a target and paying it otherwise, and running out of steps pays
``horizon``. Success: total cost < 0.01.

``first_step`` (the paper's contextual bandit): the episode is one decision. The task's first
optimal command earns FIRST_STEP_BONUS + ``horizon``; any other is charged as in a normal step.
``oracle_completion`` (this project's): the oracle plays on after the first decision and the whole
return is that decision's reward; ``success`` then says whether the decision was optimal (the
return equals the oracle's own), not whether the task was solved.

The paper's ``easy`` mode: the question is "Find <the file's path from the repository root>", for
one of the task's files drawn at random, and only that file is the target. ``leaveout_prob``
leaves entries out of the sandbox at random, but never one whose path is a prefix of a target's
(as strings, as the paper's code).

How the flags configure it and which tasks the scripts play (its ``SPEC``) is ``envs/auto_explore_spec.py``'s.
"""

import logging
import os
import stat
from pathlib import Path

from envs.auto_explore_tasks import DEFAULT_REPOS_DIR, first_optimal_command, repo_folder, task_targets
from envs.base import Outcome, TextEnv
from envs.sandbox import (
    MAX_TOKENS,
    Sandbox,
    SandboxError,
    file_kind,
    printable,
    pristine_copy,
    quote_path,
    resolve,
)

logger = logging.getLogger(__name__)


STEP_COST = 1.0
ERROR_COST = 2.0
WARNING_COST = 1.0
SUCCESS_MAX_COST = 0.01
FIRST_STEP_BONUS = 100.0  # first_step: the first optimal command earns this plus the horizon (the paper's)
# What a step costs beyond STEP_COST: nothing (step: the paper's code in effect), the command's outcome (it
# failed; it told nothing new), or the words "Error" and "Warning" in what the step shows (keywords: the
# paper's code as written, a file's text included).
COST_RULES = ("step", "outcome", "keywords")


class AutoExploreEnv(TextEnv):
    """Find the file that answers a question about a repository; see the module docstring."""

    default_horizon = 15
    action_head = "# Choose from below your command"
    analyze_instruction = ""

    def __init__(
        self,
        horizon: int | None = None,
        shuffle_action: bool = False,
        leaveout_prob: float = 0.0,
        easy: bool = False,
        first_step: bool = False,
        repos_dir: str | os.PathLike | None = None,
        tasks: list[dict] | None = None,
        render_mode: str | None = None,
        labels=None,
        cost_rule: str = "step",
        oracle_completion: bool = False,
        sandbox_dir: str | os.PathLike | None = None,
        text_layout: str = "ours",
        view_tokens: int = MAX_TOKENS,
    ):
        if not 0.0 <= leaveout_prob <= 1.0:
            raise ValueError(f"leaveout_prob must be in [0, 1], got {leaveout_prob}")
        if cost_rule not in COST_RULES:
            raise ValueError(f"cost_rule must be one of {COST_RULES}, got {cost_rule!r}")
        self.cost_rule = cost_rule
        super().__init__(horizon=horizon, shuffle_action=shuffle_action, render_mode=render_mode, labels=labels,
                         text_layout=text_layout, first_step=first_step, oracle_completion=oracle_completion)
        self.leaveout_prob = float(leaveout_prob)
        self.easy = easy
        # the parent of the process's scratch folder, where the repository copies are made (None: the system's
        # temporary folder)
        self.sandbox_dir = sandbox_dir
        self.view_tokens = view_tokens  # the most (approximate) tokens a file view shows
        self.repos_dir = Path(repos_dir) if repos_dir is not None else DEFAULT_REPOS_DIR
        self.tasks = list(tasks or [])
        self.task: dict | None = None
        self._sandbox: Sandbox | None = None
        self._targets: list[str] = []
        self._repo_name = ""
        self._question = ""
        self._history: list[str] = []
        self._last_result: str | None = None
        self._read: set[str] = set()  # files shown by cat
        self._viewed: set[tuple[str, str]] = set()  # (head|tail, file) already shown
        self._listed: set[str] = set()  # directories whose entries were shown
        self._first_command = ""

    # --- episode setup ----------------------------------------------------------------

    def _reset(self, options: dict) -> None:
        task = options.get("task")
        if task is None:
            if not self.tasks:
                raise ValueError("AutoExploreEnv.reset needs options={'task': {...}} or tasks=[...] in the constructor")
            task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        if not isinstance(task, dict):
            raise ValueError(f"a task is a dict, got {type(task).__name__}: {task!r:.200}")
        question = task.get("question")
        if not isinstance(question, str):
            raise ValueError(f"task field 'question' must be a string, got {question!r:.200}")
        targets = task_targets(task.get("filename"))
        if self.easy:  # the paper's: one of the task's files, named by its path
            targets = [targets[int(self.np_random.integers(len(targets)))]]
        root = repo_folder(task.get("root"), options.get("repos_dir") or self.repos_dir)
        pristine = pristine_copy(root, self.sandbox_dir)
        for target in targets:
            try:
                _, status = resolve(pristine, "", target)
            except SandboxError:
                status = None
            if status is None or not stat.S_ISREG(status.st_mode):
                raise ValueError(f"task target file {target!r} not found in repository {str(root)!r}")
            if file_kind(target) is None:
                raise ValueError(f"task target file {target!r} does not have an allowed suffix")

        # Entries whose path is a prefix of a target's survive leave-out (the folders on the way among
        # them), so each task stays solvable.
        def leave_out(rel: str, is_dir: bool) -> bool:
            if any(target.startswith(rel) for target in targets):
                return False
            return self.np_random.random() < self.leaveout_prob

        if self._sandbox is not None:
            self._sandbox.close()
        self._sandbox = Sandbox(root, leave_out=leave_out if self.leaveout_prob > 0 else None,
                                parent=self.sandbox_dir, view_tokens=self.view_tokens)
        self.task = task
        self._targets = targets
        self._root = root
        self._repo_name = printable(root.resolve().name)
        self._question = f"Find {targets[0]}" if self.easy else question
        self._history = []
        self._last_result = None
        self._read = set()
        self._viewed = set()
        self._listed = {""}  # the observation lists the current directory
        self._first_command = first_optimal_command(task) if self.first_step else ""
        logger.debug("AutoExplore episode in %s (sandbox %s), targets %s", root, self._sandbox.root, targets)

    # --- observation and actions --------------------------------------------------------

    def _state_text(self) -> str:
        sections = (
            ("# Task", self._question),
            ("# Current working directory", f"{self._repo_name}/{self.cwd}" if self.cwd else self._repo_name),
            ("# Files under current working directory", self._sandbox.listing()),
            ("# Command history", "\n".join(self._history) or "(none)"),
            ("# Execution result of your last command", self._last_result or "(none)"),
        )
        return "".join(f"{header}\n{body}\n" for header, body in sections)

    def _state_key(self) -> str:
        """The task, the working directory and the files read so far (the command history is left out)."""
        return "\n".join([self._question, self.cwd, *sorted(self._read)])

    def _action_texts(self) -> list[str]:
        dirs, files = self._sandbox.entries()
        actions = ["cd .."] if self.cwd else []
        actions += [f"cd {quote_path(d)}" for d in dirs]
        actions += [f"cat {quote_path(f)}" for f in files if self._rel(f) not in self._read]
        actions += [f"id {quote_path(f)}" for f in files]
        if len(actions) > len(self.label_set):
            raise RuntimeError(f"{len(actions)} actions in {self._repo_name}/{self.cwd} exceed the "
                               f"{len(self.label_set)} choice labels; split that directory in the filtered repo")
        return actions

    def _rel(self, name: str) -> str:
        return f"{self.cwd}/{name}" if self.cwd else name

    # --- commands -------------------------------------------------------------------------

    def _act(self, index: int) -> Outcome:
        command = self._actions[index]
        outcome = self.execute(command)
        if self.first_step and command == self._first_command:
            outcome.reward = FIRST_STEP_BONUS + self.horizon
        return outcome

    def _oracle_return(self) -> float:
        """The oracle's return from this episode's start (where the bandit asks for it), played in a fresh copy."""
        probe = AutoExploreEnv(horizon=self.horizon, repos_dir=self.repos_dir, cost_rule=self.cost_rule,
                               labels=self.label_set, sandbox_dir=self.sandbox_dir, view_tokens=self.view_tokens)
        try:
            probe.reset(options={"task": dict(self.task, root=str(self._root), filename=list(self._targets))})
            return probe._finish_with_oracle()[1]
        finally:
            probe.close()

    def _play_oracle_out(self, outcome: Outcome) -> None:
        played, reward = self._finish_with_oracle()
        outcome.reward += reward
        outcome.info["oracle_completion"] = played

    def _finish_with_oracle(self) -> tuple[list[str], float]:
        """Play the oracle to the end of the episode (oracle_completion); its commands and reward."""
        played, reward = [], 0.0
        for _ in range(self.horizon - self.steps):
            command = self._oracle_command()
            played.append(command)
            outcome = self.execute(command)
            reward += outcome.reward
            if outcome.terminated:
                return played, reward
        return played, reward + self._truncation_reward()

    def execute(self, command: str) -> Outcome:
        """Run one command and charge its cost; the executor behind both label steps and free-form ones.

        This does no step counting: inside an episode use :meth:`step` or :meth:`step_command`.
        """
        if self._sandbox is None:
            raise RuntimeError("AutoExploreEnv.execute() before reset()")
        result = self._sandbox.execute(command)
        warning = None if result.error else self._no_news(result.name, result.path)
        shown = result.text if warning is None else f"Warning: {warning}\n{result.text}"
        if self.cost_rule == "keywords":
            error, warned = "Error" in shown, "Warning" in shown
        elif self.cost_rule == "outcome":
            error, warned = result.error, warning is not None
        else:
            error = warned = False
        cost = STEP_COST + (ERROR_COST if error else 0.0) + (WARNING_COST if warned else 0.0)
        info = {"command": command, "error": result.error, "warning": warning is not None}
        terminated = False
        if result.name == "id":
            correct = result.path in self._targets
            cost += -self.horizon if correct else self.horizon
            terminated = True
            info.update(identified=result.path, correct=correct)
        self._history.append(printable(command))
        self._last_result = shown
        return Outcome(reward=-cost, terminated=terminated, info=info)

    def _no_news(self, name: str, path: str) -> str | None:
        """Why the successful command ``name`` on ``path`` told nothing new (None if it did); records what it showed."""
        where = f"{self._repo_name}/{path}" if path else self._repo_name
        if name == "cat":
            seen = path in self._read
            self._read.add(path)
            return f"{where} was already read; this gave no new information." if seen else None
        if name in ("head", "tail"):
            seen = path in self._read or (name, path) in self._viewed
            self._viewed.add((name, path))
            return f"this part of {where} was already shown; this gave no new information." if seen else None
        if name == "ls":
            seen = path in self._listed
            self._listed.add(path)
            return f"the entries of {where} were already shown; this gave no new information." if seen else None
        if name == "cd":
            self._listed.add(path)
        return None

    def step_command(self, command: str):
        """Step with a free-form command; returns what :meth:`step` returns.

        The command rides on the base class's ``step`` under a spare label, so label
        steps and free-form steps share one implementation of the step bookkeeping.
        """
        if not isinstance(command, str):
            raise TypeError(f"a command is a str, got {type(command).__name__}")
        if command in self._actions:
            return self.step(self._labels[self._actions.index(command)])
        if self.done:
            raise RuntimeError("step_command() called on a finished episode; call reset() first")
        spare = next((label for label in self.label_set if label not in self._labels), None)
        if spare is None:
            raise RuntimeError("no spare label left for a free-form command")
        labels, actions = list(self._labels), list(self._actions)
        self._labels.append(spare)
        self._actions.append(command)
        try:
            return self.step(spare)
        except BaseException:
            self._labels, self._actions = labels, actions
            raise

    # --- oracle, success, truncation --------------------------------------------------------

    def _oracle_command(self) -> str:
        """The next command on a shortest path to the nearest target (ties: sorted order)."""
        here = [part for part in self.cwd.split("/") if part]
        best = None
        for target in self._targets:
            *folder, name = target.split("/")
            common = 0
            while common < min(len(here), len(folder)) and here[common] == folder[common]:
                common += 1
            ups, downs = len(here) - common, len(folder) - common
            remaining = ups + downs + (target not in self._read) + 1
            if best is None or remaining < best[0]:
                best = (remaining, target, name, folder, common, ups, downs)
        _, target, name, folder, common, ups, downs = best
        if ups:
            return "cd .."
        if downs:
            return f"cd {quote_path(folder[common])}"
        return f"{'id' if target in self._read else 'cat'} {quote_path(name)}"

    def _oracle_index(self) -> int | None:
        command = self._oracle_command()
        return self._actions.index(command) if command in self._actions else None

    def _truncation_reward(self) -> float:
        return -float(self.horizon)

    def _wasted_step_reward(self) -> float:
        return -STEP_COST

    def _solved(self, total_reward: float) -> bool:
        return -total_reward < SUCCESS_MAX_COST

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
        super().close()

    # --- views for tests and data generation ----------------------------------------------

    @property
    def targets(self) -> list[str]:
        """The acceptable target files of this episode, relative to the repo root."""
        return list(self._targets)

    @property
    def cwd(self) -> str:
        """The current directory relative to the repo root ('' at the root)."""
        return self._sandbox.cwd if self._sandbox is not None else ""

    @property
    def repo_name(self) -> str:
        return self._repo_name

    @property
    def sandbox_root(self) -> str | None:
        """Where this episode's copy lives on disk (None before the first reset)."""
        return None if self._sandbox is None else self._sandbox.root
