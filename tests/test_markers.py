"""runner/markers.py: a stage's seconds count the work of the attempts cut short that its finish continues, and
nothing of their time lost after it (a seed spanning sessions reports what its stages cost)."""

import json
import os

import pytest

from runner import markers
from utils import complete

KEY = {"command": ["stand-in"]}


class Killed(Exception):
    pass


def _started(logs):
    return json.loads((logs / f"stage{markers.STARTED}").read_text())


def _began_at(logs, when):
    """Set the started marker's attempt time to ``when`` (an attempt that began then)."""
    started = _started(logs)
    started["attempt"] = when
    (logs / f"stage{markers.STARTED}").write_text(json.dumps(started))


def _done(logs):
    return json.loads((logs / f"stage{markers.DONE}").read_text())


def _kill(write=None):
    def work(resume):
        if write is not None:
            write()
        raise Killed
    return work


def test_a_fresh_stage_carries_nothing(tmp_path):
    logs = tmp_path / "logs"
    seconds = markers.once(logs, "stage", KEY, lambda resume: None, folder=tmp_path / "out")
    assert "carried" not in _done(logs) and seconds == pytest.approx(_done(logs)["seconds"])
    assert seconds < 60


def test_a_journal_continued_counts_the_earlier_attempts_work_up_to_its_last_write(tmp_path):
    logs, out = tmp_path / "logs", tmp_path / "out"
    journal = out / "journal.jsonl"

    def write():
        out.mkdir(parents=True, exist_ok=True)
        journal.write_text("{}\n")

    with pytest.raises(Killed):
        markers.once(logs, "stage", KEY, _kill(write), folder=out)
    start = _started(logs)["attempt"]
    _began_at(logs, start - 1000)  # it began 1000 s ago ...
    os.utime(journal, (start - 400, start - 400))  # ... and wrote its journal last 600 s later, then was lost
    with pytest.raises(Killed):  # a second attempt that writes nothing more keeps what the first left, no more
        markers.once(logs, "stage", KEY, _kill(), folder=out)
    assert _started(logs)["carried"] == pytest.approx(600)
    seen = []
    seconds = markers.once(logs, "stage", KEY, seen.append, folder=out)
    assert seen == [None] and journal.is_file()  # not resumable: the journal goes on
    assert _done(logs)["carried"] == pytest.approx(600)
    assert 600 <= seconds < 660 and seconds == pytest.approx(_done(logs)["seconds"])
    assert markers.once(logs, "stage", KEY, seen.append, folder=out) == pytest.approx(seconds)  # kept: read back


def test_a_checkpoint_resumed_counts_each_attempt_up_to_the_checkpoint_it_left(tmp_path):
    logs, out = tmp_path / "logs", tmp_path / "out"
    run = out / "1_supervised_pretrain"

    def save(step):
        def write():
            checkpoint = run / f"checkpoint-{step}"
            checkpoint.mkdir(parents=True)
            (checkpoint / "adapter.bin").write_bytes(b"w")
            complete.mark(checkpoint)
        return write

    with pytest.raises(Killed):
        markers.once(logs, "stage", KEY, _kill(save(50)), folder=out, resumable=True)
    first = _started(logs)["attempt"]
    _began_at(logs, first - 3000)
    for path in (run / "checkpoint-50").iterdir():
        os.utime(path, (first - 1000, first - 1000))  # 2000 s of work kept; its last 1000 s are lost
    with pytest.raises(Killed):
        markers.once(logs, "stage", KEY, _kill(save(100)), folder=out, resumable=True)
    second = _started(logs)
    assert second["carried"] == pytest.approx(2000)
    _began_at(logs, second["attempt"] - 500)
    for path in (run / "checkpoint-100").iterdir():
        os.utime(path, (second["attempt"] - 200, second["attempt"] - 200))  # 300 s more kept
    resumed = []
    seconds = markers.once(logs, "stage", KEY, resumed.append, folder=out, resumable=True)
    assert resumed == [run / "checkpoint-100"]
    assert _done(logs)["carried"] == pytest.approx(2300) and 2300 <= seconds < 2360


def test_a_changed_key_starts_afresh_and_carries_nothing(tmp_path):
    logs, out = tmp_path / "logs", tmp_path / "out"

    def write():
        out.mkdir(parents=True, exist_ok=True)
        (out / "journal.jsonl").write_text("{}\n")

    with pytest.raises(Killed):
        markers.once(logs, "stage", KEY, _kill(write), folder=out)
    _began_at(logs, _started(logs)["attempt"] - 1000)
    seconds = markers.once(logs, "stage", {"command": ["other"]}, lambda resume: None, folder=out)
    assert not out.exists() and "carried" not in _done(logs) and seconds < 60
    # what the run of the other key left is set aside with its started marker, not deleted
    aside = tmp_path / markers.SUPERSEDED
    assert (aside / "out" / "journal.jsonl").read_text() == "{}\n"
    assert json.loads((aside / "logs" / f"stage{markers.STARTED}").read_text())["key"] == KEY


def test_a_finished_run_of_another_key_is_set_aside_and_the_message_says_what_changed(tmp_path, capsys):
    logs, out = tmp_path / "logs", tmp_path / "runs" / "stage"
    old = {"command": ["train", "--model_name=/repo/m.gguf", "--seed=0"], "reads": {"data": "a"}}
    new = {"command": ["train", "--model_name=m.gguf", "--seed=0"], "reads": {"data": "a"}}

    def work(text):
        def write(resume):
            out.mkdir(parents=True, exist_ok=True)
            (out / "checkpoint.bin").write_text(text)
        return write

    markers.once(logs, "stage", old, work("first"), folder=out)
    first = _done(logs)
    markers.once(logs, "stage", new, work("second"), folder=out)
    said = capsys.readouterr().out
    assert "command[1]: --model_name=/repo/m.gguf -> --model_name=m.gguf" in said
    aside = tmp_path / markers.SUPERSEDED
    assert (aside / "runs" / "stage" / "checkpoint.bin").read_text() == "first"
    assert json.loads((aside / "logs" / f"stage{markers.DONE}").read_text()) == first
    assert (out / "checkpoint.bin").read_text() == "second" and _done(logs)["key"] == new
    # a third key replaces the copy set aside: one generation kept, so the disk holds at most twice a stage
    markers.once(logs, "stage", old, work("third"), folder=out)
    assert (aside / "runs" / "stage" / "checkpoint.bin").read_text() == "second"
    assert (out / "checkpoint.bin").read_text() == "third"


@pytest.mark.parametrize(("old", "new", "said"), [
    ({"a": 1, "b": [1, 2]}, {"a": 1, "b": [1, 3]}, "b[1]: 2 -> 3"),
    ({"a": 1}, {"a": 1, "c": "x"}, "c: (none) -> x"),
    ({"cmd": "run --x=1 --y=2"}, {"cmd": "run --x=1 --y=3"}, "cmd[2]: --y=2 -> --y=3"),
    (["--a", "--b"], ["--a", "--b", "--c"], "it: with --c"),
    ("run --x x --y", "run --x --y", "it: without x"),  # a repeated word gone is named, not "another order"
    ("run --x --y", "run --x --y --x", "it: with --x"),
    (["--a", "--b"], ["--b", "--a"], "[0]: --a -> --b; [1]: --b -> --a"),
    ({"a": 1}, {"a": 1}, "no difference"),
    ({"n": list(range(9))}, {"n": list(range(1, 10))}, "; and more"),
])
def test_difference_names_where_two_keys_differ(old, new, said):
    assert said in markers.difference(old, new)


def test_a_started_marker_from_before_attempts_were_timed_counts_from_its_writing(tmp_path):
    """A seed cut short by an older version: its started marker holds only the key, written when it began."""
    logs, out = tmp_path / "logs", tmp_path / "out"
    logs.mkdir()
    out.mkdir()
    started = logs / f"stage{markers.STARTED}"
    started.write_text(json.dumps({"key": KEY}))
    now = started.stat().st_mtime
    os.utime(started, (now - 900, now - 900))
    (out / "journal.jsonl").write_text("{}\n")
    os.utime(out / "journal.jsonl", (now - 100, now - 100))
    markers.once(logs, "stage", KEY, lambda resume: None, folder=out)
    assert _done(logs)["carried"] == pytest.approx(800)


def test_a_cut_short_run_of_this_key_beside_a_finish_of_another_continues(tmp_path):
    """A finish of key A, then a run of key B cut short: B continues from its checkpoint, A's marker is set aside."""
    logs, out = tmp_path / "logs", tmp_path / "runs" / "stage"
    other, key = {"command": ["a"]}, {"command": ["b"]}
    logs.mkdir()
    (logs / f"stage{markers.DONE}").write_text(json.dumps({"key": other, "token": "t", "seconds": 1.0}))
    (logs / f"stage{markers.STARTED}").write_text(json.dumps({"key": key, "attempt": 0.0}))
    checkpoint = out / "1_supervised_pretrain" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    complete.mark(checkpoint)
    resumed = []
    markers.once(logs, "stage", key, resumed.append, folder=out, resumable=True)
    assert resumed == [checkpoint] and checkpoint.is_dir()
    aside = tmp_path / markers.SUPERSEDED
    assert json.loads((aside / "logs" / f"stage{markers.DONE}").read_text())["key"] == other
    assert not (aside / "runs").exists()


def test_a_folder_no_started_marker_names_is_set_aside(tmp_path, capsys):
    logs, out = tmp_path / "logs", tmp_path / "runs" / "stage"
    out.mkdir(parents=True)
    (out / "left by hand.txt").write_text("x")
    markers.once(logs, "stage", KEY, lambda resume: None, folder=out)
    assert "no started marker" in capsys.readouterr().out
    assert (tmp_path / markers.SUPERSEDED / "runs" / "stage" / "left by hand.txt").read_text() == "x"
