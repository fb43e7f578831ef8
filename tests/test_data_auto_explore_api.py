"""AutoExplore data pipeline with an API writer (a local OpenAI-compatible test server): tasks,
reflections and unusable answers, and outputs that do not depend on concurrency."""

import json
import re

import pytest

from data_gen.auto_explore import gen_task, reflection_negative
from envs.auto_explore_tasks import optimal_path
from tests.auto_explore_repos import KEPT, make, write
from tests.openai_server import OpenAIServer


def test_api_tasks_keep_good_files_and_count_the_malformed(chain, tmp_path, capsys):
    def responder(body):
        prompt = body["messages"][1]["content"]
        if "contest.py" in prompt:
            return 200, "I would rather not."
        return 200, "QUERY: What does this part do?\nANSWER: It helps alpha."

    with OpenAIServer(responder) as server:
        args = make(api="local", base_url=server.url, model="local-llm", repo_dir=chain.repos, output_dir=tmp_path)
        assert gen_task.main(args) == 0
        asked = len(server.requests)
        prompts = [r["body"]["messages"][1]["content"] for r in server.requests]
        assert gen_task.main(args) == 0  # journaled: only the malformed file is asked again
        assert len(server.requests) == asked + gen_task.API_ATTEMPTS
    shallow = {(repo, f) for repo, kept in KEPT.items() for f in kept if f.count("/") <= 2}
    assert asked == len(shallow) - 1 + gen_task.API_ATTEMPTS  # the malformed file was asked twice
    tasks = json.loads((tmp_path / "data.json").read_text())
    assert {(t["root"], t["filename"]) for t in tasks} == shallow - {("alpha", "contest.py")}
    assert all(t["answer"] == "It helps alpha." and t["model"] == "local-llm" for t in tasks)
    assert "malformed answers: 1" in capsys.readouterr().out
    assert any("data file" in p and "values.csv" in p for p in prompts)
    assert any("code file" in p and "core.py" in p for p in prompts)


@pytest.mark.parametrize("answer", ["Question: What does this part do?\nAnswer: It helps alpha.",
                                    "1. **Q:** What does this part do?\n   **A:** It helps alpha."])
def test_api_tasks_read_question_answer_pairs_too(answer):
    assert gen_task.parse_pairs(answer) == [("What does this part do?", "It helps alpha.")]


def _api_agent(body):
    """Walk to alpha's pkg/core.py, answering in the format the API writer asks for."""
    prompt = body["messages"][1]["content"]
    listing = prompt.split("# Choose from below your command\n", 1)[1]
    choices = dict(re.findall(r"^(\S+)\. (.+)$", listing, re.M))
    by_command = {command: label for label, command in choices.items()}
    history = prompt.split("# Command history\n", 1)[1].split("# Execution result", 1)[0]
    wanted = ["id core.py"] if "cat core.py" in history else ["cat core.py", "cd pkg"]
    command = next(c for c in wanted if c in by_command)
    return 200, f"Reflection: I look for the pipeline, so `{command}` next.\nCommand: {by_command[command]}"


def test_api_reflections_and_unusable_answers(chain, tmp_path, capsys):
    task = {"question": "Which file defines the function `run`?", "answer": "pkg/core.py", "optimal_path": [],
            "filename": "pkg/core.py", "root": "alpha", "n_level": 1, "model": "oracle"}
    task["optimal_path"] = optimal_path(task)
    write(tmp_path / "good" / "data.json", json.dumps([task]))
    with OpenAIServer(_api_agent) as server:
        args = make(api="local", base_url=server.url, model="local-llm", task_file=tmp_path / "good" / "data.json",
                    repo_dir=chain.repos)
        assert reflection_negative.main(args) == 0
        assert "For you only" in server.requests[0]["body"]["messages"][1]["content"]
    (record,) = json.loads((tmp_path / "good" / "data_reflection_negative.json").read_text())
    positive, *negatives = record["trajectories"]
    assert positive["filename"] == "pkg/core.py" and positive["model_name"] == "local-llm"
    assert [s["cmd"] for s in positive["trajectory"]] == ["cd pkg", "cat core.py", "id core.py"]
    assert positive["trajectory"][0]["reflection"] == "I look for the pipeline, so `cd pkg` next."
    assert len(negatives) == 2 and [n["trajectory"][-1]["cmd"] for n in negatives] == ["cd pkg", "cat core.py"]

    write(tmp_path / "bad" / "data.json", json.dumps([task]))
    with OpenAIServer(lambda body: (200, "I am not sure what to do.")) as server:
        args = make(api="local", base_url=server.url, model="local-llm", task_file=tmp_path / "bad" / "data.json",
                    repo_dir=chain.repos)
        assert reflection_negative.main(args) == 0
    (record,) = json.loads((tmp_path / "bad" / "data_reflection_negative.json").read_text())
    assert record["trajectories"] == [{"model_name": "local-llm", "trajectory": [], "filename": None,
                                       "info": "positive0"}]
    summary = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"[{reflection_negative.STEP}]")]
    assert "unusable answers: 3" in summary[-1] and " positives:" not in summary[-1]  # an empty one is no positive
    assert "empty positives (no usable answer; a re-run asks again): 1" in summary[-1]
    assert len(server.requests) == 3 * reflection_negative.API_ATTEMPTS


def _writer(body):
    """A deterministic API writer for both steps: a pair for a task prompt, the optimal command
    (by the spoiler) for a trajectory step; the answer depends only on the prompt."""
    prompt = body["messages"][1]["content"]
    if "QUERY:" in prompt:
        return 200, f"QUERY: What is in part {len(prompt) % 97}?\nANSWER: It helps."
    return _api_agent(body)


def test_api_steps_do_not_depend_on_concurrency(chain, tmp_path):
    task = {"question": "Which file defines the function `run`?", "answer": "pkg/core.py", "optimal_path": [],
            "filename": "pkg/core.py", "root": "alpha", "n_level": 1, "model": "oracle"}
    task["optimal_path"] = optimal_path(task)
    outputs = []
    for n in (1, 5):
        out = tmp_path / f"n{n}"
        write(out / "traj" / "data.json", json.dumps([task, dict(task, question="Where is `run`?")]))
        with OpenAIServer(_writer, delay=0.05) as server:  # long enough that n requests overlap on a loaded machine
            common = dict(api="local", base_url=server.url, model="local-llm", repo_dir=chain.repos, max_concurrency=n)
            assert gen_task.main(make(output_dir=out / "tasks", **common)) == 0
            assert reflection_negative.main(make(task_file=out / "traj" / "data.json", **common)) == 0
            assert server.max_in_flight == n
        outputs.append([(out / name).read_bytes() for name in
                        ("tasks/data.json", "traj/data_reflection_negative.json")])
    assert outputs[0] == outputs[1]
