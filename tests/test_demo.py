"""demo.py end to end, with its budget scaled down: every stage runs, the tables are complete,
and the seed plumbing holds (same seed, same table; another seed, other training episodes but
the same evaluation episodes)."""

import json

import pytest

import demo
from checkpoints import run_dirs
from evaluation import evaluate


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(demo, "DATA_EPISODES", 20)
    monkeypatch.setattr(demo, "SFT_STEPS", {"reflector": 4, "policy": 2, "plain": 2})
    monkeypatch.setattr(demo, "RL_ITERATIONS", {"Reflect-RL": 2, "SFT+RLFT w/o reflection": 2, "RLFT only": 2})
    monkeypatch.setattr(demo, "EVAL_EPISODES", 4)
    monkeypatch.setattr(demo, "PANEL_EVERY", 1)
    monkeypatch.setattr(demo, "PANEL_EPISODES", 2)
    monkeypatch.setattr(demo, "ACCURACY_EPISODES", 2)
    evaluated = []
    real = evaluate.test_episodes

    def recording(args, env, reps):
        starts = real(args, env, reps)
        evaluated.append([(s.seed, s.options) for s in starts])
        return starts

    monkeypatch.setattr(evaluate, "test_episodes", recording)
    return evaluated


def _training_seeds(folder) -> set[int]:
    seeds = set()
    for run in run_dirs(folder / "runs", "rl_finetune"):
        for checkpoint in run.glob("checkpoint-*"):
            seeds |= {json.loads(x)["seed"] for x in (checkpoint / "episodes.jsonl").read_text().splitlines()}
    return seeds


@pytest.mark.slow
def test_demo_runs_every_stage_and_seeds_are_plumbed_through(tmp_path, small):
    assert demo.main([f"--ckpt_path={tmp_path / 'a'}", "--seeds", "0", "1"]) == 0
    root = tmp_path / "a" / "demo"
    report = (root / "results.md").read_text()
    summary = [line for line in report.splitlines() if line.startswith("| ") and " | mean | " not in line
               and "%" in line and "±" not in line]
    assert [row.split(" | ")[0][2:] for row in summary] == list(demo.ROWS)
    for seed in (0, 1):
        folder = root / f"seed-{seed}"
        seed_report = (folder / "results.md").read_text()
        rows = [line for line in seed_report.splitlines() if line.startswith("| ") and "% ± " in line]
        assert [row.split(" | ")[0][2:] for row in rows] == list(demo.ROWS)
        assert all(row.rstrip(" |").endswith("| 4") for row in rows)  # every row: the same 4 episodes
        assert "| accuracy | " in seed_report
        assert (folder / "rl_curves.png").stat().st_size > 10_000
        assert len(run_dirs(folder / "runs", "rl_finetune")) == 3
        for run in run_dirs(folder / "runs", "rl_finetune"):  # the held-out panel was played
            records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            assert [r["step"] for r in records if "heldout_success" in r] == [0, 1, 2]
    results = json.loads((root / "results.json").read_text())
    assert [r["name"] for r in results["0"]["results"]] == list(demo.ROWS)
    assert set(results["0"]["timings"]) >= {"data generation (oracle writer)", "evaluation", "reflector accuracy"}

    # other seeds: other training episodes; every evaluation (final, panels, accuracy) on the same episodes
    assert _training_seeds(root / "seed-0").isdisjoint(_training_seeds(root / "seed-1"))
    data = [json.loads((root / f"seed-{s}" / "data" / "data_reflection.json").read_text()) for s in (0, 1)]
    assert [r["state"] for r in data[0]] != [r["state"] for r in data[1]]
    finals = [starts for starts in small if len(starts) == 4]
    assert len(finals) == 2 and finals[0] == finals[1]
    assert all(seed >= evaluate.HELD_OUT_SEED for starts in small for seed, _ in starts)

    # the same seed again: the same table
    assert demo.main([f"--ckpt_path={tmp_path / 'b'}", "--seed", "0"]) == 0
    again = json.loads((tmp_path / "b" / "demo" / "results.json").read_text())["0"]
    assert [(r["name"], r["levels"]) for r in again["results"]] == [(r["name"], r["levels"]) for r in results["0"]["results"]]
    assert again["reflector_accuracy"] == results["0"]["reflector_accuracy"]
