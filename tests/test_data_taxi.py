"""DangerousTaxi pipeline: oracle reflections, resume, API backend, SFT texts."""

import json

import pytest

from data_gen.common import Journal, item_rng
from data_gen.taxi import gen_sft, reflection
from envs import make_env
from envs.base import rng_seed
from prompts import ACTION_MARKER, ANALYZE_MARKER, completion_start, policy_prompt, reflection_prompt
from tests.openai_server import OpenAIServer
from utils.llm import LLMError


@pytest.fixture
def make_args(make_args):
    """This pipeline's steps are Taxi's: --env=taxi, as their parsers default it."""
    return lambda **overrides: make_args(**{"env": "taxi", **overrides})

def _run(make_args, out, **kw):
    args = make_args(**{"api": "oracle", "num_episodes": 6, "output_dir": str(out), **kw})
    assert reflection.main(args) == 0
    return json.loads((out / "data_reflection.json").read_text())


def test_oracle_reflections_describe_the_state_and_label_the_best_action(make_args, tmp_path):
    records = _run(make_args, tmp_path)
    assert len(records) >= 6 and all(r["model"] == "oracle" for r in records)
    env = make_env("taxi")
    for record in records:
        assert record["action"] in "012345" and record["command"] in record["state"]
        assert record["reflection"].count(".") <= 3 and "row" in record["reflection"]
        assert f"{record['action']}. {record['command']}" in record["state"]
    first = records[0]
    # Replaying the episode's seed gives the same first observation and oracle label.
    obs, info = env.reset(seed=rng_seed(item_rng(make_args().seed, "taxi", 0)))
    assert obs == first["state"] and info["oracle_label"] == first["action"]


def test_random_prob_zero_follows_the_oracle_to_success(make_args, tmp_path):
    records = _run(make_args, tmp_path, random_prob=0.0)
    by_episode = {}
    for record in records:
        by_episode.setdefault(record["episode"], []).append(record)
    assert len(by_episode) == 6
    for episode in by_episode.values():
        assert [r["step"] for r in episode] == list(range(len(episode)))
        assert "First move" in episode[0]["reflection"]
        assert all("Last move was good" in r["reflection"] for r in episode[1:])


def test_interrupted_run_resumes_to_the_same_output(make_args, tmp_path, monkeypatch):
    whole = _run(make_args, tmp_path / "whole")
    calls = {"n": 0}
    real = reflection.episode

    def failing(args, client, index):
        calls["n"] += 1
        if calls["n"] == 4:
            raise LLMError("simulated outage")
        return real(args, client, index)

    monkeypatch.setattr(reflection, "episode", failing)
    args = make_args(api="oracle", num_episodes=6, output_dir=str(tmp_path / "part"))
    assert reflection.main(args) == 1
    journal = Journal(tmp_path / "part", reflection.journal_name(args))
    assert len(journal.done) == 3
    monkeypatch.setattr(reflection, "episode", real)
    assert _run(make_args, tmp_path / "part") == whole


def test_api_backend_writes_the_model_answer(make_args, tmp_path):
    with OpenAIServer(lambda body: (200, "  The taxi is near.\nHead for P. ")) as server:
        args = make_args(api="local", base_url=server.url, model="local-llm", num_episodes=2,
                         output_dir=str(tmp_path), random_prob=1.0)
        assert reflection.main(args) == 0
        prompt = server.requests[0]["body"]["messages"][1]["content"]
    records = json.loads((tmp_path / "data_reflection.json").read_text())
    assert all(r["reflection"] == "The taxi is near. Head for P." and r["model"] == "local-llm" for r in records)
    assert "Spoiler" in prompt and "--- Current State ---" in prompt


def test_api_writer_is_asked_as_the_paper_asks(make_args, tmp_path):
    """One sentence at the first step, two later, the best next action as a spoiler and, after the first
    step, whether the move just taken was the best one then."""
    with OpenAIServer(lambda body: (200, "The taxi heads for the passenger.")) as server:
        args = make_args(api="local", base_url=server.url, model="local-llm", num_episodes=1, horizon=8,
                         output_dir=str(tmp_path), random_prob=0.5, seed=5)
        assert reflection.main(args) == 0
        prompts = [request["body"]["messages"][1]["content"] for request in server.requests]
    records = json.loads((tmp_path / "data_reflection.json").read_text())
    assert len(prompts) == len(records) >= 3
    commands = [[line.split(". ", 1)[1] for line in r["state"].split("now is:\n")[1].splitlines() if ". " in line]
                for r in records]
    for number, record in enumerate(records):  # the requests were sent side by side: found by their state
        (prompt,) = [p for p in prompts if p.startswith(record["state"] + "\n")]
        assert f'the best next action is "{record["command"]}"' in prompt
        if number == 0:
            assert "Write one sentence" in prompt and "The last move" not in prompt
            continue
        before = records[number - 1]
        taken = commands[number - 1][int(before["taken"])]
        good = before["taken"] == before["action"]
        assert "Write at most two sentences" in prompt
        assert (f'The last move, "{taken}", was the best one then.' in prompt) == good
        assert (f'The last move, "{taken}", was not the best one then ("{before["command"]}" was).' in prompt) \
            == (not good)
    assert any(r["taken"] != r["action"] for r in records[:-1]) and any(r["taken"] == r["action"] for r in records[:-1])


def test_auth_failure_stops_with_a_clear_message(make_args, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "bad")
    with OpenAIServer(lambda body: (401, "no")) as server:
        args = make_args(api="local", base_url=server.url, num_episodes=2, output_dir=str(tmp_path))
        assert reflection.main(args) == 1
    assert "authentication failed" in capsys.readouterr().err
    assert not (tmp_path / "data_reflection.json").exists()


@pytest.mark.parametrize("sft_label, key", [("taken", "taken"), ("oracle", "action")])
def test_gen_sft_texts_match_the_rollout_prompts(make_args, tmp_path, sft_label, key):
    records = _run(make_args, tmp_path)
    assert gen_sft.main(make_args(task_file=str(tmp_path / "data_reflection.json"), sft_label=sft_label)) == 0
    lines = {name: [json.loads(x)["text"] for x in (tmp_path / name).read_text().splitlines()]
             for name in ("sft.jsonl", "sft_reflection.jsonl", "sft_policy.jsonl")}
    assert all(len(texts) == len(records) for texts in lines.values())
    env = make_env("taxi")
    for record, plain, reflect, policy in zip(records, *lines.values()):
        head = env.action_head
        assert plain == policy_prompt(record["state"], head) + record[key]
        assert policy == policy_prompt(record["state"], head, record["reflection"]) + record[key]
        prompt = reflection_prompt(record["state"], head, env.analyze_instruction)
        assert reflect.startswith(prompt) and completion_start(reflect) == len(prompt)
        assert policy.count(ANALYZE_MARKER) == 1 and policy.endswith(ACTION_MARKER + record[key])


def test_records_keep_the_taken_and_the_oracle_label(make_args, tmp_path):
    """"Oracle + random 0.9": mostly random moves are taken; the taken label is the one played next."""
    records = _run(make_args, tmp_path, num_episodes=20)
    assert all(r["taken"] in "012345" for r in records)
    agree = sum(r["taken"] == r["action"] for r in records) / len(records)
    assert 0.05 < agree < 0.5  # 0.1 + 0.9 / 6 ≈ 0.25 in expectation
    assert all(_run(make_args, tmp_path / "greedy", random_prob=0.0)[i]["taken"] ==
               _run(make_args, tmp_path / "greedy", random_prob=0.0)[i]["action"] for i in range(3))


def test_gen_sft_refuses_records_without_the_asked_label(make_args, tmp_path):
    (tmp_path / "old.json").write_text(json.dumps([{"state": "s", "reflection": "r", "action": "0"}]))
    with pytest.raises(ValueError, match="--sft_label taken: record 0 .* has no 'taken' field"):
        gen_sft.main(make_args(task_file=str(tmp_path / "old.json")))


def test_gen_sft_missing_input_is_named(make_args, tmp_path):
    with pytest.raises(ValueError, match="nothing.json"):
        gen_sft.main(make_args(task_file=str(tmp_path / "nothing.json")))


def test_sft_prompts_equal_what_the_rollout_shows(make_args, tmp_path):
    """The policy sees at RL time exactly the prompt it was fine-tuned on, for the same state."""
    import numpy as np

    from rollout import Decision, EpisodeStart, TwoPlayerRollout
    from utils import models

    records = _run(make_args, tmp_path, num_episodes=1)
    assert gen_sft.main(make_args(task_file=str(tmp_path / "data_reflection.json"))) == 0
    plain = json.loads((tmp_path / "sft.jsonl").read_text().splitlines()[0])["text"]
    policy_text = json.loads((tmp_path / "sft_policy.jsonl").read_text().splitlines()[0])["text"]
    first = records[0]
    seed = rng_seed(item_rng(make_args().seed, "taxi", 0))
    policy, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args()), shrink_head=True)
    env = make_env("taxi")

    episode = TwoPlayerRollout(policy, tokenizer).run([env], [EpisodeStart(seed, {})], np.random.default_rng(0))[0]
    assert episode.decisions[0].prompt == plain[: -len(first["taken"])]

    # With reflection: the rollout reuses the recorded reflection at step 0 (as a REFUEL branch does).
    recorded = Decision(obs=first["state"], prompt="", valid=[], action=0, logprob=0.0, entropy=0.0,
                        reflection=first["reflection"])
    reflector, reflect_tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args()),
                                                                   trainable=False)
    rollout = TwoPlayerRollout(policy, tokenizer, reflector=reflector, reflect_tokenizer=reflect_tokenizer)
    episode = rollout.run([env], [EpisodeStart(seed, {}, replay=[recorded])], np.random.default_rng(0))[0]
    assert episode.decisions[0].prompt == policy_text[: -len(first["taken"])]


def test_a_change_of_settings_starts_a_fresh_journal(make_args):
    base = reflection.journal_name(make_args(api="oracle"))
    assert base == reflection.journal_name(make_args(api="oracle"))
    for change in ({"horizon": 10}, {"random_prob": 0.5}, {"shuffle_action": True}, {"seed": 1},
                   {"env": "taxi", "taxi_curriculum": True, "curriculum_index": 0}):
        assert reflection.journal_name(make_args(api="oracle", **change)) != base, change


def test_a_missing_api_key_stops_the_step_with_one_line(make_args, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert reflection.main(make_args(api="openai", num_episodes=2, output_dir=str(tmp_path))) == 1
    assert "[taxi.reflection] stopped: --api=openai needs the environment variable OPENAI_API_KEY" in \
        capsys.readouterr().err
    assert not (tmp_path / "data_reflection.json").exists()


def test_advised_command_reads_back_every_oracle_reflection(make_args, tmp_path):
    records = _run(make_args, tmp_path, num_episodes=10)
    assert all(reflection.advised_command(r["reflection"]) == r["command"] for r in records)
    assert reflection.advised_command(None) is None and reflection.advised_command("no advice here") is None
