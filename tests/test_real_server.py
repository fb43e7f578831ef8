"""The LLM steps against a real OpenAI-compatible server: `transformers serve` running SmolLM2-135M-Instruct
on the CPU (tests/real_llm_server.py; the ALFWorld step's test is in test_data_alfworld.py). A small model
answers badly; the steps must say so and go on, never crash, never write an empty or spoiler-naming
reflection, and never map an unusable answer to an action."""

import json

import pytest

from data_gen.common import reflection_problem
from data_gen.taxi import reflection
from evaluation import evaluate_gpt

pytestmark = pytest.mark.slow


def _counted(out: str, name: str) -> int:
    return int(out.split(f"{name}: ")[1].split(",")[0]) if f"{name}: " in out else 0


def test_taxi_reflections(make_args, real_llm_server, tmp_path, capsys):
    args = make_args(env="taxi", api="local", base_url=real_llm_server.url, model=real_llm_server.model,
                     num_episodes=3, horizon=2, llm_max_tokens=24, taxi_curriculum=True, curriculum_index=0,
                     output_dir=str(tmp_path))
    assert reflection.main(args) == 0
    out = capsys.readouterr().out
    records = json.loads((tmp_path / "data_reflection.json").read_text())
    missing = _counted(out, "states without a usable reflection (left out; a re-run asks again)")
    assert len(records) + missing == _counted(out, "states") + missing >= 3
    for record in records:
        assert record["reflection"].strip() and record["model"] == real_llm_server.model
        assert reflection_problem(record["reflection"], record["command"]) is None
    assert "LLM usage:" in out


def test_taxi_api_model_evaluation(make_args, real_llm_server, tmp_path, capsys):
    # One turn per step keeps this test short on a server that generates one answer at a time; the
    # two-turn protocol is tested against the scripted server (test_evaluation.py).
    args = make_args(env="taxi", runs=3, api="local", base_url=real_llm_server.url, model=real_llm_server.model,
                     taxi_curriculum=True, curriculum_index=0, horizon=3, llm_max_tokens=8, gpt_protocol="one_turn")
    assert evaluate_gpt.main(args) == 0
    out = capsys.readouterr().out
    (run_dir,) = (tmp_path / "results").glob("*_evaluate_gpt")
    result = json.loads((run_dir / "results.json").read_text())[0]
    assert result["levels"]["all"]["episodes"] == 3
    unusable = (run_dir / "unusable_answers.jsonl").read_text().splitlines()
    assert result["unusable_answers"] == len(unusable) <= result["answers"]
    assert f"{len(unusable)} of {result['answers']} answers unusable" in out
    # Every unusable answer was a wasted step: an agent that never answers usably still pays.
    assert result["levels"]["all"]["cost"] > 0 or not unusable


def test_a_model_the_server_does_not_have_is_one_line(make_args, real_llm_server, tmp_path, capsys):
    args = make_args(env="taxi", api="local", base_url=real_llm_server.url, model="gpt-4o", num_episodes=2,
                     output_dir=str(tmp_path))
    assert reflection.main(args) == 1
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "stopped" in line]
    assert real_llm_server.url in line and "'gpt-4o'" in line and "pinned" in line
