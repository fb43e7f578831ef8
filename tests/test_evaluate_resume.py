"""evaluation.evaluate keeps every finished result (issue 31, defects 1, 3 and 7): every entry of its list is
checked before the first episode; each configuration is journalled as it finishes, so an entry that fails
while playing leaves the others' results, and a killed run resumes with the same command; the levels are
listed in curriculum order."""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from evaluation import evaluate
from evaluation.configs import load_configs
from evaluation.report import markdown_table, summarise, unit_id
from experiment_args import parse_args, run_script
from rollout import Episode
from tests.conftest import REPO
from tests.test_checkpoint_roles import SFT_POLICY, SFT_REFLECTOR, one_line_exit, role_checkpoint
from utils import checkpoints
from utils.errors import UsageError

EVALUATE_CONFIG = evaluate.evaluate_config
FLAGS = ["--model_name=tiny-gpt2", "--env=taxi", "--taxi_curriculum", "--eval_reps=2",
         "--per_device_eval_batch_size=3", "--reflect_max_new_tokens=4", "--horizon=6"]


@pytest.fixture(scope="module")
def players(tmp_path_factory):
    base = tmp_path_factory.mktemp("players")
    return {"policy": role_checkpoint(base / "policy", SFT_POLICY),
            "other policy": role_checkpoint(base / "other", SFT_POLICY, seed=7),
            "reflector": role_checkpoint(base / "reflector", SFT_REFLECTOR)}


def _listing(folder, entries: list) -> str:
    path = folder / "list.yaml"
    path.write_text(yaml.safe_dump(entries, sort_keys=False))
    return str(path)


def _three(players, second: dict | None = None) -> list[dict]:
    return [{"env": "taxi", "name": "first", "load_dir": players["policy"]},
            second or {"env": "taxi", "name": "second", "load_dir": players["other policy"]},
            {"env": "taxi", "name": "third", "load_dir": players["policy"], "reflect_load_dir": players["reflector"]}]


# --- every entry checked before the first episode ------------------------------------------------------

def test_a_list_whose_second_entry_is_broken_refuses_to_start(players, tmp_path, monkeypatch, capsys):
    missing = str(tmp_path / "results" / "9_supervised_pretrain" / "checkpoint-10")
    listing = _listing(tmp_path, _three(players, {"env": "taxi", "name": "second", "load_dir": missing}))
    line = one_line_exit(monkeypatch, capsys, evaluate.main, evaluate.PROG,
                         [*FLAGS, f"--ckpt_path={tmp_path / 'results'}", f"--eval_load_list={listing}"])
    assert line.endswith("1 of the 3 evaluation configurations cannot run, so none was played: configuration 2 "
                         f"(second): load_dir {missing!r} does not exist")
    assert not (tmp_path / "results").exists()  # no run folder, no journal: nothing was played


def test_every_bad_entry_is_named_with_what_is_wrong(players, tmp_path, monkeypatch, capsys):
    entries = [{"env": "taxi", "name": "fine", "load_dir": players["policy"]},
               {"env": "taxi", "name": "typo", "loaddir": players["policy"]},
               {"env": "alfworld", "name": "elsewhere", "load_dir": "base"},
               {"name": "swapped", "load_dir": players["reflector"], "reflect_load_dir": players["policy"]},
               "just a string"]
    line = one_line_exit(monkeypatch, capsys, evaluate.main, evaluate.PROG,
                         [*FLAGS, f"--ckpt_path={tmp_path / 'results'}", f"--eval_load_list={_listing(tmp_path, entries)}"])
    assert "4 of the 5 evaluation configurations cannot run" in line and "configuration 1" not in line
    assert "configuration 2 (typo): unknown keys ['loaddir']" in line and "it names no load_dir" in line
    assert "configuration 3 (elsewhere): it is for env 'alfworld', but this run evaluates --env=taxi" in line
    assert (f"configuration 4 (swapped): load_dir {players['reflector']!r} is an SFT reflector checkpoint, not a "
            f"policy; reflect_load_dir {players['policy']!r} is an SFT policy checkpoint, not a reflector") in line
    assert "configuration 5 is not a mapping" in line
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("case, says", [
    ("missing", "no such file"), ("a folder", "is a folder; give a file"), ("a mapping", "must hold a list"),
    ("empty", "must hold a list of {env, load_dir, reflect_load_dir, name}, not nothing"),
    ("binary", "is not UTF-8 text"), ("bad YAML", "is not a YAML file")])
def test_eval_load_list_that_is_no_list_is_one_line(case, says, tmp_path, monkeypatch, capsys):
    path = tmp_path / "list.yaml"
    content = {"a folder": None, "missing": None, "a mapping": "env: taxi\nload_dir: x\n", "empty": "",
               "binary": b"\xff\xfe\x00\x81", "bad YAML": "- {env: taxi\n"}[case]
    if case == "a folder":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    line = one_line_exit(monkeypatch, capsys, evaluate.main, evaluate.PROG,
                         [*FLAGS, f"--ckpt_path={tmp_path / 'results'}", f"--eval_load_list={path}"])
    assert line.startswith(f"{evaluate.PROG}: error: --eval_load_list: ") and says in line and str(path) in line
    assert not (tmp_path / "results").exists()


def test_load_dir_beside_the_in_code_list_is_said_to_be_ignored(players, make_args, caplog):
    args = make_args(env="taxi", load_dir=players["reflector"])  # not even a policy: it is not looked at
    with caplog.at_level(logging.WARNING):
        configs = load_configs(args, [{"env": "taxi", "name": "listed", "load_dir": players["policy"]}])
    assert [c["name"] for c in configs] == ["listed"]
    assert any("--load_dir and --reflect_load_dir are ignored: EVAL_LOAD_LIST" in r.getMessage() for r in caplog.records)


def test_entries_that_share_a_name_are_refused_and_unnamed_ones_name_their_reflector(players, make_args):
    """Each entry is a row of the results and a curve, found by its name: two that share one stop the run before
    anything plays. An entry without a name takes its policy's checkpoint, and its reflector's where it reads
    one, so one policy with and without a reflector gives two rows."""
    args = make_args(env="taxi")
    plain, reflecting = {"load_dir": players["policy"]}, {"load_dir": players["policy"],
                                                         "reflect_load_dir": players["reflector"]}
    configs = load_configs(args, [plain, reflecting, {"load_dir": "base"}])
    assert [c["name"] for c in configs] == [players["policy"], f"{players['policy']} + reflector {players['reflector']}",
                                            "base model"]
    listed = [{"name": "SFT", **plain}, {"name": "RL", **plain}, {"name": "SFT", **reflecting},
              {"name": "RL", "load_dir": "base"}]
    with pytest.raises(UsageError) as refused:
        load_configs(args, listed)
    assert str(refused.value) == ("no evaluation configuration was played: configurations 1 and 3 share the name "
                                  "'SFT'; give each its own (name: ...); configurations 2 and 4 share the name 'RL'; "
                                  "give each its own (name: ...)")
    with pytest.raises(UsageError, match=r"^1 of the 3 evaluation configurations cannot run, so none was played: "
                                         r"configuration 3 \(x\): unknown keys \['bad'\].*; configurations 1 and 2 "
                                         r"share the name 'SFT'"):
        load_configs(args, [{"name": "SFT", **plain}, {"name": "SFT", "load_dir": "base"},
                                     {"name": "x", "load_dir": "base", "bad": 1}])


def test_an_entry_without_load_dir_is_refused_unless_it_says_base(players, tmp_path, monkeypatch, capsys):
    """An entry without a load_dir (left out, misspelt, null) evaluated the untrained base model under its name,
    with exit status 0: it is refused in one line naming it, before anything plays, unless it says load_dir: base,
    which evaluates the base model with a fresh LoRA (as an empty list with no --load_dir does)."""
    for second in ({"env": "taxi", "name": "RL"}, {"env": "taxi", "name": "RL", "load_dir": None}):
        listing = _listing(tmp_path, [{"env": "taxi", "name": "SFT", "load_dir": players["policy"]}, second])
        line = one_line_exit(monkeypatch, capsys, evaluate.main, evaluate.PROG,
                             [*FLAGS, f"--ckpt_path={tmp_path / 'results'}", f"--eval_load_list={listing}"])
        assert line == (f"{evaluate.PROG}: error: 1 of the 2 evaluation configurations cannot run, so none was played: "
                        "configuration 2 (RL): it names no load_dir (give its policy's checkpoint, or load_dir: base "
                        "for the base model with a fresh LoRA)")
        assert not (tmp_path / "results").exists()
    played = _played(monkeypatch)
    entries = [{"env": "taxi", "name": "base", "load_dir": "base"}, {"env": "taxi", "load_dir": "base"}]
    argv = [*FLAGS, "--curriculum_index=0", f"--ckpt_path={tmp_path / 'results'}",
            f"--eval_load_list={_listing(tmp_path, entries)}"]
    assert evaluate.main(parse_args(argv)) == 0 and played == ["base", "base model"]
    (run,) = checkpoints.run_dirs(tmp_path / "results", evaluate.SCRIPT)
    listed = json.loads((run / "results.json").read_text())
    # the base model, as the flags' one configuration without --load_dir plays it
    assert evaluate.main(parse_args([*FLAGS, "--curriculum_index=0", f"--ckpt_path={tmp_path / 'flags'}"])) == 0
    (flags,) = checkpoints.run_dirs(tmp_path / "flags", evaluate.SCRIPT)
    assert listed[0]["levels"] == listed[1]["levels"] == json.loads((flags / "results.json").read_text())[0]["levels"]


# --- results kept: a failing entry, a resumed run -------------------------------------------------------

def _played(monkeypatch, fail: str | None = None) -> list[str]:
    """The names of the configurations evaluation.evaluate plays from now on (``fail``'s raises)."""
    played = []

    def spy(args, config, envs, starts):
        played.append(config["name"])
        if config["name"] == fail:
            raise RuntimeError("the GPU fell off")
        return EVALUATE_CONFIG(args, config, envs, starts)

    monkeypatch.setattr(evaluate, "evaluate_config", spy)
    return played


def test_an_entry_failing_while_playing_is_reported_beside_the_others_results(players, tmp_path, monkeypatch,
                                                                              capsys):
    argv = [*FLAGS, f"--eval_load_list={_listing(tmp_path, _three(players))}"]
    played = _played(monkeypatch, fail="second")
    monkeypatch.setattr("sys.argv", [evaluate.PROG, *argv, f"--ckpt_path={tmp_path / 'results'}"])
    assert run_script(evaluate.main, evaluate.PROG) == 1
    err = capsys.readouterr().err
    assert played == ["first", "second", "third"] and "RuntimeError: the GPU fell off" in err  # its traceback
    (run,) = checkpoints.run_dirs(tmp_path / "results", evaluate.SCRIPT)
    line = err.strip().splitlines()[-1]
    assert line == (f"{evaluate.PROG}: error: configuration 2 (second): RuntimeError: the GPU fell off (failed while "
                    f"playing, traceback above); the results of the 2 others are in {run}; the same command plays "
                    "again only what did not finish")
    assert [r["name"] for r in json.loads((run / "results.json").read_text())] == ["first", "third"]

    # the same command again plays only the failed entry, and writes what one uninterrupted run writes
    played = _played(monkeypatch)
    assert run_script(evaluate.main, evaluate.PROG) == 0
    assert played == ["second"]
    resumed = checkpoints.run_dirs(tmp_path / "results", evaluate.SCRIPT)[-1]
    assert evaluate.main(parse_args([*argv, f"--ckpt_path={tmp_path / 'straight'}"])) == 0
    (straight,) = checkpoints.run_dirs(tmp_path / "straight", evaluate.SCRIPT)
    for name in ("results.json", "results.md"):
        assert (resumed / name).read_text() == (straight / name).read_text()
    results = json.loads((straight / "results.json").read_text())
    assert [r["name"] for r in results] == ["first", "second", "third"]
    assert all(list(r["levels"]) == ["pickup", "dropoff", "full", "all"] for r in results)  # curriculum order


def test_a_finished_run_leaves_no_journal_and_a_retrained_checkpoint_is_played_again(players, tmp_path,
                                                                                     monkeypatch):
    checkpoint = role_checkpoint(tmp_path / "policy", SFT_POLICY)
    entries = [{"name": "p", "load_dir": checkpoint}, {"name": "q", "load_dir": players["policy"]}]
    argv = [*FLAGS, "--curriculum_index=0", f"--ckpt_path={tmp_path / 'results'}",
            f"--eval_load_list={_listing(tmp_path, entries)}"]
    played = _played(monkeypatch)
    assert evaluate.main(parse_args(argv)) == 0 and evaluate.main(parse_args(argv)) == 0
    assert played == ["p", "q", "p", "q"]  # a finished run's journal is gone: a later run plays afresh
    assert not list((tmp_path / "results" / ".progress").iterdir())
    played = _played(monkeypatch, fail="q")
    assert evaluate.main(parse_args(argv)) == 1
    role_checkpoint(tmp_path / "policy", SFT_POLICY)  # trained again, under the same name, before the resume
    played = _played(monkeypatch)
    assert evaluate.main(parse_args(argv)) == 0
    assert played == ["p", "q"]


# --- the table in curriculum order ----------------------------------------------------------------------

def test_levels_are_listed_in_the_order_of_the_held_out_units():
    episodes = [Episode(seed=i, options={}, level=level, success=i % 2 == 0, cost=1.0)
                for i, level in enumerate(["pickup", "pickup", "dropoff", "full"])]
    summary = summarise(episodes)
    assert list(summary) == ["pickup", "dropoff", "full", "all"]
    header = markdown_table([{"name": "x", "levels": summary}]).splitlines()[0]
    assert header.index("pickup") < header.index("dropoff") < header.index("full")


def test_replayed_tasks_get_an_interval_over_the_tasks_not_the_episodes():
    """8 tasks each played 13 times, 3 of them always solved: 104 episodes, but 8 samples. The table's interval is
    the tasks' (about 36 points), not the episodes' (about 9); Taxi's seeds, each episode a draw of its own, keep the
    episodes' interval."""
    import dataclasses

    from recipes import RECIPES
    from runner.report import episodes_note, interval, paper_table, success_interval

    episodes = [Episode(seed=rep, options={"task": task}, level="depth 1", success=task < 3, cost=1.0)
                for task in range(8) for rep in range(13)]
    figure = summarise(episodes)["depth 1"]
    assert figure["units"] == 8 and figure["episodes"] == 104
    assert list(figure["unit_success"].values()) == [1.0] * 3 + [0.0] * 5
    assert list(figure["unit_success"]) == [unit_id({"task": task}) for task in range(8)]  # the same for every row
    explore = RECIPES["auto_explore"]
    assert success_interval(explore, figure) == pytest.approx(1.96 * 0.5175 / 8 ** 0.5, rel=1e-3)  # 0.359
    assert interval(figure["success"], 104) == pytest.approx(0.093, abs=1e-3)
    one = dataclasses.replace(explore, evaluations={"held-out": explore.evaluations["held-out"]})
    table = paper_table(one, [{"name": "Reflect-RL", "levels": {"depth 1": figure, "depth 2": figure}}])
    assert "37.5% ± 35.9 (104)" in table
    old = {key: value for key, value in figure.items() if key != "unit_success"}  # a results.json from before
    assert success_interval(explore, old) == interval(figure["success"], 104)
    assert episodes_note(one, [{"levels": {"depth 1": figure, "depth 2": figure}}]).endswith(
        "each ± is a 95% interval over the tasks, whose replays are not independent draws")
    assert "over the tasks" not in episodes_note(one, [{"levels": {"depth 1": old, "depth 2": old}}])
    taxi = summarise([Episode(seed=i, options={}, level="pickup", success=i % 4 == 0, cost=1.0) for i in range(100)])
    assert success_interval(RECIPES["taxi_pickup"], taxi["pickup"]) == interval(0.25, 100)


def test_two_rows_are_told_apart_by_their_gap_paired_over_the_tasks():
    """Reflect-RL solves tasks 0-4 of 8, SFT only tasks 0-1: each row's own interval over the tasks is wide and they
    overlap, but every task either is solved by both or only by Reflect-RL, so the paired gap, +37.5, has an
    interval of its own (±35.9) clear of 0. A recipe that does not replay tasks (Taxi) gets no such table."""
    import dataclasses

    from recipes import RECIPES
    from runner.report import paired_gaps, success_interval

    def row(name, solved):
        episodes = [Episode(seed=rep, options={"task": task}, level=level, success=task < solved, cost=1.0)
                    for level in ("depth 1", "depth 2") for task in range(8) for rep in range(13)]
        return {"name": name, "levels": summarise(episodes)}

    explore = RECIPES["auto_explore"]
    explore = dataclasses.replace(explore, evaluations={"held-out": explore.evaluations["held-out"]})
    results = [row("SFT only", 2), row("RLFT only", 5), row("Reflect-RL", 5)]
    one, other = results[0]["levels"]["depth 1"], results[2]["levels"]["depth 1"]
    assert other["success"] - one["success"] < success_interval(explore, one) + success_interval(explore, other)
    table = paired_gaps(explore, results)
    assert "| SFT only | +37.5 ± 35.9 (8) | +37.5 ± 35.9 (8) |" in table
    assert "| RLFT only | +0.0 ± 0.0 (8) |" in table and "| Reflect-RL |" not in table
    assert table.endswith("|\n\n")
    assert paired_gaps(explore, results[:2]) == ""  # no Reflect-RL row
    taxi = [{"name": name, "levels": summarise([Episode(seed=i, options={}, level="pickup", success=i < 3, cost=1.0)
                                                for i in range(10)])} for name in ("SFT only", "Reflect-RL")]
    assert paired_gaps(RECIPES["taxi_pickup"], taxi) == ""


# --- kill -9 halfway, then the same command -------------------------------------------------------------

@pytest.mark.slow
def test_a_list_killed_after_its_first_entry_resumes_to_the_same_results(players, tmp_path):
    argv = [*FLAGS, f"--eval_load_list={_listing(tmp_path, _three(players))}"]
    command = [sys.executable, "-m", "evaluation.evaluate", *argv, f"--ckpt_path={tmp_path / 'results'}"]
    progress = tmp_path / "results" / ".progress"
    with open(tmp_path / "killed.log", "w") as log:
        process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while process.poll() is None and time.time() < deadline:
            journals = list(progress.glob("evaluate_*.jsonl")) if progress.is_dir() else []
            if journals and journals[0].read_text().count("\n") >= 1:
                os.kill(process.pid, signal.SIGKILL)
                break
            time.sleep(0.02)
        process.wait()
    assert process.returncode == -signal.SIGKILL, (tmp_path / "killed.log").read_text()[-3000:]
    (journal,) = progress.glob("evaluate_*.jsonl")
    finished = journal.read_text().count("\n")
    assert 1 <= finished < 3, "the kill should land while an entry is still playing"
    assert not checkpoints.run_dirs(tmp_path / "results")  # the run folder is made at the end

    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    for number, name in enumerate(["first", "second", "third"], 1):
        done_before = number <= finished
        assert (f"configuration {number} ({name}): 1 of 1 items already done" in again.stderr) == done_before, name
        assert (f"eval {name}" in again.stderr) != done_before, name  # its progress bar: played
    (resumed,) = checkpoints.run_dirs(tmp_path / "results", evaluate.SCRIPT)

    assert evaluate.main(parse_args([*argv, f"--ckpt_path={tmp_path / 'straight'}"])) == 0
    (straight,) = checkpoints.run_dirs(tmp_path / "straight", evaluate.SCRIPT)
    assert (resumed / "results.json").read_text() == (straight / "results.json").read_text()
