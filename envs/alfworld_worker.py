"""The ALFWorld game process: builds a game file, plays it with textworld, answers over a pipe.

Everything in this file runs in a separate process that :class:`envs.alfworld.ALFWorldEnv`
starts (``spawn`` context) and talks to over a ``multiprocessing`` pipe, so that a game
which hangs in the planner or crashes the PDDL engine can be killed without taking the
trainer down with it. Requests and answers are tuples of plain values:

* ``("reset", trial_dir, game_dir, expert, seed)``: build ``game_dir/game.tw-pddl`` from the
  trial folder (never written into), seed Python's ``random`` and start the game;
* ``("step", command)``: play one command;
* ``("close",)``: end the process.

The process answers ``("ready", pid)`` once textworld and alfworld are imported, then each
reset or step with ``("ok", state)`` (see :func:`_state`) or ``("error", message, traceback)``.
"""

import json
import os
import pickle
import random
import shutil
import traceback
from pathlib import Path

GAME_FILE = "game.tw-pddl"
# Episodes end at the env's horizon; textworld's own step limit must never trigger first.
MAX_EPISODE_STEPS = 100_000


def build_game_file(trial_dir: Path, game_dir: Path) -> Path:
    """Write a playable ``game.tw-pddl`` (and the ``traj_data.json`` it reads) into ``game_dir``.

    The game is rebuilt from the trial's ``initial_state.pddl`` with the logic files of the
    installed alfworld, whose grammar ("move X to Y") differs from the one the json_2.1.1
    games were recorded with. The task sentence is drawn with Python's global ``random``.
    """
    from alfworld.agents.utils.misc import add_task_to_grammar
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    trial_dir, game_dir = Path(trial_dir), Path(game_dir)
    traj_data = json.loads((trial_dir / "traj_data.json").read_text())
    game_dir.mkdir(parents=True, exist_ok=True)
    # The handcoded expert reads traj_data.json from the game file's folder.
    shutil.copyfile(trial_dir / "traj_data.json", game_dir / "traj_data.json")
    game = {
        "pddl_domain": Path(ALFRED_PDDL_PATH).read_text(),
        "grammar": add_task_to_grammar(Path(ALFRED_TWL2_PATH).read_text(), traj_data),
        "pddl_problem": (trial_dir / "initial_state.pddl").read_text(),
        "solvable": True,
    }
    game_file = game_dir / GAME_FILE
    game_file.write_text(json.dumps(game))
    return game_file


def _state(obs, score, done, infos) -> dict:
    """The part of textworld's answer the env uses, as plain picklable values."""
    return {
        "obs": str(obs),
        "score": float(score),
        "done": bool(done),
        "won": bool(infos.get("won", False)),
        "admissible_commands": [str(command) for command in infos["admissible_commands"]],
        "expert_plan": [str(command) for command in infos.get("extra.expert_plan") or []],
    }


def memoise_engine(store: Path | None = None) -> None:
    """Make the game engine remember, in this process, the answers of its pure and costly parts:

    * the PDDL-to-SAS translation (``fast_downward.pddl2sas``): a reset translates the game's domain and
      problem four times, about 6 s of a real game's 6.5 s, so a game played again resets in about 0.5 s.
      With ``store`` (a folder, :func:`engine_store`) its answers are also kept on disk, shared by every worker
      process and later run: a game any of them translated before resets in about 0.5 s in a new worker too;
    * the parsing of textworld's text-grammar templates and logic queries (``_parse_and_convert`` of
      ``textworld.envs.pddl.textgen`` and ``textworld.logic``): a step parses the same few hundred strings
      again and again to write its feedback, two thirds of its time.

    Each answer depends on its arguments alone (the translation's: the domain's and the problem's texts and two
    switches); each call gets its own copy (unpickled), so nothing the game changes is shared between calls or
    episodes: the episodes are those without the memo (tests/test_alfworld.py).
    """
    import fast_downward
    import textworld.envs.pddl.textgen
    import textworld.logic

    _remember(fast_downward, "pddl2sas", store)
    _remember(textworld.logic, "_parse_and_convert")
    _remember(textworld.envs.pddl.textgen, "_parse_and_convert")


def copy_contexts_shallowly() -> None:
    """Make textworld's text grammar copy its derivation contexts without deep-copying what they name.

    To write each admissible command and each feedback, the grammar copies a context (the variables a
    template names and their mapping to the game's entities) for every symbol it expands, with ``deepcopy``:
    every entity's record, again and again, about two thirds of a real game's step (and of a reset's after its
    translation). Only the two dicts are ever changed (entries added), and the records are only read (the
    grammar's expressions are attribute reads such as ``o.name``), so copying the dicts and sharing the records
    gives the same texts: the same episodes (tests/test_alfworld.py, on the fixture and on a real game).
    ``ALFWorldEnv(shallow_contexts=False)`` keeps textworld's deep copies.
    """
    import textworld.envs.pddl.textgen as textgen

    deep = textgen.copy_context
    if hasattr(deep, "__wrapped__"):
        return

    def shallow(context: dict) -> dict:
        return {"state": context["state"], "facts": context["facts"], "variables": dict(context["variables"]),
                "mapping": dict(context["mapping"]), "entity_infos": context["entity_infos"]}

    shallow.__wrapped__ = deep
    textgen.copy_context = shallow


def evaluate_with_the_variables() -> None:
    """Make textworld's grammar evaluate a template's expression (``{o.name}``, ``{display_list(...)}``) with the
    context's variables as ``eval``'s locals.

    textworld 1.7 (the newest release) adds the variables to ``locals()`` and calls ``eval`` without a
    namespace. Up to Python 3.12 ``locals()`` is the frame's own dictionary, which ``eval`` then reads; from 3.13
    on it is a snapshot (PEP 667), the variables never reach ``eval``, and a game's first text fails with
    "name 'r' is not defined" (an open TextWorld pull request, #372, fixes it there). Here ``eval`` gets the
    namespace it read before: the variables, then the method's own locals over them (``value``, not yet bound
    there, hid a variable of that name), and the module's globals. The same texts (tests/test_alfworld.py), on
    every Python the project runs on.
    """
    import textworld.envs.pddl.textgen as textgen

    original = textgen.EvalSymbol.derive
    if hasattr(original, "__wrapped__"):
        return

    def derive(self, context=None):
        context = context or self.context
        namespace = {name: value for name, value in context["variables"].items() if name != "value"}
        namespace.update(self=self, context=context)
        return [textgen.TerminalSymbol(eval(self.expression, vars(textgen), namespace))]

    derive.__wrapped__ = original
    textgen.EvalSymbol.derive = derive


def engine_store() -> Path:
    """The folder of the engine's kept translations: in the project's cache, one per version of the engine's
    packages (a new translator never reads an old one's answers)."""
    from importlib.metadata import version

    from utils.paths import cache_root

    versions = "-".join(f"{name}{version(name)}" for name in ("fast-downward-textworld", "textworld"))
    return cache_root() / f"alfworld-engine-{versions}"


def _remember(module, name: str, store: Path | None = None) -> None:
    """Replace ``module.name`` by a memo of it, keyed on its (hashable) arguments, answering copies; with
    ``store``, the answers are also read from and written to files there (:func:`_kept`)."""
    compute = getattr(module, name)
    if hasattr(compute, "__wrapped__"):
        return
    answers: dict[tuple, bytes] = {}

    def remembered(*args, **kwargs):
        key = (args, tuple(sorted(kwargs.items())))
        if key not in answers:
            def answer() -> bytes:
                return pickle.dumps(compute(*args, **kwargs))

            answers[key] = _kept(store / name, key, answer) if store else answer()
        return pickle.loads(answers[key])

    remembered.__wrapped__ = compute
    setattr(module, name, remembered)


def _kept(folder: Path, key: tuple, compute) -> bytes:
    """The pickled answer for ``key`` from its file in ``folder`` (named by the SHA-256 of the pickled key), or
    ``compute()``'s, written there atomically (workers writing the same answer at once each rename a whole
    file). A file that does not unpickle (a disk fault, a foreign file) is computed and written again; a store
    that cannot be written leaves the answer in the worker's memo only. The files are this project's own cache,
    unpickled as trusted, like the rest of ``$REFLECTRL_CACHE``."""
    import hashlib
    import tempfile

    path = folder / f"{hashlib.sha256(pickle.dumps(key, protocol=4)).hexdigest()}.pickle"
    try:
        blob = path.read_bytes()
        pickle.loads(blob)
        return blob
    except Exception:  # not there yet, or unreadable: computed below (and replaced)
        pass
    blob = compute()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, scratch = tempfile.mkstemp(dir=folder, suffix=".part")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(blob)
            os.replace(scratch, path)
        finally:
            Path(scratch).unlink(missing_ok=True)  # gone once renamed; a half-written one is not left
    except OSError:  # a cache that cannot be written (read-only, full): the answer stays in this worker's memo
        pass
    return blob


class _Game:
    """One textworld game at a time, restarted from a freshly built game file at each reset."""

    def __init__(self, memoise: bool = True, keep: bool = True, shallow: bool = True):
        import textworld
        import textworld.gym
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos

        evaluate_with_the_variables()  # needed from Python 3.13 on: not a switch
        if memoise:
            memoise_engine(engine_store() if keep else None)
        if shallow:
            copy_contexts_shallowly()
        self._textworld = textworld
        self._wrappers = (AlfredDemangler, AlfredInfos, AlfredExpert)
        self._env = None

    def reset(self, trial_dir: str, game_dir: str, expert: str, seed: int) -> dict:
        self.close()
        textworld = self._textworld
        demangler, infos_wrapper, expert_wrapper = self._wrappers
        # One seed makes both the task sentence and the handcoded expert's choices
        # (it also uses the global ``random``) a function of the env's seed.
        random.seed(seed)
        game_file = build_game_file(Path(trial_dir), Path(game_dir))
        wrappers = [demangler(shuffle=False), infos_wrapper]
        if expert != "none":  # no expert: no oracle, and no planning at every step (the paper's default)
            wrappers.append(expert_wrapper(expert_type=expert))
        request = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile", "expert_plan"])
        env_id = textworld.gym.register_game(
            str(game_file), request, max_episode_steps=MAX_EPISODE_STEPS, name="reflect-rl-alfworld",
            wrappers=wrappers,
        )
        self._env = textworld.gym.make(env_id)
        # This process lives for many episodes; keep textworld's registry from growing.
        textworld.gym.registry.pop(env_id, None)
        obs, infos = self._env.reset()
        return _state(obs, 0.0, False, infos)

    def step(self, command: str) -> dict:
        if self._env is None:
            raise RuntimeError("step before any reset in the ALFWorld worker")
        return _state(*self._env.step(command))

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


def serve(conn, alfworld_data: str, memoise: bool = True, keep: bool = True, shallow: bool = True) -> None:
    """The worker's main loop (the ``target`` of its process); ``memoise``, ``keep``: :func:`memoise_engine`,
    with the translations kept on disk (:func:`engine_store`) or not; ``shallow``: :func:`copy_contexts_shallowly`."""
    # Importing alfworld creates $ALFWORLD_DATA (default ~/.cache/alfworld) if missing;
    # point it at the env's scratch folder so that nothing appears in the user's home.
    os.environ.setdefault("ALFWORLD_DATA", alfworld_data)
    try:
        game = _Game(memoise, keep, shallow)
    except Exception as error:  # reported to the parent, which raises it
        conn.send(("error", f"{type(error).__name__}: {error}", traceback.format_exc()))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the parent is gone
            break
        if request[0] == "close":
            break
        try:
            if request[0] == "reset":
                answer = ("ok", game.reset(*request[1:]))
            elif request[0] == "step":
                answer = ("ok", game.step(*request[1:]))
            else:
                raise ValueError(f"unknown request {request[0]!r} to the ALFWorld worker")
        except Exception as error:  # a game-engine failure: the parent records and skips the game
            answer = ("error", f"{type(error).__name__}: {error}", traceback.format_exc())
        conn.send(answer)
    game.close()
    conn.close()
