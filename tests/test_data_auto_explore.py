"""AutoExplore data pipeline: filtering, oracle and API tasks, trajectories and negatives, splits, SFT texts."""

import json

import pytest

from data_gen.auto_explore import (
    filter_repo,
    filter_task,
    gen_sft,
    gen_task,
    reflection_negative,
)
from data_gen.auto_explore.gen_task import candidate_questions
from data_gen.auto_explore.reflection_negative import question_topic
from data_gen.common import Journal, journal_name
from envs.auto_explore import AutoExploreEnv
from envs.auto_explore_tasks import TASK_FIELDS, optimal_path, task_targets
from prompts import ACTION_MARKER, ANALYZE_MARKER, completion_start, policy_sft_text, reflection_sft_text
from tests.auto_explore_repos import KEPT, SEED, make, write
from tests.openai_server import OpenAIServer
from utils.llm import LLMError


def read_jsonl(path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


def files_under(root) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


# --- filter_repo ---------------------------------------------------------------------------


def test_filter_repo_keeps_exactly_the_informative_files(chain):
    for repo, kept in KEPT.items():
        assert files_under(chain.repos / repo) == kept
    assert not (chain.repos / "alpha" / "notes").exists()  # left empty by the filter
    assert sorted(p.name for p in chain.repos.iterdir()) == ["alpha", "beta"]


def test_filter_repo_rerun_replaces_the_copy(chain, tmp_path, capsys):
    out = tmp_path / "filtered"
    assert filter_repo.main(make(repo_dir=chain.raw, output_dir=out)) == 0
    write(out / "alpha" / "stale.py", "print('from an older run')\n")
    assert filter_repo.main(make(repo_dir=chain.raw, output_dir=out)) == 0
    assert files_under(out / "alpha") == KEPT["alpha"]
    assert sorted(p.name for p in out.iterdir()) == ["alpha", "beta"]  # no temporary folder left behind
    summary = capsys.readouterr().out
    assert "dropped: symlink: 1" in summary and "dropped dir: empty: 1" in summary


# --- gen_task --------------------------------------------------------------------------------


def test_oracle_tasks_schema_and_answers(chain):
    tasks = json.loads((chain.tasks / "data.json").read_text())
    per_repo = [json.loads((chain.tasks / f"{repo}.json").read_text()) for repo in ("alpha", "beta")]
    assert tasks == per_repo[0] + per_repo[1] and len(tasks) >= 10
    for task in tasks:
        assert tuple(task) == TASK_FIELDS
        assert task["answer"] == task["filename"] and task["model"] == "oracle"
        assert task["filename"] in KEPT[task["root"]]
        assert task["n_level"] == task["filename"].count("/") <= 2
        assert task["optimal_path"] == optimal_path(task)
        assert task["question"] in candidate_questions(task["filename"], (chain.repos / task["root"] /
                                                                            task["filename"]).read_text())
    questions = {t["question"] for t in tasks}
    assert not any("shared_name" in q for q in questions)  # two files define it: never asked
    assert {t["n_level"] for t in tasks} == {0, 1, 2}
    per_file = {}
    for task in tasks:
        per_file.setdefault((task["root"], task["filename"]), []).append(task)
    assert all(1 <= len(found) <= 3 for found in per_file.values())


def test_gen_task_with_no_task_at_all_fails(chain, tmp_path, capsys):
    with OpenAIServer(lambda body: (200, "I would rather not.")) as server:
        args = make(api="local", base_url=server.url, model="local-llm", repo_dir=chain.repos, output_dir=tmp_path)
        assert gen_task.main(args) == 1
    assert "no task was written" in capsys.readouterr().err


def test_gen_task_resumes_to_the_same_output(chain, tmp_path, monkeypatch):
    real, calls = gen_task.file_tasks, {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise LLMError("simulated outage")
        return real(*args, **kwargs)

    monkeypatch.setattr(gen_task, "file_tasks", failing)
    args = make(repo_dir=chain.repos, output_dir=tmp_path)
    assert gen_task.main(args) == 1
    assert len(Journal(tmp_path, journal_name("gen_task", "oracle", SEED)).done) == 3
    assert not (tmp_path / "data.json").exists()
    monkeypatch.setattr(gen_task, "file_tasks", real)
    assert gen_task.main(args) == 0
    assert (tmp_path / "data.json").read_text() == (chain.tasks / "data.json").read_text()


# --- filter_task --------------------------------------------------------------------------------


def test_filter_task_drops_and_merges(chain, tmp_path, capsys):
    def task(question, filename, root="alpha"):
        return {"question": question, "answer": "x", "optimal_path": [], "filename": filename, "root": root,
                "n_level": 9, "model": "m"}

    folder = tmp_path / "tasks"
    write(folder / "alpha.json", json.dumps([
        task("Where is the pipeline?", "pkg/core.py"),
        task("  ", "pkg/core.py"),
        task("Where is the loader?", "pkg/io/gone.py"),
        task("Where is the pipeline? ", "contest.py"),
        task("What is in the config?", "config.yaml"),
    ]))
    write(folder / "beta.json", json.dumps([task("Where is the pipeline?", "main.py", root="beta")]))
    write(folder / "data.json", json.dumps([task("not read", "main.py", root="beta")]))
    out = tmp_path / "out"
    assert filter_task.main(make(task_file=folder, repo_dir=chain.repos, output_dir=out)) == 0
    kept = json.loads((out / "data.json").read_text())
    assert [(t["root"], t["question"], t["filename"]) for t in kept] == [
        ("alpha", "Where is the pipeline?", ["contest.py", "pkg/core.py"]),
        ("alpha", "What is in the config?", "config.yaml"),
        ("beta", "Where is the pipeline?", "main.py"),
    ]
    assert kept[0]["optimal_path"] == ["cat contest.py", "id contest.py"] and kept[0]["n_level"] == 0
    assert kept[2]["optimal_path"] == ["cat main.py", "id main.py"]
    summary = capsys.readouterr().out
    assert "dropped: empty question: 1" in summary and "dropped: file missing: 1" in summary
    assert "merged duplicates: 1" in summary


# --- reflection_negative ----------------------------------------------------------------------


def test_positive_trajectories_follow_the_optimal_path(chain):
    records = json.loads((chain.filtered / "data_reflection_negative.json").read_text())
    tasks = json.loads((chain.filtered / "data.json").read_text())
    assert [{k: v for k, v in r.items() if k != "trajectories"} for r in records] == tasks
    for record in records:
        positive = record["trajectories"][0]
        assert positive["info"] == "positive0" and positive["model_name"] == "oracle"
        assert positive["filename"] in task_targets(record["filename"])
        assert [step["cmd"] for step in positive["trajectory"]] == record["optimal_path"]
        assert all(step["reflection"] for step in positive["trajectory"])
        topic = question_topic(record["question"])
        assert all(topic in s["reflection"] for s in positive["trajectory"])


def test_negatives_read_a_wrong_file_then_correct(chain):
    records = json.loads((chain.filtered / "data_reflection_negative.json").read_text())
    levels = set()
    for record in records:
        negatives = record["trajectories"][1:]
        assert len(negatives) <= 2
        folders = [cmd for cmd in record["optimal_path"] if cmd.startswith("cd ")]
        target = task_targets(record["filename"])[0]
        for negative in negatives:
            level = int(negative["info"].removeprefix("negative"))
            levels.add(level)
            steps = negative["trajectory"]
            assert negative["filename"] is None and len(steps) == level + 2
            assert [s["cmd"] for s in steps[:level]] == folders[:level]
            assert all(s["reflection"] is None for s in steps[:-1])
            wrong = steps[-2]["cmd"].removeprefix("cat ")
            folder = "/".join(target.split("/")[:level])
            assert steps[-2]["cmd"].startswith("cat ") and (f"{folder}/{wrong}" if folder else wrong) != target
            expected = folders[level] if level < len(folders) else f"cat {target.split('/')[-1]}"
            assert steps[-1]["cmd"] == expected
            assert steps[-1]["reflection"].startswith(f"I read {wrong}, but it does not answer")
    assert {0, 1} <= levels


def test_negatives_in_the_target_folder_as_the_papers_code(chain, tmp_path):
    args = make(task_file=chain.filtered / "data.json", repo_dir=chain.repos, output_dir=tmp_path,
                negatives_at="target_folder")
    assert reflection_negative.main(args) == 0
    records = json.loads((tmp_path / "data_reflection_negative.json").read_text())
    made = 0
    for record in records:
        folders = [cmd for cmd in record["optimal_path"] if cmd.startswith("cd ")]
        target = task_targets(record["filename"])[0]
        negatives = record["trajectories"][1:]
        assert [n["info"] for n in negatives] == [f"negative{i}" for i in range(len(negatives))]
        wrong = [n["trajectory"][-2]["cmd"] for n in negatives]
        assert len(set(wrong)) == len(wrong) <= 2, "different wrong files"
        for negative in negatives:
            steps = negative["trajectory"]
            assert [s["cmd"] for s in steps[:-2]] == folders, "all the way down to the target's folder"
            assert steps[-2]["cmd"] != f"cat {target.split('/')[-1]}"
            assert steps[-1]["cmd"] == f"cat {target.split('/')[-1]}"
        made += len(negatives)
    assert made > 0
    assert any(len(r["trajectories"]) == 3 for r in records), "two negatives where the folder has two wrong files"
    default = json.loads((chain.filtered / "data_reflection_negative.json").read_text())
    assert [r["trajectories"][0] for r in records] == [r["trajectories"][0] for r in default]


def test_gen_sft_learns_from_failed_positives_only_when_asked(chain, tmp_path, capsys):
    task = {"question": "Which file defines the function `run`?", "answer": "pkg/core.py", "filename": "pkg/core.py",
            "root": "alpha", "n_level": 1, "model": "oracle"}
    task["optimal_path"] = optimal_path(task)
    failed = {"model_name": "gpt-4", "filename": "README.md", "info": "positive0",
              "trajectory": [{"reflection": "The README should say.", "cmd": "cat README.md"},
                             {"reflection": "It does.", "cmd": "id README.md"}]}
    write(tmp_path / "train.json", json.dumps([{**task, "trajectories": [failed]}]))
    for positives, used in (("correct", 0), ("all", 2)):
        out = tmp_path / positives
        assert gen_sft.main(make(task_file=tmp_path / "train.json", repo_dir=chain.repos, output_dir=out,
                                 sft_positives=positives)) == 0
        assert len(read_jsonl(out / "sft_policy_positive.jsonl")) == used
    summary = capsys.readouterr().out
    assert "skipped: no target identified: 1" in summary and "positives used without a target identified: 1" in summary


def test_reflection_negative_resumes_to_the_same_output(chain, tmp_path, monkeypatch):
    real, calls = reflection_negative.task_trajectories, {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise LLMError("simulated outage")
        return real(*args, **kwargs)

    monkeypatch.setattr(reflection_negative, "task_trajectories", failing)
    args = make(task_file=chain.filtered / "data.json", repo_dir=chain.repos, output_dir=tmp_path)
    assert reflection_negative.main(args) == 1
    assert len(Journal(tmp_path, journal_name("reflection_negative", "oracle", SEED, 15)).done) == 2
    monkeypatch.setattr(reflection_negative, "task_trajectories", real)
    assert reflection_negative.main(args) == 0
    assert (tmp_path / "data_reflection_negative.json").read_text() == \
        (chain.filtered / "data_reflection_negative.json").read_text()


# --- split_data ----------------------------------------------------------------------------------


def test_split_proportions(chain):
    records = json.loads((chain.filtered / "data_reflection_negative.json").read_text())
    parts = {name: json.loads((chain.filtered / f"{name}.json").read_text()) for name in ("train", "validate", "test")}
    n = len(records)
    assert [len(parts["train"]), len(parts["validate"])] == [round(0.7 * n), round(0.2 * n)]
    assert sorted(json.dumps(r, sort_keys=True) for part in parts.values() for r in part) == \
        sorted(json.dumps(r, sort_keys=True) for r in records)


# --- gen_sft ---------------------------------------------------------------------------------------


def test_sft_files_hold_the_right_texts(chain):
    train = json.loads((chain.filtered / "train.json").read_text())
    texts = {name: read_jsonl(chain.filtered / name) for name in gen_sft.OUTPUT_FILES}
    positive_steps = sum(len(r["trajectories"][0]["trajectory"]) for r in train)
    negatives = sum(len(r["trajectories"]) - 1 for r in train)
    assert negatives > 0
    assert len(texts["sft_reflection_positive.jsonl"]) == len(texts["sft_policy_positive.jsonl"]) == positive_steps
    for name in ("sft.jsonl", "sft_reflection.jsonl", "sft_policy.jsonl"):
        assert len(texts[name]) == positive_steps + negatives
    for text in texts["sft.jsonl"]:
        assert ANALYZE_MARKER not in text and text.count(ACTION_MARKER) == 1
        assert "# Choose from below your command\n" in text.split(ACTION_MARKER)[0]
    for text in texts["sft_reflection.jsonl"] + texts["sft_reflection_positive.jsonl"]:
        assert ACTION_MARKER not in text and text.count(ANALYZE_MARKER) == 1
        assert "# Choose from below your command" not in text and text.endswith("\n")
    for text in texts["sft_policy.jsonl"] + texts["sft_policy_positive.jsonl"]:
        before, after = text.split(ANALYZE_MARKER)
        assert after.index("# Choose from below your command") < after.index(ACTION_MARKER)
        assert completion_start(text) == len(text) - len(text.split(ACTION_MARKER)[1])
    assert any(t.split(ANALYZE_MARKER)[1].startswith("I read ") for t in texts["sft_reflection.jsonl"])
    assert not any(t.split(ANALYZE_MARKER)[1].startswith("I read ") for t in texts["sft_reflection_positive.jsonl"])


def test_sft_prompt_equals_what_the_env_shows(chain):
    """Replay the first task's trajectories independently: every text is the env's own observation and label."""
    record = json.loads((chain.filtered / "train.json").read_text())[0]
    texts = {name: read_jsonl(chain.filtered / name) for name in ("sft.jsonl", "sft_reflection.jsonl",
                                                                  "sft_policy.jsonl")}
    env = AutoExploreEnv(shuffle_action=True, leaveout_prob=0.0, repos_dir=chain.repos)
    expected = []
    for index, trajectory in enumerate(record["trajectories"]):
        obs, info = env.reset(seed=gen_sft.replay_seed(SEED, record, index), options={"task": record})
        shown = []
        for step in trajectory["trajectory"]:
            label = info["labels"][info["actions"].index(step["cmd"])]
            shown.append((obs, label, step["reflection"]))
            obs, _, _, _, info = env.step(label)
        expected += shown if index == 0 else shown[-1:]
    env.close()
    head = AutoExploreEnv.action_head
    assert texts["sft.jsonl"][:len(expected)] == [policy_sft_text(o, head, label) for o, label, _ in expected]
    assert texts["sft_policy.jsonl"][:len(expected)] == [policy_sft_text(o, head, label, r) for o, label, r in expected]
    assert texts["sft_reflection.jsonl"][:len(expected)] == [reflection_sft_text(o, head, r) for o, _, r in expected]
    # The shuffled labels are not the first ones of the list.
    assert any(not text.endswith(ACTION_MARKER + "0") for text in texts["sft.jsonl"])


def test_gen_sft_needs_trajectories(chain):
    with pytest.raises(ValueError, match="trajectories"):
        gen_sft.main(make(task_file=chain.filtered / "data.json", repo_dir=chain.repos,
                          output_dir=chain.base / "unused"))


# --- collect_repos ---------------------------------------------------------------------------------




def test_gen_sft_for_a_model_with_its_own_alphabet(chain, digit_model):
    """The texts show the model's labels (shuffled from its alphabet); labels.json says which."""
    from prompts import LABEL_FILE, LABELS, label_alphabet, relabel
    from utils import models

    out = chain.base / "digits"
    assert gen_sft.main(make(task_file=chain.filtered / "train.json", repo_dir=chain.repos, shuffle_action=True,
                             model_name=digit_model, output_dir=out)) == 0
    alphabet = label_alphabet(models.load_tokenizer(digit_model))
    assert json.loads((out / LABEL_FILE).read_text())["labels"] == list(alphabet)
    ours, papers = read_jsonl(out / "sft.jsonl"), read_jsonl(chain.filtered / "sft.jsonl")
    assert len(ours) == len(papers) and ours != papers
    for mine, paper in zip(ours, papers):  # the same states, the same picks; only the labels differ
        prompt, label = paper.rsplit(ACTION_MARKER, 1)
        expected = relabel(prompt, AutoExploreEnv.action_head, alphabet) + ACTION_MARKER
        assert mine == expected + alphabet[LABELS.index(label)]
