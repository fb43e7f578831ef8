"""evaluation.evaluate (EVAL_LOAD_LIST / YAML list), the API-model evaluations, and the plot."""

import json

import pytest
import torch
import yaml

from evaluation import auto_explore_gpt, evaluate, evaluate_gpt
from evaluation.configs import load_configs
from evaluation.gpt_agent import ANSWER_RULE, REACT_RULE, REFLECT_RULE, parse_choice
from tests.openai_server import OpenAIServer
from utils import metrics, models
from visualization import plot


def _adapter(make_args, path, seed):
    model, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args()))
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
        load_configs(args, [{"env": "taxi", "loaddir": "x"}])
    with pytest.raises(ValueError, match="is for env 'alfworld'"):
        load_configs(args, [{"env": "alfworld", "load_dir": None}])
    with pytest.raises(ValueError, match="--eval_load_list"):
        load_configs(make_args(env="taxi", eval_load_list=str(tmp_path / "none.yaml")), [])


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


def _taxi_responder(body):
    """A deterministic stand-in for a model: a usable answer, an unusable one or an empty one,
    chosen by the prompt (so the same prompt gets the same answer, whatever the order)."""
    prompt = body["messages"][1]["content"]
    pick = sum(map(ord, prompt)) % 3
    return 200, ["Action: 1", "no idea", ""][pick]


def _gpt_eval(make_args, url, **overrides):
    values = dict(env="taxi", runs=3, api="local", base_url=url, model="local-model", taxi_curriculum=True,
                  curriculum_index=0, horizon=8, gpt_protocol="one_turn")
    values.update(overrides)
    return make_args(**values)


def test_taxi_api_evaluation_counts_and_charges_unusable_answers(make_args, tmp_path, capsys):
    with OpenAIServer(_taxi_responder) as server:
        args = _gpt_eval(make_args, server.url)
        assert evaluate_gpt.main(args) == 0
        prompt = server.requests[0]["body"]["messages"]
        prompts = [json.dumps(request["body"]["messages"]) for request in server.requests]
    out = capsys.readouterr().out
    assert "local:local-model (one turn) on taxi: 3 episodes" in out
    (run_dir,) = (tmp_path / "results").glob("*_evaluate_gpt")
    results = json.loads((run_dir / "results.json").read_text())[0]
    unusable = [json.loads(line) for line in (run_dir / "unusable_answers.jsonl").read_text().splitlines()]
    assert results["unusable_answers"] == len(unusable) >= 1 and results["answers"] >= 3
    assert results["empty_answers"] == sum(not u["answer"] for u in unusable)
    assert f"{len(unusable)} of {results['answers']} answers unusable" in out
    # An unusable answer is a wasted step with a move's cost: no episode is free.
    assert results["levels"]["all"]["cost"] > 0
    # At temperature 0 a prompt is sent once, however often the state repeats after unusable answers.
    assert len(prompts) == len(set(prompts))
    assert prompt[0]["role"] == "system" and "taxi" in prompt[0]["content"]
    assert "Action: 3" in prompt[1]["content"] and "--- Current State ---" in prompt[1]["content"]


def test_api_evaluation_is_the_same_at_every_concurrency(make_args, tmp_path):
    tables = []
    for n in (1, 6):
        with OpenAIServer(_taxi_responder) as server:
            args = _gpt_eval(make_args, server.url, max_concurrency=n, runs=4, ckpt_path=str(tmp_path / f"n{n}"))
            assert evaluate_gpt.main(args) == 0
        (run_dir,) = (tmp_path / f"n{n}").glob("*_evaluate_gpt")
        tables.append([(run_dir / name).read_text() for name in ("results.json", "unusable_answers.jsonl")])
    assert tables[0] == tables[1]


def test_api_evaluation_failure_is_one_line_and_resumes(make_args, tmp_path, capsys):
    sent = {"n": 0}

    def failing_later(body):
        sent["n"] += 1
        return (401, "key revoked") if sent["n"] > 3 else _taxi_responder(body)

    with OpenAIServer(failing_later) as server:
        args = _gpt_eval(make_args, server.url, max_concurrency=1)
        assert evaluate_gpt.main(args) == 1
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "stopped" in line]
    assert server.url in line and "local-model" in line and "key revoked" in line and "LOCAL_API_KEY" in line
    assert not list((tmp_path / "results").glob("*_evaluate_gpt"))  # no empty run folder
    (journal,) = (tmp_path / "results" / ".progress").glob("evaluate_gpt_*.jsonl")
    finished = len(journal.read_text().splitlines())
    assert finished >= 1
    with OpenAIServer(_taxi_responder) as server:  # the server again, at another port
        assert evaluate_gpt.main(_gpt_eval(make_args, server.url, max_concurrency=1)) == 0
        resumed = len(server.requests)
    with OpenAIServer(_taxi_responder) as server:
        assert evaluate_gpt.main(_gpt_eval(make_args, server.url, ckpt_path=str(tmp_path / "fresh"))) == 0
        assert resumed < len(server.requests)  # the finished episodes were not played again
    (first,) = (tmp_path / "results").glob("*_evaluate_gpt")
    (fresh,) = (tmp_path / "fresh").glob("*_evaluate_gpt")
    assert (first / "results.json").read_text() == (fresh / "results.json").read_text()


@pytest.mark.parametrize(("relative_root", "protocol"), [(False, "one_turn"), (True, "two_turn")])
def test_auto_explore_api_evaluation(make_args, tmp_path, capsys, relative_root, protocol):
    repo = tmp_path / "repos" / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "core.py").write_text("def core():\n    return 'the core function'\n")
    (repo / "README.md").write_text("# Repo\nA test repository for the API evaluation.\n")
    # A task names its repository relative to --repo_dir (as the data steps write them), or absolutely.
    task = {"question": "Where is core defined?", "answer": "src/core.py", "filename": "src/core.py",
            "root": "repo" if relative_root else str(repo), "n_level": 1,
            "optimal_path": ["cd src", "cat core.py", "id core.py"]}
    task_file = tmp_path / "test.json"
    task_file.write_text(json.dumps([task]))

    def responder(body):
        """Go down the optimal path: answer with the first of its commands that is listed (after a
        reflection, when asked for one)."""
        asks = [m["content"] for m in body["messages"] if m["role"] == "user"]
        if asks[-1].endswith(REFLECT_RULE):
            return 200, "I should go down towards the file that defines core."
        observation = next(a for a in reversed(asks) if "# Choose from below your command" in a)
        listing = observation.split("# Choose from below your command\n")[1]
        commands = dict(reversed(line.split(". ", 1)) for line in listing.splitlines() if ". " in line)
        for wanted in ("id core.py", "cat core.py", "cd src"):
            if wanted in commands:
                return 200, f"Action: {commands[wanted]}" if wanted != "cd src" else wanted
        return 200, "no idea"

    with OpenAIServer(responder) as server:
        args = make_args(task_file=str(task_file), eval_reps=2, api="local", base_url=server.url,
                         repo_dir=str(tmp_path / "repos") if relative_root else None, gpt_protocol=protocol)
        assert auto_explore_gpt.main(args) == 0
    out = capsys.readouterr().out
    name = "local:gpt-4" + (" (one turn)" if protocol == "one_turn" else "")
    assert "depth 1: success (n)" in out and f"| {name} | 100.0% (2) |" in out


def test_two_turn_protocol_reflects_then_acts_in_one_conversation(make_args, tmp_path):
    def responder(body):
        last = body["messages"][-1]["content"]
        return 200, ("The taxi should find the passenger first." if last.endswith(REFLECT_RULE) else "Action: 1")

    with OpenAIServer(responder) as server:
        args = _gpt_eval(make_args, server.url, runs=1, horizon=3, gpt_protocol="two_turn")
        assert evaluate_gpt.main(args) == 0
        chats = [request["body"]["messages"] for request in server.requests]
    roles = [[m["role"] for m in chat] for chat in chats]
    assert roles[0] == ["system", "user"] and chats[0][1]["content"].endswith(REFLECT_RULE)
    assert roles[1] == ["system", "user", "assistant", "user"] and chats[1][3]["content"] == ANSWER_RULE
    assert chats[1][2]["content"] == "The taxi should find the passenger first."
    # The next step continues the same conversation: the first step's reflection and action are in it.
    assert roles[2] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert chats[2][4]["content"] == "Action: 1" and chats[2][5]["content"].endswith(REFLECT_RULE)


def test_oracle_api_is_refused(make_args):
    with pytest.raises(ValueError, match="--api"):
        evaluate_gpt.main(make_args(env="taxi", api="oracle"))
    with pytest.raises(ValueError, match="--scenario .*evaluated by python -m evaluation.auto_explore_gpt"):
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


def test_a_run_log_cut_short_in_its_last_record_reads_the_records_before(tmp_path, caplog):
    """A run killed while writing a record leaves it without its newline: the records before are read (RL's
    resume carries them into the new run, the plot draws them); a broken record anywhere else is an error."""
    logger = metrics.MetricLogger(tmp_path, tensorboard=False)
    for step in (1, 2):
        logger.log(step, {"loss": 1 / step})
    logger.close()
    log = tmp_path / "metrics.jsonl"
    log.write_text(log.read_text() + '{"step": 3, "lo')
    assert metrics.read_metrics(tmp_path) == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}]
    assert "metrics.jsonl:3: a record cut short" in caplog.text
    log.write_text(log.read_text() + "\n")  # the same record, now ended: not a killed write
    with pytest.raises(ValueError, match=r"metrics.jsonl:3: not a JSON record"):
        metrics.read_metrics(tmp_path)


def test_plot_with_no_run_named_draws_the_newest_rl_run(make_args, tmp_path, capsys):
    results = tmp_path / "results"
    with pytest.raises(ValueError, match="--expdirs: no run named and no rl_finetune run in --ckpt_path"):
        plot.main(make_args())
    for run in ("3_rl_finetune", "12_rl_finetune", "13_evaluate"):
        logger = metrics.MetricLogger(results / run, tensorboard=False)
        for step in range(1, 4):
            logger.log(step, {"success": 0.5, "cost": 1.0, "loss": 1.0})
        logger.close()
    assert plot.main(make_args()) == 0
    assert f"plotting the newest RL run, {results / '12_rl_finetune'}" in capsys.readouterr().out
    assert (results / "curves.png").is_file()


def test_react_protocol_reads_thought_then_action(make_args, tmp_path, capsys):
    with OpenAIServer(lambda body: (200, "Thought: the passenger is north of me.\nAction: 1")) as server:
        args = _gpt_eval(make_args, server.url, runs=1, horizon=3, gpt_protocol="react")
        assert evaluate_gpt.main(args) == 0
        chats = [request["body"]["messages"] for request in server.requests]
    assert chats[0][-1]["content"].endswith(REACT_RULE) and len(chats[1]) == len(chats[0]) + 2
    assert chats[1][2] == {"role": "assistant", "content": "Thought: the passenger is north of me.\nAction: 1"}
    assert "local:local-model (ReAct) on taxi" in capsys.readouterr().out
    (run_dir,) = (tmp_path / "results").glob("*_evaluate_gpt")
    assert json.loads((run_dir / "results.json").read_text())[0]["unusable_answers"] == 0


def test_plot_ensembles_runs_of_one_configuration(tmp_path):
    for name, slope in (("s0", 0.01), ("s1", 0.03)):
        logger = metrics.MetricLogger(tmp_path / name, tensorboard=False)
        for step in range(1, 21 if name == "s0" else 26):  # the second run logged longer
            logger.log(step, {"success": min(1.0, slope * step), "cost": 1 - slope * step})
        logger.close()
    runs = [metrics.read_metrics(tmp_path / name) for name in ("s0", "s1")]
    merged = plot.ensemble(runs)
    assert [r["step"] for r in merged] == list(range(1, 21))  # the steps both logged
    assert merged[9]["success"] == pytest.approx(0.2) and merged[9]["runs"] == 2
    assert (merged[9]["success_min"], merged[9]["success_max"]) == pytest.approx((0.1, 0.3))
    output = plot.plot([f"pg={tmp_path / 's0'},{tmp_path / 's1'}", str(tmp_path / "s0")], tmp_path / "c.png")
    assert output.stat().st_size > 10_000
    log = [json.loads(line) for line in (tmp_path / "c-pg.jsonl").read_text().splitlines()]
    assert log == merged
