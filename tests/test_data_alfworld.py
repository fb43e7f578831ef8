"""ALFWorld pipeline: oracle reflections, resume, API backend, SFT texts.

Most tests play the hand-made fixture game, copied into a temporary data root laid out as
``<root>/train/<family>/<trial>``; one slow test plays the real tomato→microwave family.
The shared data folder is read-only and must stay untouched.
"""

import importlib.util
import json
import re
import shutil
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
FAMILY = "pick_and_place_simple-Tomato-None-Microwave"
FIXTURE = HANDMADE_GAME
if not FIXTURE.is_dir() or not TOMATO.is_dir():
    pytest.skip(f"ALFWorld data not found under {DATA}", allow_module_level=True)

from data_gen.alfworld import gen_sft, reflection  # noqa: E402
from data_gen.alfworld.oracle_writer import LastStep, Memory, oracle_reflection  # noqa: E402
from data_gen.alfworld.reflection import journal_name  # noqa: E402
from data_gen.common import Journal, item_rng, reflection_problem  # noqa: E402
from envs.alfworld import ALFWorldEnv  # noqa: E402
from envs.base import rng_seed  # noqa: E402
from experiment_args import ScriptArguments  # noqa: E402
from prompts import ACTION_MARKER, completion_start, policy_prompt, reflection_prompt  # noqa: E402
from tests.conftest import snapshot  # noqa: E402
from tests.openai_server import OpenAIServer  # noqa: E402
from utils.llm import LLMError  # noqa: E402

HEAD = ALFWorldEnv.action_head
WIN = "move tomato 1 to microwave 1"


@pytest.fixture(scope="module", autouse=True)
def data_before():
    return snapshot(DATA)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A data root holding only the fixture game, in the layout of the real release."""
    root = tmp_path_factory.mktemp("alfworld_data")
    shutil.copytree(FIXTURE, root / "train" / f"{FAMILY}-1" / "trial_handmade")
    return root


def _args(root: Path, out: Path, **overrides) -> ScriptArguments:
    values = {"env": "alfworld", "model_name": "tiny-gpt2", "api": "oracle", "alfworld_data": str(root), "output_dir": str(out),
              "num_episodes": 3}
    values.update(overrides)
    return ScriptArguments(**values)


def _run(root: Path, out: Path, **overrides) -> list[dict]:
    assert reflection.main(_args(root, out, **overrides)) == 0
    return json.loads((out / "data_reflection.json").read_text())


def _episodes(records: list[dict]) -> dict[int, list[dict]]:
    by_episode: dict[int, list[dict]] = {}
    for record in records:
        by_episode.setdefault(record["episode"], []).append(record)
    return by_episode


def _taken(state: str) -> str:
    """The command the agent took last, read from the history of a later state."""
    return re.findall(r"^> (.+)$", state, flags=re.M)[-1]


@pytest.fixture(scope="module")
def expert_run(root, tmp_path_factory):
    """Three episodes following the expert (random_prob=0), with the summary line printed."""
    out = tmp_path_factory.mktemp("expert_run")
    return out, _run(root, out, random_prob=0.0)


# --- the oracle writer, without a game --------------------------------------------------


def test_oracle_writer_reads_the_episode():
    rng = np.random.default_rng(0)
    memory = Memory.from_task("put some tomato on microwave.")
    assert (memory.task, memory.target, memory.destination) == ("put some tomato on microwave", "tomato", "microwave")
    start = oracle_reflection(memory, "look", None, rng)
    assert "put some tomato on microwave" in start and "just started" in start

    revealed = memory.update("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see "
                                                   "a fork 2, a tomato 1, and a tomato 3.")
    assert revealed == ["tomato 1", "tomato 3"] and memory.location == "countertop 1"
    last = LastStep("go to countertop 1", "...", was_expert=False, revealed=revealed)
    text = oracle_reflection(memory, "take tomato 1 from countertop 1", last, rng)
    assert "was not planned but showed me tomato 1 and tomato 3" in text
    assert "pick it up" in text or "take it" in text

    memory.update("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed.")
    back = oracle_reflection(memory, "go to countertop 1", LastStep("go to fridge 1", "", False, []), rng)
    assert "tomato 1" in back.lower() and "countertop 1" in back and "go to countertop 1" not in back

    memory.update("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a tomato 1.")
    memory.update("take tomato 1 from countertop 1", "You pick up the tomato 1 from the countertop 1.")
    memory.update("go to microwave 1", "You arrive at microwave 1. The microwave 1 is closed.")
    assert memory.holding == "tomato 1" and memory.location == "microwave 1"
    text = oracle_reflection(memory, "open microwave 1", LastStep("go to microwave 1", "", True, []), rng)
    assert "I am at microwave 1 holding tomato 1" in text and "closed, so I should open it" in text
    assert text.count(".") == 2 and text.endswith(".")

    nothing = oracle_reflection(memory, "open microwave 1", LastStep("use microwave 1", "Nothing happens.", False, []),
                                rng)
    assert "using microwave 1 did nothing" in nothing


# --- rollouts on the fixture game -------------------------------------------------------


def test_random_prob_zero_follows_the_expert_to_a_win(expert_run):
    out, records = expert_run
    episodes = _episodes(records)
    assert sorted(episodes) == [0, 1, 2]
    for episode in episodes.values():
        assert [r["step"] for r in episode] == list(range(len(episode)))
        assert episode[-1]["command"] == WIN
        for record, following in zip(episode, episode[1:]):
            assert _taken(following["state"]) == record["command"]  # the expert's command was played
        assert "just started" in episode[0]["reflection"]
        assert not any("detour" in r["reflection"] or "did not" in r["reflection"] for r in episode)
    for record in records:
        assert set(record) == {"state", "reflection", "action", "command", "taken", "model", "episode", "step",
                               "problem"}
        assert record["model"] == "oracle" and record["problem"] == f"train/{FAMILY}-1/trial_handmade"
        assert f"{record['action']}. {record['command']}\n" in record["state"]
        text = record["reflection"]
        assert "tomato" in text and "microwave" in text  # the task
        assert len(re.findall(r"[.!?](?:\s|$)", text)) <= 2 and text.endswith(".")
    # Replaying episode 0 with its seed gives the same states and ends in a win.
    env = ALFWorldEnv(problems=[FIXTURE])
    obs, info = env.reset(seed=rng_seed(item_rng(ScriptArguments().seed, "alfworld", 0)))
    for record in episodes[0]:
        assert obs == record["state"] and info["oracle_label"] == record["action"]
        obs, reward, terminated, truncated, info = env.step(record["taken"])
    assert terminated and info["success"] and reward == 1.0
    env.close()


def test_random_prob_one_still_labels_the_expert(root, tmp_path):
    records = _run(root, tmp_path, random_prob=1.0, num_episodes=2, horizon=10)
    assert len(records) >= 10
    off_plan = 0
    for episode in _episodes(records).values():
        for record, following in zip(episode, episode[1:]):
            off_plan += _taken(following["state"]) != record["command"]
    assert off_plan >= 5
    for record in records:
        assert f"{record['action']}. {record['command']}\n" in record["state"]
        assert "tomato" in record["reflection"]
    assert any("detour" in r["reflection"] or "did not" in r["reflection"] for r in records)


def test_states_without_an_expert_command_are_skipped_and_counted(root, tmp_path, monkeypatch, capsys):
    expert = ALFWorldEnv._oracle_index
    monkeypatch.setattr(ALFWorldEnv, "_oracle_index", lambda env: None if env.steps % 2 else expert(env))
    records = _run(root, tmp_path, num_episodes=1, horizon=6)
    assert [r["step"] for r in records] == [0, 2, 4]
    assert "skipped states (no expert command): 3," in capsys.readouterr().out


def test_interrupted_run_resumes_to_the_same_output(root, tmp_path, monkeypatch):
    whole = _run(root, tmp_path / "whole", num_episodes=4, horizon=6)
    calls = {"n": 0}
    real = reflection.play

    def failing(args, env, index, oracle_writer):
        calls["n"] += 1
        if calls["n"] == 3:
            raise LLMError("simulated outage")
        return real(args, env, index, oracle_writer)

    monkeypatch.setattr(reflection, "play", failing)
    args = _args(root, tmp_path / "part", num_episodes=4, horizon=6)
    assert reflection.main(args) == 1
    assert len(Journal(tmp_path / "part", journal_name(args)).done) == 2
    assert not (tmp_path / "part" / "data_reflection.json").exists()
    monkeypatch.setattr(reflection, "play", real)
    assert _run(root, tmp_path / "part", num_episodes=4, horizon=6) == whole


def test_missing_data_root_names_the_flag_and_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    args = ScriptArguments(env="alfworld", model_name="tiny-gpt2", api="oracle", output_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"--alfworld_data.*ALFWORLD_DATA"):
        reflection.main(args)


# --- the API backend ------------------------------------------------------------------------


def test_api_backend_writes_the_model_answer(root, tmp_path):
    with OpenAIServer(lambda body: (200, "  The tomato is not found yet.\nKeep looking. ")) as server:
        args = _args(root, tmp_path, api="local", base_url=server.url, model="local-llm", num_episodes=1,
                     horizon=4, random_prob=1.0)
        assert reflection.main(args) == 0
        prompts = [request["body"]["messages"][1]["content"] for request in server.requests]
    records = json.loads((tmp_path / "data_reflection.json").read_text())
    assert len(records) == len(prompts) == 4
    # All of an episode's reflections are asked for at once, so the requests come in any order.
    prompts = {prompt[: len(record["state"])]: prompt for record in records for prompt in prompts
               if prompt.startswith(record["state"])}
    for record in records:
        prompt = prompts[record["state"]]
        assert record["reflection"] == "The tomato is not found yet. Keep looking." and record["model"] == "local-llm"
        assert prompt.startswith(record["state"]) and "Your task is to: put" in prompt
        assert f'Spoiler, for you only: the best next command is "{record["command"]}"' in prompt
    # The writer does not change the trajectories: the oracle's run visits the same states.
    oracle = _run(root, tmp_path / "oracle", num_episodes=1, horizon=4, random_prob=1.0)
    assert [(r["state"], r["action"]) for r in oracle] == [(r["state"], r["action"]) for r in records]


def test_api_writer_without_spoiler_as_the_papers_alfworld_writer(root, tmp_path):
    answer = "The best command is to look around first."  # with a spoiler, this would be asked again
    with OpenAIServer(lambda body: (200, answer)) as server:
        args = _args(root, tmp_path, api="local", base_url=server.url, model="local-llm", num_episodes=1,
                     horizon=4, random_prob=1.0, alfworld_spoiler=False)
        assert reflection.main(args) == 0
        prompts = [request["body"]["messages"][1]["content"] for request in server.requests]
    records = json.loads((tmp_path / "data_reflection.json").read_text())
    assert len(records) == len(prompts) == 4 and all(r["reflection"] == answer for r in records)
    for record in records:
        (prompt,) = [p for p in prompts if p.startswith(record["state"] + "\n")]
        assert "Spoiler" not in prompt and record["command"] not in prompt.split(record["state"])[1]
        ask = "Write one sentence" if record["step"] == 0 else "Write at most two sentences"
        assert prompt.split(record["state"] + "\n")[1].startswith(ask)
    assert journal_name(args) != journal_name(_args(root, tmp_path, api="local", model="local-llm", num_episodes=1,
                                                     horizon=4, random_prob=1.0))


def test_auth_failure_stops_with_a_clear_message(root, tmp_path, capsys):
    with OpenAIServer(lambda body: (401, "no")) as server:
        args = _args(root, tmp_path, api="local", base_url=server.url, num_episodes=2)
        assert reflection.main(args) == 1
    assert "authentication failed" in capsys.readouterr().err
    assert not (tmp_path / "data_reflection.json").exists()


# --- SFT texts --------------------------------------------------------------------------


@pytest.mark.parametrize("sft_label, key", [("taken", "taken"), ("oracle", "action")])
def test_gen_sft_texts_match_the_rollout_prompts(expert_run, tmp_path, sft_label, key):
    out, records = expert_run
    args = ScriptArguments(env="alfworld", model_name="tiny-gpt2", task_file=str(out / "data_reflection.json"),
                           output_dir=str(tmp_path), sft_label=sft_label)
    assert gen_sft.main(args) == 0
    lines = {name: [json.loads(x)["text"] for x in (tmp_path / name).read_text().splitlines()]
             for name in ("sft.jsonl", "sft_reflection.jsonl", "sft_policy.jsonl")}
    assert all(len(texts) == len(records) for texts in lines.values())
    for record, plain, reflect, policy in zip(records, *lines.values()):
        assert plain == policy_prompt(record["state"], HEAD) + record[key]
        assert policy == policy_prompt(record["state"], HEAD, record["reflection"]) + record[key]
        prompt = reflection_prompt(record["state"], HEAD, ALFWorldEnv.analyze_instruction)
        assert reflect.startswith(prompt) and completion_start(reflect) == len(prompt)
        assert reflect == prompt + record["reflection"] + "\n"
        assert policy.endswith(ACTION_MARKER + record[key])


def test_gen_sft_missing_input_is_named(tmp_path):
    with pytest.raises(ValueError, match="nothing.json"):
        gen_sft.main(ScriptArguments(env="alfworld", model_name="tiny-gpt2", task_file=str(tmp_path / "nothing.json")))


# --- the real tomato→microwave family ---------------------------------------------------


@pytest.mark.slow
def test_real_family_oracle_run(tmp_path, capsys):
    records = _run(TOMATO, tmp_path, num_episodes=2)
    assert "[alfworld.reflection] episodes: 2," in capsys.readouterr().out
    assert {r["episode"] for r in records} == {0, 1} and len(records) >= 10
    assert not (tmp_path / "alfworld_blocklist.txt").exists()
    for record in records:
        assert record["problem"].startswith(f"train/{FAMILY}-") and record["model"] == "oracle"
        assert f"{record['action']}. {record['command']}\n" in record["state"]
        assert "tomato" in record["reflection"] and record["reflection"].count(".") <= 2


def test_data_folder_untouched(data_before):
    """Runs last: nothing above may have written into the shared data."""
    assert snapshot(DATA) == data_before


def test_api_records_do_not_depend_on_concurrency(root, tmp_path):
    from tests.test_llm_concurrency import fake_reflection

    outputs = []
    for n in (1, 4):
        with OpenAIServer(fake_reflection, delay=0.05) as server:  # long enough that n requests overlap on a loaded machine
            args = _args(root, tmp_path / f"n{n}", api="local", base_url=server.url, model="m", num_episodes=3,
                         horizon=5, max_concurrency=n)
            assert reflection.main(args) == 0
            assert server.max_in_flight == n  # an episode's reflections go out at once
        (journal,) = (tmp_path / f"n{n}" / ".progress").glob("*.jsonl")
        outputs.append(((tmp_path / f"n{n}" / "data_reflection.json").read_bytes(), journal.read_bytes()))
    assert outputs[0] == outputs[1]


@pytest.mark.slow
def test_reflections_from_a_real_server(root, tmp_path, real_llm_server, capsys):
    """SmolLM2-135M behind `transformers serve` writes the reflections of one game: whatever it answers,
    no empty or spoiler-naming reflection is written, and every state is accounted for."""
    args = _args(root, tmp_path, api="local", base_url=real_llm_server.url, model=real_llm_server.model,
                 num_episodes=1, horizon=2, llm_max_tokens=24)
    assert reflection.main(args) == 0
    out = capsys.readouterr().out
    records = json.loads((tmp_path / "data_reflection.json").read_text())
    missing = int(out.split("states without a usable reflection (left out; a re-run asks again): ")[1].split(",")[0]) \
        if "without a usable reflection" in out else 0
    assert len(records) + missing == 2
    for record in records:
        assert record["reflection"].strip() and record["model"] == real_llm_server.model
        assert reflection_problem(record["reflection"], record["command"]) is None
    assert "LLM usage:" in out
