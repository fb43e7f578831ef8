"""AutoExplore data pipeline: the steps' pure pieces and flag checks (the chain itself: test_data_auto_explore.py)."""

import json
import time

import pytest

from data_gen.auto_explore import (
    collect_repos,
    filter_repo,
    gen_task,
    split_data,
)
from data_gen.auto_explore.gen_task import candidate_questions, parse_pairs
from data_gen.auto_explore.reflection_negative import parse_answer, question_topic
from envs.sandbox_paths import file_kind, quote_path
from tests.auto_explore_repos import make


def test_filter_repo_flags_are_checked(tmp_path):
    with pytest.raises(ValueError, match="--repo_dir"):
        filter_repo.main(make())
    with pytest.raises(ValueError, match="--output_dir"):
        filter_repo.main(make(repo_dir=tmp_path, output_dir=tmp_path / "inside"))


def test_unreadable_entries_and_paths_too_long_are_dropped_and_counted(awkward_repo, tmp_path, capsys):
    """A file or folder that cannot be read, or a path past PATH_MAX, stopped filter_repo and gen_task with a
    PermissionError or "File name too long" traceback: each is dropped and counted in the summary, as a symlink is."""
    filtered = tmp_path / "filtered"
    assert filter_repo.main(make(repo_dir=awkward_repo.parent, output_dir=filtered)) == 0
    summary = capsys.readouterr().out
    for count in ("dropped dir: path too long: 1", "dropped dir: unreadable: 1", "dropped: unreadable: 1",
                  "files kept: 2"):
        assert count in summary, summary
    kept = {p.relative_to(filtered / "awkward").as_posix() for p in (filtered / "awkward").rglob("*")}
    assert kept == {"README.md", "pkg", "pkg/core.py"}  # no folder of the chain left empty

    assert gen_task.main(make(repo_dir=awkward_repo.parent, output_dir=tmp_path / "tasks")) == 0
    summary = capsys.readouterr().out
    assert "files: 2, " in summary and "skipped: path too long: 1, skipped: unreadable: 2" in summary, summary
    tasks = json.loads((tmp_path / "tasks" / "data.json").read_text())
    assert {task["filename"] for task in tasks} == {"README.md", "pkg/core.py"}


def test_oracle_question_kinds():
    assert candidate_questions("a.py", 'def parse_args():\n    """Parse the command line."""\n') == [
        "Which file defines the function `parse_args`?", "Where is the function that parses the command line?"]
    assert candidate_questions("a.md", "# Title\n## Installation\n```\n# code\n```\n") == [
        "Which document has a section titled 'Title'?", "Which document has a section titled 'Installation'?"]
    assert candidate_questions("t.csv", "city,area,x\nParis,105,1\n") == [
        "Which data file has a column named 'city'?", "Which data file has a column named 'area'?"]
    assert candidate_questions("c.yaml", "name: 1\nsize: 2\n") == ["Which file has the top-level key 'name'?",
                                                                 "Which file has the top-level key 'size'?"]
    assert candidate_questions("s.go", "func StartServer(port int) error {\n}\n") == [
        "Which file defines `StartServer`?"]
    assert candidate_questions("n.txt", "\n") == []


def test_parse_pairs():
    answer = "Sure!\n1. QUERY: What is x?\nANSWER: It is\n  a number.\n**QUERY:** Why?\n**ANSWER:** Because.\nQUERY: lost"
    assert parse_pairs(answer) == [("What is x?", "It is a number."), ("Why?", "Because.")]
    assert parse_pairs("no pairs here") == []


def test_parse_answer():
    labels, actions = ["0", "1", "2"], ["cd pkg", "cat README.md", "id README.md"]
    assert parse_answer("Reflection: Go in.\nCommand: 0", labels, actions) == ("Go in.", "cd pkg")
    assert parse_answer("**Reflection:** Read\nit.\n**Command:** `1. cat README.md`", labels, actions) == (
        "Read it.", "cat README.md")
    assert parse_answer("Reflection: x\nCommand: id README.md", labels, actions) == ("x", "id README.md")
    assert parse_answer("Reflection: x\nCommand: 7", labels, actions) is None
    assert parse_answer("Command: 0", labels, actions) is None


def test_split_keeps_a_question_together():
    tasks = [{"root": "r", "question": f"q{i % 7}", "id": i, "n_level": 0} for i in range(30)]
    splits = split_data.split_tasks(tasks, seed=3)
    assert sum(len(p) for p in splits.values()) == 30
    owner = {}
    for name, part in splits.items():
        for task in part:
            assert owner.setdefault(task["question"], name) == name
    assert split_data.split_tasks(tasks, seed=3) == splits


def test_collected_repos_give_targets_at_depths_0_1_2(tmp_path):
    start = time.monotonic()
    assert collect_repos.main(make(output_dir=tmp_path / "repos")) == 0
    assert filter_repo.main(make(repo_dir=tmp_path / "repos", output_dir=tmp_path / "filtered")) == 0
    depths = {path.relative_to(repo).as_posix().count("/")
              for repo in (tmp_path / "filtered").iterdir() for path in repo.rglob("*")
              if path.is_file() and file_kind(path.name)}
    assert {0, 1, 2} <= depths
    assert len(list((tmp_path / "filtered").iterdir())) >= 3
    assert time.monotonic() - start < 30


def test_question_topic():
    assert question_topic("Which file defines the function `run`?") == "`run`"
    assert question_topic("Which document has a section titled 'Usage'?") == "'Usage'"
    assert question_topic("Where is the function that loads a table?") == "the function that loads a table"
    assert question_topic("How do I  set the level?") == '"How do I set the level"'


def test_split_data_holds_a_repository_out(tmp_path):
    import json

    from data_gen.auto_explore import split_data
    from experiment_args import ScriptArguments

    tasks = [{"question": f"q{i}", "filename": "a.py", "root": repo, "n_level": 0}
             for i, repo in enumerate(["alpha"] * 10 + ["beta"] * 4)]
    task_file = tmp_path / "data.json"
    task_file.write_text(json.dumps(tasks))
    args = ScriptArguments(task_file=str(task_file), holdout_repo="beta", seed=0)
    assert split_data.main(args) == 0
    held = json.loads((tmp_path / "holdout.json").read_text())
    assert len(held) == 4 and {t["root"] for t in held} == {"beta"}
    rest = [t for name in ("train", "validate", "test") for t in json.loads((tmp_path / f"{name}.json").read_text())]
    assert len(rest) == 10 and {t["root"] for t in rest} == {"alpha"}
    with pytest.raises(ValueError, match="--holdout_repo 'gamma'.*alpha, beta"):
        split_data.main(ScriptArguments(task_file=str(task_file), holdout_repo="gamma"))


def test_split_data_refuses_nothing_to_split_and_names_an_empty_split(tmp_path, caplog):
    """An empty task file (or one whose every task is held out) used to give three empty splits, which the
    steps after it refused one by one; a split left empty by a few tasks is said."""
    import json

    from data_gen.auto_explore import split_data
    from experiment_args import ScriptArguments

    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(ValueError, match=f"--task_file: nothing to split in {empty}: it holds no task"):
        split_data.main(ScriptArguments(task_file=str(empty), output_dir=str(tmp_path / "out")))
    assert not (tmp_path / "out" / "train.json").exists()
    one_repo = tmp_path / "one_repo.json"
    one_repo.write_text(json.dumps([{"question": "q", "filename": "a.py", "root": "alpha", "n_level": 0}]))
    with pytest.raises(ValueError, match="every task of it comes from --holdout_repo 'alpha'"):
        split_data.main(ScriptArguments(task_file=str(one_repo), holdout_repo="alpha"))
    with caplog.at_level("WARNING", logger=split_data.__name__):
        assert split_data.main(ScriptArguments(task_file=str(one_repo))) == 0
    assert "1 task(s) leave validate.json and test.json empty (split 0.7:0.2:0.1)" in caplog.text
    assert len(json.loads((tmp_path / "train.json").read_text())) == 1


def test_the_reflectors_advice_is_read_back_from_every_oracle_sentence():
    """advised_command inverts the oracle writer: every template and correction gives its command back."""
    import numpy as np

    from data_gen.auto_explore.reflection_negative import (
        _CORRECTION_PREFIX,
        _CORRECTIONS,
        _TEMPLATES,
        advised_command,
        oracle_correction,
        oracle_reflection,
    )

    commands = {"enter_root": "cd gymnasium", "enter": "cd spaces", "up": "cd ..", "cat": f"cat {quote_path('odd name.py')}",
                "id": "id dict.py"}
    args = {"enter_root": "gymnasium", "enter": "spaces", "up": "..", "cat": "odd name.py", "id": "dict.py"}
    for key, templates in _TEMPLATES.items():
        for template in templates:
            sentence = template.format(topic="`Dict`", arg=args[key], cwd="pkg/sub")
            assert advised_command(sentence) == commands[key], sentence
    for key, template in _CORRECTIONS.items():
        sentence = (_CORRECTION_PREFIX + template).format(wrong="box.py", topic="`Dict`", arg=args[key])
        assert advised_command(sentence) == commands[key], sentence

    class Where:  # what the writers read of the environment
        cwd = "pkg/sub"

    task = {"question": "Which file defines the class `Dict`?"}
    for command in ("cd spaces", "cd ..", "cat dict.py", "id dict.py"):
        assert advised_command(oracle_reflection(task, Where(), command, np.random.default_rng(0))) == command
        assert advised_command(oracle_correction(task, Where(), command, "box.py")) == command
    for other in (None, "", "I will identify it.", "so I will enter", "The answer is box.py."):
        assert advised_command(other) is None
