"""evaluation.label_lookup: the policy's half of an episode on its own, teacher-forced (docs/auto_explore.md)."""

import json

import pytest

from evaluation import label_lookup
from experiment_args import parse_args
from prompts import ACTION_MARKER, LABELS
from utils.errors import UsageError


def policy_text(shown: int, right: int) -> str:
    """An AutoExplore-like policy text: a menu of ``shown`` commands under shuffled labels, the ``right``-th taken."""
    labels = LABELS[::-1][:shown]
    menu = "\n".join(f"{label}. cat file_{i}.py" for i, label in enumerate(labels))
    return (f"# Task\nWhich file defines `f`?\n# Files under current working directory\n1. a.py\n # Analyze:\nI will read "
            f"file_{right}.py.\n# Choose from below your command\n{menu}{ACTION_MARKER}{labels[right]}")


def test_the_menu_is_the_last_run_of_labelled_lines():
    text = policy_text(4, 2)
    prompt = text[:text.rindex(ACTION_MARKER) + len(ACTION_MARKER)]
    # "1. a.py" above the menu is a listed file, not a choice: the run of labelled lines ends at the marker
    assert label_lookup.shown_labels(prompt, {label: i for i, label in enumerate(LABELS)}) == list(LABELS[::-1][:4])


def test_a_wrong_pick_is_told_apart_by_what_it_shares_with_the_right_one():
    commands = ["cd ..", "cd utils", "cat a.py", "cat load.py", "cat b.py", "id a.py", "id load.py", "id b.py"]
    right = commands.index("cat load.py")
    kinds = [label_lookup.miss_kind(commands, right, chosen) for chosen in range(len(commands))]
    assert kinds == ["far", "near", "near", None, "near", "near", "same name", "far"]


def test_each_text_is_ranked_and_bucketed_by_the_labels_it_shows(tmp_path, capsys):
    texts = [policy_text(3, 1), policy_text(5, 0), policy_text(12, 7), policy_text(40, 33)]
    task_file = tmp_path / "texts.jsonl"
    task_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts) + "\n")
    args = parse_args(["--model_name=tiny-gpt2", f"--task_file={task_file}", f"--output_dir={tmp_path}",
                       "--per_device_eval_batch_size=3"], prog=label_lookup.PROG)
    assert label_lookup.main(args) == 0
    rows = json.loads((tmp_path / "label_lookup.json").read_text())["rows"]
    assert {name: row["texts"] for name, row in rows.items()} == {"1-10": 2, "11-30": 1, "31+": 1, "all": 4}
    assert rows["1-10"]["uniform"] == pytest.approx((1 / 3 + 1 / 5) / 2)
    assert all(0 <= row["first"] <= 1 and row["nll"] > 0 for row in rows.values())
    # every text's first pick is right or one kind of miss
    assert all(row["first"] + sum(row[kind] for kind in label_lookup.MISSES) == pytest.approx(1) for row in rows.values())
    assert "| 31+ | 1 |" in capsys.readouterr().out


def test_a_text_that_is_not_a_policy_text_is_named(tmp_path):
    text = policy_text(3, 1)
    task_file = tmp_path / "texts.jsonl"
    task_file.write_text(json.dumps({"text": text}) + "\n" + json.dumps({"text": text[:-1] + "zz"}) + "\n")
    args = parse_args(["--model_name=tiny-gpt2", f"--task_file={task_file}"], prog=label_lookup.PROG)
    with pytest.raises(UsageError, match="--task_file: text 2 is not a policy text"):
        label_lookup.main(args)
    task_file.write_text("not json\n")
    with pytest.raises(UsageError, match="--task_file: line 1 of .* is not"):
        label_lookup.main(args)
