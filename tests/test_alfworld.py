"""ALFWorld env: gymnasium contract, oracle, determinism, block list, worker lifecycle.

Most tests play the hand-made fixture game (reset ~0.2 s); one slow test plays a real
tomato→microwave game. The shared data folder is read-only and must stay untouched.
"""

import gc
import importlib.util
import os
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import HANDMADE_GAME
from utils.paths import SHARED_DIR

# Not importorskip: importing alfworld creates ~/.cache/alfworld and sets $ALFWORLD_DATA in
# this process; the env itself only imports it inside its worker process.
if importlib.util.find_spec("alfworld") is None:
    pytest.skip("alfworld is not installed (pip install -e .[alfworld])", allow_module_level=True)
pytestmark = pytest.mark.alfworld

DATA = SHARED_DIR / "alfworld"
TOMATO = DATA / "tomato_microwave_json_2.1.1"
FIXTURE = HANDMADE_GAME
if not FIXTURE.is_dir() or not TOMATO.is_dir():
    pytest.skip(f"ALFWorld data not found under {DATA}", allow_module_level=True)

from gymnasium.utils.env_checker import check_env  # noqa: E402

from envs import EnvSettings, env_kwargs, make_env  # noqa: E402
from envs.alfworld import ALFWorldEnv  # noqa: E402
from envs.alfworld_problems import find_problems, split_names  # noqa: E402
from prompts import LABELS  # noqa: E402
from tests.conftest import snapshot  # noqa: E402

FIXTURE_START = ["go to countertop 1", "go to fridge 1", "go to microwave 1", "help", "inventory", "look"]
PAPER_TASK = "pick_and_place_simple-Tomato-None-Microwave"


@pytest.fixture(scope="module", autouse=True)
def data_before():
    return snapshot(DATA)


@pytest.fixture(scope="module")
def env():
    env = ALFWorldEnv(problems=[FIXTURE])
    yield env
    env.close()


def _rollout(env, seed, rng, steps=8):
    """Observations and rewards of an episode whose labels mix the oracle's and random ones."""
    obs, info = env.reset(seed=seed)
    trace = [obs]
    for _ in range(steps):
        label = info["oracle_label"] if rng.random() < 0.5 else info["labels"][rng.integers(len(info["labels"]))]
        obs, reward, terminated, truncated, info = env.step(label)
        trace += [obs, reward]
        if terminated or truncated:
            break
    return trace


def _broken_copy(tmp_path: Path, name: str) -> Path:
    trial = tmp_path / "data" / f"{PAPER_TASK}-99" / name
    trial.mkdir(parents=True)
    shutil.copyfile(FIXTURE / "traj_data.json", trial / "traj_data.json")
    (trial / "initial_state.pddl").write_text("(define (problem broken) (:domain alfred) (:objects agent1 - agent")
    return trial


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# --- finding problems (no game is played) --------------------------------------------


def test_problem_discovery_and_layouts(tmp_path, monkeypatch):
    assert split_names("valid") == ["valid_seen", "valid_unseen", "valid_train"]
    assert split_names("train, valid_seen,train") == ["train", "valid_seen"]
    train = find_problems(TOMATO, "train", PAPER_TASK)
    assert len(train) == 7 and train == sorted(train)
    assert all(p.parent.name.startswith(PAPER_TASK) and (p / "traj_data.json").is_file() for p in train)
    assert len(find_problems(TOMATO, "valid", PAPER_TASK)) == 4
    assert len(find_problems(TOMATO, "train,valid_seen", PAPER_TASK)) == 8
    every_family = find_problems(TOMATO, "train", "")
    assert set(train) < set(every_family)
    (tmp_path / "json_2.1.1").symlink_to(TOMATO)  # the layout of the full release
    assert [p.name for p in find_problems(tmp_path, "train", PAPER_TASK)] == [p.name for p in train]

    monkeypatch.setenv("ALFWORLD_DATA", str(TOMATO))
    env = ALFWorldEnv(split="valid_seen")
    assert len(env.problems) == 1 and env.worker_pid is None
    env.close()

    monkeypatch.delenv("ALFWORLD_DATA")
    with pytest.raises(ValueError, match=r"--alfworld_data.*ALFWORLD_DATA"):
        ALFWorldEnv()
    with pytest.raises(ValueError, match="no ALFWorld problem.*nope"):
        ALFWorldEnv(data_root=TOMATO, task="nope")
    with pytest.raises(ValueError, match="split folder 'test'"):
        ALFWorldEnv(data_root=TOMATO, split="test")
    with pytest.raises(ValueError, match="not an ALFWorld trial folder"):
        ALFWorldEnv(problems=[tmp_path])
    with pytest.raises(ValueError, match="expert"):
        ALFWorldEnv(problems=[FIXTURE], expert="gpt")
    with pytest.raises(ValueError, match="inside the ALFWorld data"):
        ALFWorldEnv(data_root=TOMATO, scratch_dir=TOMATO / "scratch")


def test_env_kwargs_builds_alfworld(make_args):
    settings = EnvSettings.from_args(make_args(env="alfworld", alfworld_data=str(TOMATO)))
    train_env = make_env("alfworld", **env_kwargs(settings))
    eval_env = make_env("alfworld", **env_kwargs(settings, evaluation=True))
    assert isinstance(train_env, ALFWorldEnv) and train_env.horizon == ALFWorldEnv.default_horizon
    assert len(train_env.problems) == 7 and len(eval_env.problems) == 4
    few_data = EnvSettings.from_args(make_args(env="alfworld", alfworld_data=str(TOMATO), few_data=2))
    few = make_env("alfworld", **env_kwargs(few_data))
    few_eval = make_env("alfworld", **env_kwargs(few_data, evaluation=True))
    assert few.problems == train_env.problems[:2], "--few_data: the first N training games, in path order"
    assert few_eval.problems == eval_env.problems, "--few_data leaves evaluation alone"
    for env in (train_env, eval_env, few, few_eval):
        env.close()


# --- playing the fixture ---------------------------------------------------------------


def test_check_env(env):
    check_env(env, skip_render_check=True)


def test_observation_and_actions(env):
    obs, info = env.reset(seed=0)
    assert info["actions"] == FIXTURE_START  # textworld's admissible commands, in its order
    assert info["labels"] == list(LABELS[:6]) and info["problem"] == str(FIXTURE)
    assert obs.startswith("You are in the middle of a room.") and "Welcome" not in obs
    assert "Your task is to: put " in obs and env.task_description.endswith("microwave.")
    assert obs.endswith(f"{env.action_head}\n" + "".join(f"{i}. {a}\n" for i, a in enumerate(FIXTURE_START)))
    obs, reward, terminated, truncated, info = env.step(env.label_of("go to countertop 1"))
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert "--- History ---\n> go to countertop 1\nYou arrive at countertop 1." in obs
    assert "take tomato 1 from countertop 1" in info["actions"]
    assert info["actions"] == sorted(info["actions"])


@pytest.mark.parametrize("expert", ["handcoded", "planner"])
def test_oracle_wins(env, expert):
    player = env if expert == "handcoded" else ALFWorldEnv(problems=[FIXTURE], expert=expert)
    obs, info = player.reset(seed=3)
    rewards, done = [], False
    while not done:
        obs, reward, terminated, truncated, info = player.step(info["oracle_label"])
        rewards.append(reward)
        done = terminated or truncated
    assert terminated and info["success"] and rewards[-1] == 1.0 and sum(rewards) == 1.0
    assert info["cost"] == -1.0 and info["oracle_label"] is None
    if expert == "planner":
        assert len(rewards) == 5  # the planner's plan is optimal here
        player.close()


def test_same_seed_same_rollout(env):
    shuffled = [ALFWorldEnv(problems=[FIXTURE], shuffle_action=True) for _ in range(2)]
    first = _rollout(shuffled[0], 11, np.random.default_rng(0))
    assert _rollout(shuffled[1], 11, np.random.default_rng(0)) == first
    assert _rollout(shuffled[0], 11, np.random.default_rng(0)) == first
    assert _rollout(shuffled[0], 12, np.random.default_rng(0))[0] != first[0]  # other labels shown
    for other in shuffled:
        other.close()
    # The task sentence is drawn inside the game from the env's seed.
    sentences = set()
    for seed in range(6):
        env.reset(seed=seed)
        sentences.add(env.task_description)
    assert sentences == {"put a tomato in microwave.", "put some tomato on microwave."}


def test_invalid_label_leaves_state(env):
    obs, info = env.reset(seed=5)
    obs, _, _, _, info = env.step(env.label_of("go to fridge 1"))
    again, reward, terminated, truncated, bad = env.step("Z")
    assert again == obs and reward == 0.0 and not (terminated or truncated) and bad["invalid_label"]
    assert bad["actions"] == info["actions"] and bad["oracle_label"] == info["oracle_label"]
    obs, _, _, _, info = env.step(env.label_of("open fridge 1"))
    assert "In it, you see a apple 1." in obs and "take apple 1 from fridge 1" in info["actions"]


def test_history_holds_every_step_by_default_and_can_be_capped(env):
    """The paper's: every step since the start; --alfworld_history_steps N keeps the last N."""
    obs, info = env.reset(seed=0)
    for _ in range(12):
        obs, _, _, _, info = env.step(env.label_of("look"))
    assert "--- History ---\n" in obs and obs.count("\n> look\n") == 12
    capped = ALFWorldEnv(problems=[FIXTURE], history_steps=10)
    obs, info = capped.reset(seed=0)
    for _ in range(12):
        obs, _, _, _, info = capped.step(capped.label_of("look"))
    assert "--- History (last 10 of 12 steps) ---" in obs and obs.count("\n> look\n") == 10
    assert "Your task is to: " in obs
    capped.close()


def test_shuffled_labels_are_the_first_n_listed_in_label_order():
    """The paper's ALFWorld shuffle: the labels 0..n-1 permuted over the commands, listed by label."""
    env = ALFWorldEnv(problems=[FIXTURE], shuffle_action=True)
    moved = False
    for seed in range(4):
        obs, info = env.reset(seed=seed)
        assert sorted(info["labels"], key=LABELS.index) == list(LABELS[: len(info["actions"])])
        listing = obs.split(env.action_head + "\n")[1]
        by_label = sorted(zip(info["labels"], info["actions"]), key=lambda pair: LABELS.index(pair[0]))
        assert listing == "".join(f"{label}. {command}\n" for label, command in by_label)
        moved |= info["labels"] != list(LABELS[: len(info["actions"])])
        _, reward, *_ = env.step(env.label_of("go to fridge 1"))  # a label still picks its own command
        assert "fridge 1" in env.observation.split("--- History ---")[1]
    assert moved
    env.close()


def test_without_an_expert_there_is_no_oracle_and_the_game_plays_the_same():
    plain = ALFWorldEnv(problems=[FIXTURE], expert="none")
    obs, info = plain.reset(seed=3)
    assert info["oracle_label"] is None and plain.expert_plan == []
    obs, reward, *_ = plain.step(plain.label_of("go to microwave 1"))
    assert "microwave 1" in obs and reward == 0.0
    plain.close()


# --- failures: block list, timeouts, dead workers ---------------------------------------


def test_broken_problem_is_blocked_and_skipped(tmp_path):
    broken, other_broken = _broken_copy(tmp_path, "trial_broken"), _broken_copy(tmp_path, "trial_other")
    block_list = tmp_path / "run" / "alfworld_blocklist.txt"
    env = ALFWorldEnv(problems=[broken, FIXTURE], block_list=block_list)
    assert env.problems == sorted([broken, FIXTURE])
    for seed in range(4):  # random picks: the broken game fails once, then is never tried again
        _, info = env.reset(seed=seed)
        assert info["problem"] == str(FIXTURE)
    assert set(env.blocked) == {broken}
    lines = block_list.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{broken}\t") and "ParseError" in lines[0]
    with pytest.raises(RuntimeError, match="is blocked"):
        env.reset(options={"problem": broken})
    # An explicitly requested game that fails is an error, not silently swapped for another.
    with pytest.raises(RuntimeError, match=f"problem {other_broken} failed: ParseError"):
        env.reset(options={"problem": other_broken})
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("0")  # no game was started: nothing to play on
    assert set(env.blocked) == {broken, other_broken} and len(block_list.read_text().splitlines()) == 2
    env.close()

    # Another env of the same run reads the block list; with nothing left it says so.
    env = ALFWorldEnv(problems=[broken], block_list=block_list)
    with pytest.raises(RuntimeError, match="every ALFWorld problem.*1 blocked"):
        env.reset(seed=0)
    env.close()


def test_hanging_or_dead_game_is_killed_and_recorded(tmp_path):
    copy = tmp_path / "data" / f"{PAPER_TASK}-98" / "trial_copy"
    shutil.copytree(FIXTURE, copy)
    block_list = tmp_path / "blocklist.txt"
    env = ALFWorldEnv(problems=[FIXTURE, copy], block_list=block_list, timeout=30)
    env.reset(options={"problem": FIXTURE})
    first_pid = env.worker_pid

    env.timeout = 1e-3  # no reset answers that fast: a stand-in for a hanging game
    with pytest.raises(RuntimeError, match="timeout"):
        env.reset(options={"problem": copy})
    assert env.worker_pid is None and _gone(first_pid)
    assert block_list.read_text().startswith(f"{copy}\ttimeout")

    env.timeout = 30
    _, info = env.reset(seed=0)  # a fresh worker; the timed-out game is skipped
    assert info["problem"] == str(FIXTURE) and env.worker_pid not in (None, first_pid)

    os.kill(env.worker_pid, 9)  # the game process dies mid-episode
    obs, reward, terminated, truncated, info = env.step(info["oracle_label"])
    assert truncated and not terminated and reward == 0.0 and not info["success"]
    assert "worker died" in info["engine_error"]
    assert set(env.blocked) == {FIXTURE, copy} and len(block_list.read_text().splitlines()) == 2
    with pytest.raises(RuntimeError, match="every ALFWorld problem"):
        env.reset(seed=1)
    env.close()


def test_close_and_garbage_collection_stop_the_worker(tmp_path):
    env = ALFWorldEnv(problems=[FIXTURE], scratch_dir=tmp_path / "scratch")
    env.reset(seed=0)
    pid, scratch = env.worker_pid, env.scratch
    assert scratch.parent == tmp_path / "scratch" and (scratch / "game" / "game.tw-pddl").is_file()
    env.close()
    env.close()
    assert _gone(pid) and not scratch.exists() and env.worker_pid is None

    env = ALFWorldEnv(problems=[FIXTURE])
    env.reset(seed=0)
    pid, scratch = env.worker_pid, env.scratch
    del env
    gc.collect()
    assert _gone(pid) and not scratch.exists()


def test_workers_start_one_a_core_at_a_time(tmp_path, monkeypatch):
    """A batch's environments start their workers at once; at most one a core (here 2) is starting at any
    time, so that none waits past the start timeout behind the others (an evaluation beside another on 2
    cores lost a row that way)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from envs import alfworld_client

    starting, most, lock = 0, 0, threading.Lock()

    def spawn(worker):
        nonlocal starting, most
        with lock:
            starting += 1
            most = max(most, starting)
        return SimpleNamespace(pid=0), None

    def receive(worker, timeout):
        nonlocal starting
        time.sleep(0.05)  # importing textworld
        with lock:
            starting -= 1
        return ("ready",)

    monkeypatch.setattr(alfworld_client, "_STARTS", threading.BoundedSemaphore(2))
    monkeypatch.setattr(alfworld_client._Worker, "_spawn", spawn)
    monkeypatch.setattr(alfworld_client._Worker, "_receive", receive)
    workers = [alfworld_client._Worker(tmp_path) for _ in range(8)]
    with ThreadPoolExecutor(len(workers)) as pool:
        for started in [pool.submit(worker.start) for worker in workers]:
            started.result()  # raises what a start raised
    assert most == 2 and all(worker.process is not None for worker in workers)


@pytest.mark.slow
def test_real_game_oracle_wins():
    env = ALFWorldEnv(data_root=TOMATO, split="train", horizon=50)
    obs, info = env.reset(seed=0)
    assert env.problem in env.problems and "Your task is to: put " in obs and "tomato" in obs
    assert info["oracle_label"] is not None
    done = False
    while not done:
        obs, reward, terminated, truncated, info = env.step(info["oracle_label"])
        done = terminated or truncated
    assert terminated and info["success"] and reward == 1.0
    env.close()


def _played(memoise: bool, problems: list, seeds: tuple[int, ...], rounds: int = 2,
            keep: bool = True, shallow: bool = True) -> list:
    """Each problem played from each seed, ``rounds`` times over (after the first, from a warm worker): every
    episode's trace (oracle and random labels mixed)."""
    env = ALFWorldEnv(problems=problems, memoise_engine=memoise, keep_translations=keep, shallow_contexts=shallow,
                      horizon=12)
    traces = []
    try:
        for _ in range(rounds):
            for problem in problems:
                for seed in seeds:
                    obs, info = env.reset(seed=seed, options={"problem": str(problem)})
                    rng, trace, done = np.random.default_rng(seed), [(obs, info["labels"], info["oracle_label"])], False
                    while not done:
                        label = info["oracle_label"] if rng.random() < 0.5 else info["labels"][rng.integers(len(info["labels"]))]
                        obs, reward, terminated, truncated, info = env.step(label)
                        trace.append((obs, reward, terminated, info["labels"], info["oracle_label"]))
                        done = terminated or truncated
                    traces.append(trace)
    finally:
        env.close()
    return traces


def test_the_memoised_engine_plays_the_same_episodes():
    """The worker's memo of the engine (PDDL translation, grammar parsing) is exact: the same episodes with and
    without it."""
    with_memo = _played(True, [FIXTURE], (0, 1), keep=False)
    without = _played(False, [FIXTURE], (0, 1), rounds=1)
    assert with_memo == without * 2


def test_shallow_grammar_contexts_play_the_same_episodes():
    """The grammar's contexts copied without deep copies (``alfworld_worker.copy_contexts_shallowly``): the same
    episodes as textworld's deep copies, with the memo off and on."""
    deep = _played(False, [FIXTURE], (0, 1), rounds=1, shallow=False)
    assert _played(False, [FIXTURE], (0, 1), rounds=1) == deep
    assert _played(True, [FIXTURE], (0, 1), keep=False) == deep * 2


def test_shallow_contexts_share_the_records_and_copy_the_dicts(monkeypatch):
    """In this process: what the patch copies (the two dicts the grammar adds to) and shares (the entities'
    records, which it only reads), its original kept for the switch, and a second call changing nothing."""
    import textworld.envs.pddl.textgen as textgen

    from envs.alfworld_worker import copy_contexts_shallowly

    original = textgen.copy_context
    monkeypatch.setattr(textgen, "copy_context", original)  # restored after the test
    copy_contexts_shallowly()
    copy_contexts_shallowly()
    assert textgen.copy_context.__wrapped__ is original
    record, variable, state = object(), object(), object()
    context = {"state": state, "facts": [], "variables": {"o": record}, "mapping": {"p": variable}, "entity_infos": {}}
    copied = textgen.copy_context(context)
    assert copied == context and copied["state"] is state
    assert copied["variables"] is not context["variables"] and copied["mapping"] is not context["mapping"]
    assert copied["variables"]["o"] is record and copied["mapping"]["p"] is variable
    copied["variables"]["r"] = record
    assert "r" not in context["variables"]
    assert original(context)["variables"]["o"] is not record  # textworld's own: a deep copy


def test_grammar_expressions_read_their_variables_on_every_python(monkeypatch):
    """textworld 1.7 hands a template's variables to ``eval`` through ``locals()``, which stopped working in Python
    3.13 (PEP 667): the worker's patch passes them as ``eval``'s locals, with the same values where the original
    works (Python 3.11, 3.12), and its original kept."""
    import textworld.envs.pddl.textgen as textgen

    from envs.alfworld_worker import evaluate_with_the_variables

    original = textgen.EvalSymbol.derive
    monkeypatch.setattr(textgen.EvalSymbol, "derive", original)  # restored after the test
    evaluate_with_the_variables()
    evaluate_with_the_variables()
    assert textgen.EvalSymbol.derive.__wrapped__ is original
    tomato = types.SimpleNamespace(name="tomato 1")
    context = {"variables": {"o": tomato, "value": "hidden, as before"}, "mapping": {}}
    expressions = ("o.name", "list(join(', ', [o.name, 'microwave 1']))", "context['variables']['o'] is o",
                   "'value' in dir()")
    patched = [symbol.symbol for e in expressions for symbol in textgen.EvalSymbol(e, context).derive()]
    assert patched == ["tomato 1", ["tomato 1", ", ", "microwave 1"], True, False]  # join: the module's
    if sys.version_info < (3, 13):
        assert [symbol.symbol for e in expressions for symbol in original(textgen.EvalSymbol(e, context))] == patched
    else:  # what the patch is for
        with pytest.raises(NameError, match="'o' is not defined"):
            original(textgen.EvalSymbol("o.name", context))


def test_kept_translations_are_shared_by_new_workers_and_exact(tmp_path, monkeypatch):
    """The memo's game translations kept on disk (``alfworld_worker.engine_store``, in ``$REFLECTRL_CACHE``): a
    new worker reads them instead of translating again, its episodes the same as without any memo; a damaged
    file is translated again and replaced."""
    import pickle

    from envs.alfworld_worker import engine_store

    monkeypatch.setenv("REFLECTRL_CACHE", str(tmp_path / "cache"))  # the worker process inherits it
    without = _played(False, [FIXTURE], (0, 1), rounds=1)
    assert not engine_store().exists()  # no memo, nothing kept
    filled = _played(True, [FIXTURE], (0, 1), rounds=1)
    kept = {path: path.stat().st_mtime_ns for path in engine_store().rglob("*.pickle")}
    assert len(kept) == 2 and all(path.parent.name == "pddl2sas" for path in kept)  # the two translations of a game
    assert not list(engine_store().rglob("*.part"))  # written whole, then renamed
    read = _played(True, [FIXTURE], (0, 1), rounds=1)
    assert filled == read == without
    assert {path: path.stat().st_mtime_ns for path in kept} == kept  # read, not written again
    damaged = sorted(kept)[0]
    damaged.write_bytes(b"not a pickle")
    again = _played(True, [FIXTURE], (0,), rounds=1)
    assert again == without[:1]
    pickle.loads(damaged.read_bytes())  # replaced by a whole answer


def test_translations_stay_in_the_worker_when_not_kept(tmp_path, monkeypatch):
    from envs.alfworld_worker import engine_store

    monkeypatch.setenv("REFLECTRL_CACHE", str(tmp_path / "cache"))
    _played(True, [FIXTURE], (0,), rounds=1, keep=False)
    assert not engine_store().exists()


def test_a_cache_that_cannot_be_written_leaves_the_memo_in_the_worker(tmp_path, monkeypatch):
    """(A read-only or full cache is alike: the store's folder cannot be made here, its parent being a file.)"""
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setenv("REFLECTRL_CACHE", str(blocked))
    assert _played(True, [FIXTURE], (0, 1)) == _played(False, [FIXTURE], (0, 1))
    assert blocked.read_text() == "a file where the cache folder should be"


@pytest.mark.slow
def test_the_memoised_engine_on_a_real_game_is_exact(tmp_path, monkeypatch):
    """(Its speed is measured by benchmarks.env_speed.) Against textworld as it is (no memo, deep copies of the
    grammar's contexts), the translations kept in a fresh store: the first round translates, the second replays
    from the worker's memory, then a new worker reads them from disk."""
    monkeypatch.setenv("REFLECTRL_CACHE", str(tmp_path / "cache"))
    (problem,) = find_problems(TOMATO, "train", PAPER_TASK)[:1]
    without = _played(False, [problem], (3,), rounds=1, shallow=False)
    with_memo = _played(True, [problem], (3,))
    from_disk = _played(True, [problem], (3,), rounds=1)
    assert with_memo == without * 2 and from_disk == without


def test_a_batch_plays_its_games_side_by_side_with_the_same_episodes(make_args, monkeypatch):
    """A batch of ALFWorld episodes waits on its worker processes at once (rollout._pool); the episodes are
    those of playing the envs one after the other."""
    from rollout import EpisodeStart, TwoPlayerRollout
    from rollout import episodes as rollout_module
    from utils import models

    args = make_args()
    policy, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args), trainable=False)
    player = TwoPlayerRollout.from_args(args, policy, tokenizer)
    envs = [ALFWorldEnv(problems=[FIXTURE], horizon=6, labels=player.labels) for _ in range(3)]
    starts = [EpisodeStart(seed=seed, options={}) for seed in (4, 5, 6)]
    try:
        assert rollout_module._pool(envs) is not None  # threads for envs that play elsewhere
        together = player.run(envs, starts, np.random.default_rng(1))
        monkeypatch.setattr(rollout_module, "_pool", lambda envs: rollout_module.contextlib.nullcontext())
        alone = player.run(envs, starts, np.random.default_rng(1))
    finally:
        for env in envs:
            env.close()
    assert [e.to_dict() for e in together] == [e.to_dict() for e in alone]
    assert all(len(e.decisions) == 6 or e.success for e in together)


def test_data_folder_untouched(data_before):
    """Runs last: nothing above may have written into the shared data."""
    assert snapshot(DATA) == data_before
