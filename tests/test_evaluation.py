"""evaluation.evaluate (EVAL_LOAD_LIST / YAML list), the API-model evaluations, and the plot."""

import json

import pytest
import torch
import yaml

import metrics
import models
from evaluation import auto_explore_gpt, evaluate, evaluate_gpt
from evaluation.gpt_agent import parse_choice
from tests.openai_server import OpenAIServer
from visualization import plot


def _adapter(make_args, path, seed):
    model, _ = models.load_model_and_tokenizer(make_args())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    model.save_pretrained(path)
    return str(path)


def test_two_configurations_in_one_run(make_args, tmp_path, capsys):
    configs = [{"env": "taxi", "load_dir": _adapter(make_args, tmp_path / "a", 1), "name": "first"},
               {"env": "taxi", "load_dir": _adapter(make_args, tmp_path / "b", 2), "reflect_load_dir":
                _adapter(make_args, tmp_path / "r", 3), "name": "second"}]
    args = make_args(env="taxi", taxi_curriculum=True, curriculum_index=0, eval_reps=6,
                     per_device_eval_batch_size=4, shrink_head=True, reflect_max_new_tokens=8)
    run = evaluate.run(args, configs)
    out = capsys.readouterr().out
    assert "| first |" in out and "| second |" in out
    assert [r["name"] for r in run.results] == ["first", "second"]
    assert all(r["levels"]["pickup"]["episodes"] == 6 for r in run.results)
    saved = json.loads((run.run_dir / "results.json").read_text())
    assert saved == run.results and "| second |" in (run.run_dir / "results.md").read_text()


def test_yaml_list_and_cli_fallback(make_args, tmp_path, capsys):
    listing = tmp_path / "list.yaml"
    listing.write_text(yaml.safe_dump([{"env": "taxi", "load_dir": _adapter(make_args, tmp_path / "a", 1),
                                        "name": "from yaml"}]))
    args = make_args(env="taxi", eval_reps=2, per_device_eval_batch_size=6, eval_load_list=str(listing))
    assert evaluate.main(args) == 0
    out = capsys.readouterr().out
    assert "| from yaml |" in out and "pickup" in out and "dropoff" in out and "full" in out
    args = make_args(env="taxi", eval_reps=2, per_device_eval_batch_size=6, load_dir=str(tmp_path / "a"),
                     taxi_curriculum=True, curriculum_index=2)
    evaluate.main(args)
    assert f"| {tmp_path / 'a'} |" in capsys.readouterr().out


def test_bad_configurations_are_named(make_args, tmp_path):
    args = make_args(env="taxi")
    with pytest.raises(ValueError, match="unknown keys"):
        evaluate.load_configs(args, [{"env": "taxi", "loaddir": "x"}])
    with pytest.raises(ValueError, match="is for env 'alfworld'"):
        evaluate.load_configs(args, [{"env": "alfworld", "load_dir": None}])
    with pytest.raises(ValueError, match="--eval_load_list"):
        evaluate.load_configs(make_args(env="taxi", eval_load_list=str(tmp_path / "none.yaml")), [])


def test_same_episodes_for_every_configuration(make_args, tmp_path):
    same = {"env": "taxi", "load_dir": _adapter(make_args, tmp_path / "a", 1)}
    args = make_args(env="taxi", taxi_curriculum=True, curriculum_index=1, eval_reps=5, per_device_eval_batch_size=3)
    results = evaluate.run(args, [dict(same, name="x"), dict(same, name="y")]).results
    assert results[0]["levels"] == results[1]["levels"]


@pytest.mark.parametrize("answer, expected", [
    ("3", "3"), ("3.", "3"), ("Action 3", "3"), ("Action: 3", "3"), ("action:3", "3"), ("c", "c"), ("(c)", "c"),
    ("The answer is c.", "c"), ("I pick option 2, then 4.\nAction: 4", "4"), ("Move north", "1"),
    ("`0`", "0"), ("I would Pickup passenger", "4"), ("hello there", None), ("", None), ("9", None),
    ("Action: 12", None),
])
def test_parse_choice(answer, expected):
    labels = ["0", "1", "2", "3", "4", "c"]
    actions = ["Move south", "Move north", "Move east", "Move west", "Pickup passenger", "cd docs"]
    assert parse_choice(answer, labels, actions) == expected


def test_taxi_api_evaluation_counts_unusable_answers(make_args, capsys):
    replies = iter(["Action: 1", "no idea", "2."] * 200)
    with OpenAIServer(lambda body: (200, next(replies))) as server:
        args = make_args(env="taxi", runs=3, api="local", base_url=server.url, model="local-model",
                         taxi_curriculum=True, curriculum_index=0)
        assert evaluate_gpt.main(args) == 0
        prompt = server.requests[0]["body"]["messages"]
    out = capsys.readouterr().out
    assert "local:local-model on taxi: 3 episodes" in out and "unusable" in out
    answers, unusable = _counts(out)
    assert unusable >= 1 and answers >= 3
    assert prompt[0]["role"] == "system" and "taxi" in prompt[0]["content"]
    assert "Action: 3" in prompt[1]["content"] and "--- Current State ---" in prompt[1]["content"]


def _counts(out: str) -> tuple[int, int]:
    fragment = out.split("episodes, ")[1].split(" answers")[0]  # "U of A"
    unusable, answers = fragment.split(" of ")
    return int(answers), int(unusable)


def test_auto_explore_api_evaluation(make_args, tmp_path, capsys):
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "core.py").write_text("def core():\n    return 'the core function'\n")
    (repo / "README.md").write_text("# Repo\nA test repository for the API evaluation.\n")
    task = {"question": "Where is core defined?", "answer": "src/core.py", "filename": "src/core.py",
            "root": str(repo), "n_level": 1, "optimal_path": ["cd src", "cat core.py", "id core.py"]}
    task_file = tmp_path / "test.json"
    task_file.write_text(json.dumps([task]))
    script = iter(["cd src", "Action: 1", "id core.py"] * 10)

    def responder(body):
        text = next(script)
        listing = body["messages"][1]["content"].split("# Choose from below your command\n")[1]
        for line in listing.splitlines():
            label, _, command = line.partition(". ")
            if command == text:
                return 200, f"Action: {label}"
        return 200, text

    with OpenAIServer(responder) as server:
        args = make_args(task_file=str(task_file), eval_reps=2, api="local", base_url=server.url)
        assert auto_explore_gpt.main(args) == 0
    out = capsys.readouterr().out
    assert "depth 1: success (n)" in out and "| local:gpt-4 | 100.0% (2) |" in out


def test_oracle_api_is_refused(make_args):
    with pytest.raises(ValueError, match="--api"):
        evaluate_gpt.main(make_args(env="taxi", api="oracle"))
    with pytest.raises(ValueError, match="--scenario"):
        evaluate_gpt.main(make_args(env="auto_explore", api="local"))


def test_plot_overlays_runs(tmp_path):
    for name, slope in (("a", 0.01), ("b", 0.02)):
        logger = metrics.MetricLogger(tmp_path / name, tensorboard=False)
        for step in range(1, 31):
            logger.log(step, {"success": min(1.0, slope * step), "cost": 1 - slope * step, "loss": 1 / step})
        logger.close()
    output = plot.plot([f"first={tmp_path / 'a'}", str(tmp_path / "b")], tmp_path / "curves.png", window=5)
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and output.stat().st_size > 10_000
    with pytest.raises(ValueError, match="--expdirs"):
        plot.plot([], tmp_path / "none.png")
    assert list(plot.moving_average([1, 2, 3, 4], 2)) == [1.0, 1.5, 2.5, 3.5]
