"""demo.py end to end, with its budget scaled down: every stage runs and the table is complete."""

import json

import pytest

import demo


@pytest.mark.slow
def test_demo_runs_every_stage_and_writes_the_table(tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "DATA_EPISODES", 20)
    monkeypatch.setattr(demo, "SFT_STEPS", {"reflector": 4, "policy": 2, "plain": 2})
    monkeypatch.setattr(demo, "RL_ITERATIONS", {"Reflect-RL": 2, "SFT+RLFT w/o reflection": 2, "RLFT only": 2})
    monkeypatch.setattr(demo, "EVAL_EPISODES", 4)
    assert demo.main([f"--ckpt_path={tmp_path}"]) == 0
    root = tmp_path / "demo"
    report = (root / "results.md").read_text()
    names = ["SFT only", "SFT only, with reflection", "RLFT only", "SFT+RLFT w/o reflection", "Reflect-RL"]
    rows = [line for line in report.splitlines() if line.startswith("| ") and "% ± " in line]
    assert [row.split(" | ")[0][2:] for row in rows] == names
    assert all(row.rstrip(" |").endswith("| 4") for row in rows)  # every row: the same 4 episodes
    results = json.loads((root / "results.json").read_text())
    assert [r["name"] for r in results["results"]] == names
    assert set(results["timings"]) >= {"data generation (oracle writer)", "evaluation"}
    assert (root / "rl_curves.png").stat().st_size > 10_000
    assert len(list((root / "runs").glob("*_rl_finetune"))) == 3
