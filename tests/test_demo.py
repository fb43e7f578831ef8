"""demo.py end to end, with its budget scaled down: every stage runs, the tables are complete,
and the seed plumbing holds (same seed, same table; another seed, other training episodes but
the same evaluation episodes)."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import data_gen.taxi.reflection
import demo
from evaluation import episodes, evaluate
from recipes import RECIPES
from recipes.taxi_pickup import RECIPE as TAXI
from runner import markers, stages
from runner import seed as runner_seed
from utils.checkpoints import run_dirs

ROWS = [row.name for row in TAXI.rows]


# The end-to-end tests run a seed's stages in this process: pytest-xdist keeps the cores busy already, and a
# stage process starts by importing torch and transformers again (seconds each, several per seed). The
# plumbing test below runs a seed's evaluation in two processes as well.
ONE_PROCESS = ("--workers", "1")


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setitem(RECIPES, TAXI.name, TAXI.smoke())  # demo.py --profile smoke
    evaluated = []
    real = episodes.test_episodes

    def recording(args, env, reps, level_episodes=0):
        starts = real(args, env, reps, level_episodes)
        evaluated.append([(s.seed, s.options) for s in starts])
        return starts

    monkeypatch.setattr(evaluate, "test_episodes", recording)  # where evaluate.run looks it up
    return evaluated


def _rl_runs(folder) -> list:
    """The RL runs of one seed's demo, one folder per variant."""
    return [run for variant in sorted((folder / "runs").glob("rl-*")) for run in run_dirs(variant, "rl_finetune")]


def _training_seeds(folder) -> set[int]:
    seeds = set()
    for run in _rl_runs(folder):
        for checkpoint in run.glob("checkpoint-*"):
            seeds |= {json.loads(x)["seed"] for x in (checkpoint / "episodes.jsonl").read_text().splitlines()}
    return seeds


@pytest.mark.slow
def test_demo_runs_every_stage_and_seeds_are_plumbed_through(tmp_path, small):
    # in one process, so that the evaluations' episodes are recorded; "b" below runs side by side
    assert demo.main([f"--ckpt_path={tmp_path / 'a'}", "--seeds", "0", "1", *ONE_PROCESS]) == 0
    root = tmp_path / "a" / "demo"
    report = (root / "results.md").read_text()
    summary = [line for line in report.splitlines() if line.startswith("| ") and " | mean | " not in line
               and "%" in line and "±" not in line]
    assert [row.split(" | ")[0][2:] for row in summary] == ROWS
    for seed in (0, 1):
        folder = root / f"seed-{seed}"
        seed_report = (folder / "results.md").read_text()
        rows = [line for line in seed_report.splitlines() if line.startswith("| ") and "% ± " in line]
        assert [row.split(" | ")[0][2:] for row in rows] == ROWS
        assert all(row.rstrip(" |").endswith("| 4") for row in rows)  # every row: the same 4 episodes
        assert "| accuracy | " in seed_report
        assert (folder / "rl_curves.png").stat().st_size > 10_000
        assert len(_rl_runs(folder)) == 3
        for run in _rl_runs(folder):  # the held-out panel was played
            records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            assert [r["step"] for r in records if "heldout_success" in r] == [0, 1, 2]
        logs = sorted(path.name for path in (folder / "logs").glob("*.log"))  # each stage ran, its output kept
        assert logs == [*sorted(f"evaluation-{runner_seed.slug(row)}.log" for row in ROWS),  # a stage a row
                        "rl-reflect-rl.log", "rl-rlft-only.log", "rl-sft-rlft-w-o-reflection.log",
                        "sft-plain.log", "sft-policy.log", "sft-reflector.log"]
        done = sorted(path.name for path in (folder / "logs").glob("*.done.json"))  # ... and is marked finished
        assert done == ["data.done.json", *(name.replace(".log", ".done.json") for name in logs)]
        assert "trained 2 steps" in (folder / "logs" / "sft-policy.log").read_text()
        settings = (_rl_runs(folder)[0] / "setting.yml").read_text()  # Reflect-RL reflects greedily
        assert f"top_k: {TAXI.budget['reflect_top_k']}" in settings and "reflect_load_dir: " in settings
    results = json.loads((root / "results.json").read_text())
    assert [r["name"] for r in results["0"]["results"]] == ROWS
    assert set(results["0"]["timings"]) >= {"data generation (oracle writer)", "evaluation", "reflector accuracy"}

    # other seeds: other training episodes; every evaluation (final, panels, accuracy) on the same episodes
    assert _training_seeds(root / "seed-0").isdisjoint(_training_seeds(root / "seed-1"))
    data = [json.loads((root / f"seed-{s}" / "data" / "data_reflection.json").read_text()) for s in (0, 1)]
    assert [r["state"] for r in data[0]] != [r["state"] for r in data[1]]
    finals = [starts for starts in small if len(starts) == 4]
    assert len(finals) == 2 * len(ROWS) and all(starts == finals[0] for starts in finals)  # a run a row and seed
    assert all(seed >= episodes.HELD_OUT_SEED for starts in small for seed, _ in starts)

    # seed 0 again with its results and its evaluations lost, in two processes: its training stages are kept
    # (their commands are the same), each row is played again in a process of its own, two at a time, and the
    # table is the same
    folder = root / "seed-0"
    kept = {path.name: path.read_text() for path in (folder / "logs").glob("*.done.json")
            if not path.name.startswith("evaluation")}
    for marker in (folder / "logs").glob("evaluation-*.done.json"):
        marker.unlink()
    (folder / demo.FINISHED).unlink()
    assert demo.main([f"--ckpt_path={tmp_path / 'a'}", "--seed", "0", "--workers", "2"]) == 0
    assert {name: (folder / "logs" / name).read_text() for name in kept} == kept
    played = {row: json.loads((folder / "logs" / f"evaluation-{runner_seed.slug(row)}.done.json").read_text())
              for row in ROWS}
    assert len({marker["process"] for marker in played.values()}) == len(ROWS)  # a process a row
    for row in ROWS:  # each row in a run of its own, from a list of that row alone
        (listed,) = yaml.safe_load((folder / "logs" / f"evaluation-{runner_seed.slug(row)}.rows.yaml").read_text())
        run = run_dirs(folder / "runs" / f"evaluation-{runner_seed.slug(row)}", evaluate.SCRIPT)[-1]
        assert listed["name"] == row and [r["name"] for r in json.loads((run / "results.json").read_text())] == [row]
    again = json.loads((root / "results.json").read_text())["0"]
    assert [(r["name"], r["levels"]) for r in again["results"]] == [(r["name"], r["levels"]) for r in results["0"]["results"]]
    assert again["reflector_accuracy"] == results["0"]["reflector_accuracy"]


@pytest.mark.slow
def test_some_rows_run_only_the_stages_they_read_and_a_run_of_every_row_keeps_them(tmp_path, small):
    """demo.py --rows: a seed's priority rows first (issue 73: a SmolLM2 seed of every row is longer than a session
    here), every row later in the same folder, which trains only what the first run did not."""
    asked = ["SFT only", "Reflect-RL"]
    assert demo.main([f"--ckpt_path={tmp_path}", "--seed", "0", "--rows", *asked, *ONE_PROCESS]) == 0
    folder = tmp_path / "demo" / "seed-0"
    logs = sorted(path.name for path in (folder / "logs").glob("*.done.json"))
    assert logs == ["data.done.json", "evaluation-reflect-rl.done.json", "evaluation-sft-only.done.json",
                    "rl-reflect-rl.done.json", "sft-plain.done.json",
                    "sft-policy.done.json", "sft-reflector.done.json"]  # no RLFT only, no RL w/o reflection
    first = json.loads((tmp_path / "demo" / "results.json").read_text())["0"]
    assert [r["name"] for r in first["results"]] == asked and not first["reflector_accuracy"]
    report = (folder / "results.md").read_text()
    assert [line.split(" | ")[0][2:] for line in report.splitlines() if "% ± " in line] == asked

    kept = {name: (folder / "logs" / name).read_text() for name in logs}
    assert demo.main([f"--ckpt_path={tmp_path}", "--seed", "0", *ONE_PROCESS]) == 0
    assert {name: (folder / "logs" / name).read_text() for name in kept} == kept  # trained and played once
    assert len(_rl_runs(folder)) == 3
    every = json.loads((tmp_path / "demo" / "results.json").read_text())["0"]
    assert [r["name"] for r in every["results"]] == ROWS and every["reflector_accuracy"]
    levels = {r["name"]: r["levels"] for r in every["results"]}
    assert all(levels[r["name"]] == r["levels"] for r in first["results"])  # the same episodes, the same models

    # --rows again: it plays nothing, and still reports every row whose stages stand (it rewrote the column's
    # table with its own rows only before), the reflector's accuracy too
    kept = {path.name: path.read_text() for path in (folder / "logs").glob("*.done.json")}
    assert demo.main([f"--ckpt_path={tmp_path}", "--seed", "0", "--rows", "Reflect-RL", *ONE_PROCESS]) == 0
    assert {path.name: path.read_text() for path in (folder / "logs").glob("*.done.json")} == kept
    again = json.loads((tmp_path / "demo" / "results.json").read_text())["0"]
    assert again["results"] == every["results"] and again["reflector_accuracy"] == every["reflector_accuracy"]
    assert [line.split(" | ")[0][2:] for line in (folder / "results.md").read_text().splitlines()
            if "% ± " in line] == ROWS
    # a row whose model no longer stands (its RL run's marker gone: it would train again) is not reported
    (folder / "logs" / "rl-rlft-only.done.json").unlink()
    assert demo.main([f"--ckpt_path={tmp_path}", "--seed", "0", "--rows", "Reflect-RL", *ONE_PROCESS]) == 0
    assert not (folder / "logs" / "rl-rlft-only.done.json").is_file()  # nor run
    shown = json.loads((tmp_path / "demo" / "results.json").read_text())["0"]["results"]
    assert [r["name"] for r in shown] == [name for name in ROWS if name != "RLFT only"]


def test_a_finished_seed_is_read_back_and_a_changed_budget_runs_again(tmp_path, monkeypatch):
    """finished_or_run's bookkeeping, around a stand-in for the pipeline (the real one: the test above)."""
    ran = []

    def pipeline(recipe, seed, folder, workers, cores=None, home=None):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "made.txt").write_text(str(len(ran)))
        ran.append((seed, recipe.budget["eval_episodes"]))
        return {"results": [{"name": row.name, "levels": {"pickup": {"success": 0.25, "cost": 0.5,
                                                                       "episodes": recipe.budget["eval_episodes"]}}}
                            for row in recipe.rows], "reflector_accuracy": {}, "timings": {}}

    monkeypatch.setattr(demo, "run_seed", pipeline)
    assert demo.main([f"--ckpt_path={tmp_path}", "--seed", "0"]) == 0
    first = json.loads((tmp_path / "demo" / "results.json").read_text())["0"]
    assert demo.main([f"--ckpt_path={tmp_path}", "--seeds", "0", "1"]) == 0  # seed 0 read back, seed 1 run
    assert ran == [(0, 200), (1, 200)]
    assert json.loads((tmp_path / "demo" / "results.json").read_text())["0"] == first
    assert "| SFT only | 25.0% | 25.0% | 25.0% | 25.0–25.0 |" in (tmp_path / "demo" / "results.md").read_text()

    # another budget: the seed is run again in its folder, kept (each step decides by its key what runs again)
    monkeypatch.setitem(RECIPES, TAXI.name, dataclasses.replace(TAXI, budget=dict(TAXI.budget, eval_episodes=2)))
    (tmp_path / "demo" / "seed-0" / "made earlier.txt").write_text("a step's output")
    assert demo.main([f"--ckpt_path={tmp_path}", "--seeds", "0"]) == 0
    assert ran[2:] == [(0, 2)] and (tmp_path / "demo" / "seed-0" / "made earlier.txt").is_file()
    rows = json.loads((tmp_path / "demo" / "results.json").read_text())["0"]["results"]
    assert all(r["levels"]["pickup"]["episodes"] == 2 for r in rows)


def test_an_unfinished_seed_resumes_and_keeps_what_it_finished(tmp_path, monkeypatch):
    """A seed that failed part-way runs again in its folder, kept; so does a seed of other settings, whose
    finished.json is dropped first: its steps no longer all stand behind those results."""
    calls = []

    def pipeline(recipe, seed, folder, workers, cores=None, home=None):
        calls.append(sorted(path.name for path in folder.iterdir()))
        (folder / "kept.txt").write_text("made before the failure")
        if len(calls) == 1:
            raise RuntimeError("a stage failed")
        return {"results": [], "reflector_accuracy": {}, "timings": {}}

    monkeypatch.setattr(demo, "run_seed", pipeline)
    folder = tmp_path / "seed-0"
    with pytest.raises(RuntimeError, match="a stage failed"):
        demo.finished_or_run(TAXI, 0, folder, 1)
    assert not (folder / demo.FINISHED).exists()
    demo.finished_or_run(TAXI, 0, folder, 1)
    assert calls == [[], ["kept.txt"]] and (folder / demo.FINISHED).is_file()

    other = dataclasses.replace(TAXI, budget=dict(TAXI.budget, eval_episodes=2))
    before = (folder / demo.FINISHED).read_text()
    demo.finished_or_run(other, 0, folder, 1)
    # neither the other settings' results nor a clean folder; those results are set aside, not deleted
    assert calls[-1] == ["kept.txt", markers.SUPERSEDED]
    assert (folder / markers.SUPERSEDED / demo.FINISHED).read_text() == before

    # a seed finished on this CPU's own path is not read back for the reference path (utils/cpu.py), nor back again
    assert len(calls) == 3
    demo.finished_or_run(other, 0, folder, 1, cores=2)
    demo.finished_or_run(other, 0, folder, 1, cores=2)  # read back: the same path
    assert len(calls) == 4
    assert json.loads((folder / demo.FINISHED).read_text())["settings"]["numerics"]["cores"] == 2


def test_a_finished_stage_is_kept_and_a_failed_or_changed_one_runs_again(tmp_path, monkeypatch):
    ran = []

    def call(main, argv):
        ran.append(argv[0])
        if argv[0] == "fails" and ran.count("fails") == 1:
            raise RuntimeError("killed")

    monkeypatch.setattr(stages, "call", call)
    logs = tmp_path / "logs"
    queued = [stages.Stage(name, "demo", [name], logs / f"{name}.log") for name in ("trains", "fails")]
    with pytest.raises(RuntimeError, match="killed"):
        stages._run_stages(queued, 1)
    assert ran == ["trains", "fails"] and sorted(p.name for p in logs.glob("*.done.json")) == ["trains.done.json"]
    seconds = stages._run_stages(queued, 1)
    assert ran == ["trains", "fails", "fails"] and set(seconds) == {"trains", "fails"}
    changed = [stages.Stage("trains", "demo", ["trains", "--max_steps=9"], logs / "trains.log")]
    stages._run_stages(changed, 1)  # the same stage with another command is not the one that finished
    assert ran[-1] == "trains"


def test_a_stage_keyed_by_its_files_runs_again_only_when_their_bytes_change(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(stages, "call", lambda main, argv: ran.append(argv[0]))
    logs, texts = tmp_path / "logs", tmp_path / "data" / "texts.jsonl"
    queued = [stages.Stage("trains", "demo", ["trains"], logs / "trains.log", files=(texts,))]
    with pytest.raises(RuntimeError, match=r"reads .*texts\.jsonl, which does not exist"):
        stages._run_stages(queued, 1)
    texts.parent.mkdir()
    texts.write_text("a\n")
    stages._run_stages(queued, 1)
    texts.unlink()
    texts.write_text("a\n")  # written again, alike (a data step that ran again): kept
    stages._run_stages(queued, 1)
    assert ran == ["trains"]
    texts.write_text("b\n")
    stages._run_stages(queued, 1)
    assert ran == ["trains", "trains"]
    assert stages.stage_key(["x"], "native") == stages.stage_key(["x"], "native", files={})  # no files: no entry
    assert "files" not in stages.stage_key(["x"], "native")


def test_stage_output_goes_to_its_log_whoever_writes_it(tmp_path, capfd):
    import logging
    import os
    import sys

    log = tmp_path / "logs" / "stage.log"
    with stages._output_to(log):
        print("from print")
        sys.stderr.write("from stderr\n")
        os.write(2, b"from the file descriptor\n")
        logging.getLogger("some.library").warning("from a logger")
    print("after")
    text = log.read_text()
    assert all(line in text for line in ("from print", "from stderr", "from the file descriptor"))
    out, err = capfd.readouterr()
    assert out == "after\n" and "from" not in err


def test_a_stage_gets_the_cores_no_other_stage_runs_on():
    assert stages.stage_threads(2, 2, cores=2) == 1  # two streams side by side: a core each
    assert stages.stage_threads(2, 3, cores=2) == 1  # more streams than workers: still two at a time
    assert stages.stage_threads(2, 1, cores=2) == 2  # a lone stream: both cores, not one left idle
    assert stages.stage_threads(4, 2, cores=16) == 8
    assert stages.stage_threads(3, 3, cores=2) == 1  # never fewer than one


def _probe(tmp_path: Path, name: str, needs: tuple[str, ...] = ()) -> stages.Stage:
    return stages.Stage(name, "tests.stage_probe", [f"--output_dir={tmp_path / name}"], tmp_path / "logs" / f"{name}.log",
                      needs=needs)


def test_each_stage_runs_in_a_process_of_its_own(tmp_path):
    """Side by side, a stage's process ends with it, so what it held is given back before its stream's next stage
    starts (seen on SmolLM2: a worker idle after a policy's SFT held its 12 GiB peak, and the other stream's SFT, in
    the 300 MiB left, slowed from 11 to 30-330 s a step)."""
    stages.run_side_by_side([[_probe(tmp_path, "first"), _probe(tmp_path, "second")], [_probe(tmp_path, "other")]], 2)
    pids = dict(line.split()[1:] for line in (tmp_path / "order.txt").read_text().splitlines() if line.startswith("pid"))
    assert set(pids) == {"first", "second", "other"} and len(set(pids.values())) == 3
    assert str(os.getpid()) not in pids.values()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stage_starts_once_the_stages_it_needs_have_finished_in_any_stream(tmp_path, workers):
    """The policy's SFT and two runs in one stream, a long SFT ending with the reflector's in the other: the run
    that reads the policy only goes on at once, the one that reads the reflector waits for it (in another
    process, with 2 workers; with 1, the other stream's stages run first)."""
    policy = _probe(tmp_path, "policy")
    plain_rl = _probe(tmp_path, "plain-rl", needs=("policy",))
    reflect_rl = _probe(tmp_path, "reflect-rl", needs=("policy", "reflector"))
    long_sft = [_probe(tmp_path, "warm-up-1"), _probe(tmp_path, "warm-up-2"), _probe(tmp_path, "reflector")]
    seconds = stages.run_side_by_side([[policy, plain_rl, reflect_rl], long_sft], workers)
    assert set(seconds) == {"policy", "plain-rl", "reflect-rl", "warm-up-1", "warm-up-2", "reflector"}
    order = (tmp_path / "order.txt").read_text().split("\n")[:-1]
    at = {line: index for index, line in enumerate(order)}
    assert at["end policy"] < at["start plain-rl"] and at["end policy"] < at["start reflect-rl"]
    assert at["end reflector"] < at["start reflect-rl"]
    if workers == 2:  # side by side: the run that needs no reflector did not wait for it
        assert at["start plain-rl"] < at["end reflector"]


def test_a_rows_evaluation_takes_a_process_no_training_stage_can_use_yet(tmp_path):
    """The evaluations (``after``) are queued with the training streams: a row whose model is trained is played in
    the process the short stream leaves while the long one trains on, never in one a training stage could take,
    and the training stages keep the threads their own plan gives them (a lone stream: both cores)."""
    # the long stream's last stage ends only once both evaluations beside it have: run otherwise, it fails
    long = [_probe(tmp_path, "long-0"), dataclasses.replace(_probe(tmp_path, "long-1"), argv=[
        f"--output_dir={tmp_path / 'long-1'}", f"--task_file={tmp_path / 'eval-data'}"])]
    short = [_probe(tmp_path, "short")]
    after = [[_probe(tmp_path, "eval-long", needs=("long-1",))], [_probe(tmp_path, "eval-short", needs=("short",))],
             [_probe(tmp_path, "eval-data")]]  # reads nothing the streams train: still waits for a free process
    stages.run_side_by_side([long, short], 2, cores=2, after=after)
    lines = (tmp_path / "order.txt").read_text().split("\n")[:-1]
    at = {line: index for index, line in enumerate(lines) if line.startswith(("start", "end"))}
    threads = dict(line.split()[1:] for line in lines if line.startswith("threads"))
    assert at["end short"] < at["end eval-short"] < at["start eval-data"] < at["end long-1"]  # beside the long one
    assert at["start eval-long"] > at["end long-1"]
    assert all(threads[name] == "1" for name in threads)  # two streams, two processes: a core each
    # a lone training stream keeps both cores; an evaluation beside it has one
    (tmp_path / "order.txt").unlink()
    lone = tmp_path / "lone"
    stages.run_side_by_side([[_probe(lone, "train")]], 2, cores=2, after=[[_probe(lone, "eval")]])
    threads = dict(line.split()[1:] for line in (lone / "order.txt").read_text().splitlines()
                   if line.startswith("threads"))
    assert threads == {"train": "2", "eval": "1"}
    # in one process, a training stage that can start goes before an evaluation that could have started first
    one = tmp_path / "one"
    stages.run_side_by_side([[_probe(one, "sft")], [_probe(one, "rl", needs=("sft",))]], 1,
                            after=[[_probe(one, "eval")]])
    assert [line for line in (one / "order.txt").read_text().splitlines() if line.startswith("start")] == [
        "start sft", "start rl", "start eval"]


def test_stages_waiting_on_each_other_or_on_no_stage_are_refused(tmp_path):
    one, other = _probe(tmp_path, "one", needs=("other",)), _probe(tmp_path, "other", needs=("one",))
    for workers in (1, 2):
        with pytest.raises(RuntimeError, match="wait on each other.*'one': \\['other'\\]"):
            stages.run_side_by_side([[one], [other]], workers)
    with pytest.raises(ValueError, match="'one' needs \\['other'\\], which no stream runs"):
        stages.run_side_by_side([[one]], 1)
    with pytest.raises(RuntimeError, match="'other' is read before it finished"):
        stages.run_side_by_side([[one]], 1, finished={"other": other.marker})  # named, but it never ran
    alone = _probe(tmp_path, "other")
    stages.run_side_by_side([[alone]], 1)
    stages.run_side_by_side([[one]], 1, finished={"other": alone.marker})  # finished before: it runs
    assert (tmp_path / "one").is_dir()


def test_after_a_failed_stage_no_other_starts(tmp_path, monkeypatch):
    ran = []

    def call(main, argv):
        ran.append(argv[0])
        if argv[0] == "fails":
            raise RuntimeError("killed")

    monkeypatch.setattr(stages, "call", call)
    logs = tmp_path / "logs"
    stage = {name: stages.Stage(name, "demo", [name], logs / f"{name}.log") for name in ("fails", "after", "beside")}
    with pytest.raises(RuntimeError, match="killed"):
        stages.run_side_by_side([[stage["fails"], stage["after"]], [stage["beside"]]], 1)
    assert ran == ["fails"]


def test_a_stage_reads_the_run_folder_another_stage_made_when_it_starts(tmp_path, monkeypatch):
    """A run's folder is numbered when it runs (a resumed SFT makes 2_...), so an RL stage queued before the SFT
    ran names its checkpoint by :class:`stages.LatestRun`, found when the RL stage starts."""
    runs, seen = tmp_path / "runs", []

    def call(main, argv):
        if argv[0] == "sft":
            for number in (1, 2):
                (runs / f"{number}_supervised_pretrain").mkdir(parents=True)
        seen.append(argv)

    monkeypatch.setattr(stages, "call", call)
    latest = stages.LatestRun("--load_dir=", runs, "supervised_pretrain", "checkpoint-9")
    logs = tmp_path / "logs"
    rl = stages.Stage("rl", "demo", ["rl", latest], logs / "rl.log", needs=("sft",))
    stages.run_side_by_side([[rl], [stages.Stage("sft", "demo", ["sft"], logs / "sft.log")]], 1)
    assert seen[-1] == ["rl", f"--load_dir={runs / '2_supervised_pretrain' / 'checkpoint-9'}"]
    done = json.loads((logs / "rl.done.json").read_text())  # the marker holds the command as it ran
    assert done["key"]["command"] == ["demo", *seen[-1]]
    assert done["key"]["reads"] == {"sft": json.loads((logs / "sft.done.json").read_text())["token"]}


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_stages_side_by_side_write_what_they_write_alone(tmp_path, workers):
    """Two streams of data-generation stages, in this process or in two workers: the same files."""
    def stage(seed: int) -> stages.Stage:
        out = tmp_path / f"data-{seed}"
        return stages.Stage(f"data {seed}", "data_gen.taxi.reflection",
                          [*TAXI.task, "--api=oracle", "--num_episodes=3", f"--output_dir={out}", f"--seed={seed}"],
                          tmp_path / "logs" / f"data-{seed}.log")

    seconds = stages.run_side_by_side([[stage(0)], [stage(1), stage(2)]], workers)
    assert sorted(seconds) == ["data 0", "data 1", "data 2"]
    for seed in range(3):
        assert "[taxi.reflection] episodes: 3" in (tmp_path / "logs" / f"data-{seed}.log").read_text()
        alone = tmp_path / f"alone-{seed}"
        stages.call(data_gen.taxi.reflection.main, [*stage(seed).argv[:-2], f"--output_dir={alone}", f"--seed={seed}"])
        assert (alone / "data_reflection.json").read_bytes() == (tmp_path / f"data-{seed}" / "data_reflection.json").read_bytes()


def test_a_killed_demo_takes_its_stage_processes_with_it(tmp_path):
    """kill -9 of the demo (the parent of its stage pool) ends the stage processes within seconds, instead of
    leaving them to train on, orphaned."""
    pids = tmp_path / "pids"
    parent = subprocess.Popen([sys.executable, "-c", f"""
import multiprocessing, os, time
from concurrent.futures import ProcessPoolExecutor
from runner import stages
with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"), initializer=stages.exit_with,
                         initargs=(os.getpid(), 0.1)) as pool:
    futures = [pool.submit(time.sleep, 120) for _ in range(2)]
    time.sleep(1)
    open({str(pids)!r}, "w").write(" ".join(map(str, pool._processes)))
    time.sleep(120)
"""], cwd=Path(demo.__file__).parent)
    deadline = time.time() + 120
    while not (pids.is_file() and pids.read_text().strip()) and time.time() < deadline:
        time.sleep(0.2)
    children = [int(pid) for pid in pids.read_text().split()]
    assert len(children) == 2 and all(_alive(pid) for pid in children)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 30
    while any(_alive(pid) for pid in children) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in children)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped by init, counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_pretrained_model_runs_the_columns_recipe_for_it(capsys, monkeypatch):
    import recipes.pretrained
    from recipes import RECIPES

    monkeypatch.setattr(recipes.pretrained, "cuda_available", lambda: False)
    for native in (True, False, None):  # bfloat16 only where the CPU computes it; emulated, it is slower than float32
        monkeypatch.setattr(recipes.pretrained, "cpu_native_bf16", lambda native=native: native)
        recipe, explore = TAXI.pretrained("/models/m.gguf"), RECIPES["auto_explore"].pretrained("/models/m.gguf")
        assert ("--cpu_bf16" in recipe.model) is bool(native) and ("--cpu_bf16" in explore.model) is bool(native)
        # in float32 the runner says first that its times were measured in bfloat16 (README: 72 minutes a seed)
        assert (recipe.notice is None) is bool(native) and (explore.notice is None) is bool(native)
        if not native:
            assert all(part in recipe.notice for part in ("float32", "400 steps", "about 3 hours", "72 minutes"))
    monkeypatch.setattr(recipes.pretrained, "cuda_available", lambda: True)  # a GPU: bfloat16, nothing to say
    assert TAXI.pretrained("/models/m.gguf").notice is None
    pretrained = TAXI.pretrained("/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert pretrained.model_name == "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert pretrained.model_label == "SmolLM2-135M-Instruct.Q4_1.gguf" and TAXI.model_label == "tiny-gpt2"
    assert pretrained.name != TAXI.name  # its own results folder
    # the paper's LoRA r 64 / alpha 16 and RL lr 2e-4; the same task and held-out episodes. Its data ("oracle +
    # random 0.5", the paper's 0.9) and SFT rates come from validation ablations, each listed as a departure
    assert {"--use_peft", "--lora_r=64", "--lora_alpha=16"} <= set(pretrained.model)
    assert pretrained.extra["data_random_prob"] == 0.5 and pretrained.budget["rl_learning_rate"] == 2e-4
    assert {role: spec.learning_rate for role, spec in pretrained.sft.items()} == {
        "reflector": 2e-3, "policy": 1e-3, "plain": 1e-3}
    departures = " ".join(what for what, _ in pretrained.departures)
    assert all(part in departures for part in ("oracle + random 0.5 (the paper: 0.9)", "reflector's SFT",
                                               "policies' SFT at lr 0.001 (the paper: 0.0002)"))
    assert pretrained.task == TAXI.task and pretrained.evaluations == TAXI.evaluations
    # its data steps label the SFT texts with the model's own alphabet
    steps = pretrained.data(pretrained, 0, Path("/tmp/x"))
    assert any(f"--model_name={pretrained.model_name}" in argv for _, argv in steps)
    # a column without a recipe for a pretrained model says so in one line
    with pytest.raises(SystemExit) as stop:
        demo.main(["--task", "alfworld", "--model_name", "/models/m.gguf"])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--model_name" in error and "alfworld" in error and "taxi_pickup" in error


def test_one_model_file_is_one_setting_whatever_path_names_it(tmp_path, monkeypatch):
    """A relative, an absolute and a linked path to one .gguf file key the seed alike, and so do those to one
    results folder: named another way, the model once made every stage of a finished seed run again
    (utils/model_paths.canonical_model_name)."""
    from utils import model_paths

    model = tmp_path / "models" / "m.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF")
    (tmp_path / "link").symlink_to(model.parent)
    seen = []

    def stop(recipe, seed, folder, *args, **kwargs):
        seen.append(recipe.settings(seed, folder / "data"))  # what a seed is keyed by, its folder's path in it
        raise SystemExit(0)

    monkeypatch.setattr(demo.models, "resolve_model_path", lambda name: name)
    monkeypatch.setattr(demo, "finished_or_run", stop)
    monkeypatch.chdir(tmp_path)
    for spelling in ("models/m.gguf", str(model), "./link/../models/m.gguf", str(tmp_path / "link" / "m.gguf")):
        with pytest.raises(SystemExit):
            demo.main(["--task", "auto_explore", "--model_name", spelling, "--ckpt_path", str(tmp_path / "out")])
    # and the results folder, named through a link or relative to the working folder, is one folder too
    (tmp_path / "out").mkdir()
    (tmp_path / "out-link").symlink_to(tmp_path / "out")
    for folder in ("out", "out-link", str(tmp_path / "out-link")):
        with pytest.raises(SystemExit):
            demo.main(["--task", "auto_explore", "--model_name", str(model), "--ckpt_path", folder])
    assert len(seen) == 7 and all(settings == seen[0] for settings in seen)
    assert f"--model_name={model.resolve()}" in seen[0]["model"] or str(model.resolve()) in json.dumps(seen[0])
    # names that are no local path stay as given
    assert model_paths.canonical_model_name("tiny-gpt2") == "tiny-gpt2"
    assert model_paths.canonical_model_name("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"


@pytest.mark.slow
def test_a_pretrained_models_table_joins_every_column_it_has_finished(tmp_path):
    """Columns on a pretrained model run one at a time (a seed of AutoExplore spans sessions): the paper's table on
    that model is made from every column whose results.json is on disk, the others "not run"."""
    model = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    explore = RECIPES["auto_explore"].pretrained(model)
    rows = [{"name": "SFT only", "levels": {"depth 1": {"success": 0.05}, "depth 2": {"success": 0.0}}},
            {"name": "Reflect-RL", "levels": {"depth 1": {"success": 0.20}, "depth 2": {"success": 0.04}}}]
    runs = {"0": {"results": rows}, "1": {"results": [{**rows[1], "levels": {"depth 1": {"success": 0.30},
                                                                               "depth 2": {"success": 0.06}}}]}}
    (tmp_path / explore.name).mkdir()
    (tmp_path / explore.name / "results.json").write_text(json.dumps(runs))
    name, table = demo.pretrained_table(tmp_path, model)
    assert name == "paper_table-SmolLM2-135M-Instruct.Q4_1.gguf.md"
    assert "SmolLM2-135M-Instruct.Q4_1.gguf under LoRA, offline, CPU; seeds 0, 1" in table
    reflect_rl = next(line for line in table.splitlines() if line.startswith("| Reflect-RL |"))
    assert "| 25.0% (20.0–30.0) / 36% | 5.0% (4.0–6.0) / 17% | not run / 58% |" in reflect_rl  # Taxi pickup: not yet
    assert "| 5.0% (5.0–5.0) / 4% |" in next(line for line in table.splitlines() if line.startswith("| SFT only |"))


def test_learners_are_compared_at_the_same_episode_budget(tmp_path, small, monkeypatch):
    recipe = RECIPES[TAXI.name]
    monkeypatch.setitem(RECIPES, TAXI.name, dataclasses.replace(recipe, budget=dict(recipe.budget, rl_batch=8)))
    assert demo.main([f"--ckpt_path={tmp_path}", "--learners", "pg", "refuel", "gigpo", "--reflection", "with",
                      *ONE_PROCESS]) == 0
    root = tmp_path / "demo" / "taxi_pickup-learners"
    learners = ["pg, with reflection", "refuel, with reflection", "gigpo, with reflection"]
    rows = [r["name"] for r in json.loads((root / "results.json").read_text())["0"]["results"]]
    assert rows == ["SFT only, with reflection", *learners]  # no run starts from the plain SFT policy
    # the column's data and SFT models, made in its own seed folder (make demo's), where its run keeps them
    assert sorted(path.name for path in (tmp_path / "demo" / "seed-0" / "runs").glob("sft-*")) == \
        ["sft-policy", "sft-reflector"]
    assert (tmp_path / "demo" / "seed-0" / "logs" / "sft-policy.done.json").is_file()
    assert not list((root / "seed-0" / "runs").glob("sft-*")) and not (root / "seed-0" / "data").exists()
    folder = root / "seed-0"
    assert (folder / "learners_with_reflection.png").stat().st_size > 10_000
    played, trainers, replay = {}, {}, {}
    for run in _rl_runs(folder):
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        played[run.parent.name] = [r["episodes_played"] for r in records if "episodes_played" in r]
        settings = (run / "setting.yml").read_text()
        trainers[run.parent.name] = next(line.split(": ")[1] for line in settings.splitlines()
                                         if line.startswith("trainer: "))
        replay[trainers[run.parent.name]] = f"replay_batch_size: {recipe.budget['rl_replay']}" in settings.splitlines()
        assert "reflect_load_dir: " in settings
    assert trainers == {"rl-pg-with-reflection": "pg", "rl-refuel-with-reflection": "refuel",
                        "rl-gigpo-with-reflection": "gigpo"}
    # the learners that replay successes by default (rl_algorithms/defaults.py) replay the recipe's count
    assert replay == {"pg": True, "gigpo": True, "refuel": False}
    # each learner plays 8 episodes an iteration: REFUEL 4 and a branch of each, GiGPO 2 starts 4 times each
    assert all(counts == [8, 8] for counts in played.values()), played
    assert json.loads((root / "results.json").read_text())["0"]["rl_episodes"] == dict.fromkeys(learners, 16)
    assert "Episodes played in RL training: pg, with reflection 16, refuel, with reflection 16" in \
        (folder / "results.md").read_text()
    logged = [json.loads(x) for x in (next(run_dirs(folder / "runs" / "rl-gigpo-with-reflection", "rl_finetune")[0]
                                           .glob("checkpoint-*")) / "episodes.jsonl").read_text().splitlines()]
    assert sorted(e["group"] for e in logged if e["iteration"] == logged[0]["iteration"]) == [0, 0, 0, 0, 1, 1, 1, 1]


def test_the_runner_refuses_what_it_cannot_run(capsys):
    from recipes import learners

    cases = [(["--learners", "pg", "sac"], "sac"), (["--learners", "pg", "pg"], "once"),
             (["--seed", "-1"], "--seed: must be in [0, 2**32 - 1], got -1"),  # not in the first stage's process
             (["--seeds", "0", str(2**32)], "--seeds: each in [0, 2**32 - 1]"),
             (["--model_name", "/models/none.gguf"], "--model_name: no such GGUF file '/models/none.gguf'"),
             (["--ckpt_path", __file__], f"--ckpt_path: {__file__} is a file, not a folder"),
             (["--learners", "pg", "--task", "all"], "one column"), (["--reflection", "with"], "only with --learners")]
    for argv, said in cases:
        with pytest.raises(SystemExit) as stop:
            demo.main(argv)
        assert stop.value.code == 2
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert said in error and error.startswith("demo.py: error: --"), error
    # no abbreviations (--worker was --workers, and ran the demo), a typo named with the flag it was meant to be
    for argv, said in ((["--task", "taxi_pickup", "--worker", "2"], "unknown flag --worker (did you mean --workers?)"),
                       (["--sed", "3"], "unknown flag --sed (did you mean --seed?)"), (["3"], "'3' follows no flag")):
        with pytest.raises(SystemExit) as stop:
            demo.main(argv)
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert stop.value.code == 2 and error.startswith(f"demo.py: error: {said}"), error
    odd = dataclasses.replace(TAXI, budget=dict(TAXI.budget, rl_batch=6))
    with pytest.raises(ValueError, match="group size 4"):
        learners.compare(odd, ["grpo"])
    compared = learners.compare(TAXI, ["pg", "rloo"], "both")
    assert list(compared.rl) == ["pg, with reflection", "rloo, with reflection", "pg, w/o reflection",
                                 "rloo, w/o reflection"]
    assert [compared.rl[name].trainer for name in compared.rl] == ["pg", "rloo", "pg", "rloo"]
    assert {compared.rl[name].iterations for name in compared.rl} == {TAXI.rl["Reflect-RL"].iterations}
    assert compared.rl["rloo, w/o reflection"].policy == "plain" and compared.rl["rloo, w/o reflection"].reflector is None
    assert [row.name for row in compared.rows][:2] == ["SFT only", "SFT only, with reflection"]
    assert set(compared.sft) == {"reflector", "policy", "plain"} and compared.sft_streams == TAXI.sft_streams
    without = learners.compare(TAXI, ["gigpo"], "without")
    assert [row.name for row in without.rows] == ["SFT only", "gigpo, w/o reflection"] and set(without.sft) == {"plain"}
    assert without.sft_streams == (("plain",),) and without.accuracy is None
