"""benchmarks.rl_iteration's rows on a CPU without native bfloat16, where bf16 rows would time the emulation (hours on
SmolLM2): the rows about bf16 itself are skipped and said to be, the later ones run in float32 and are named so, unless
``--emulated_bf16`` asks for every row as it is."""

import json

import pytest

from benchmarks import rl_iteration


@pytest.fixture
def played(monkeypatch):
    """The rows' command lines, with a stand-in for the RL iterations (the real ones: tests/test_readme.py)."""
    argvs = []

    def play(argv):
        argvs.append(argv)
        return {"seconds": [2.0, 1.0], "reflect_seconds": [0.5, 0.25], "policy_seconds": [0.5, 0.25],
                "decisions_per_iteration": [4, 4], "episodes": [json.dumps({"decisions": []})], "hit_rate": 0.0, "decisions": 8,
                "draft_acceptance": 0.0, "draft_passes": 0}

    monkeypatch.setattr(rl_iteration, "play_iterations", play)
    monkeypatch.setattr(rl_iteration, "cuda_available", lambda: False)
    return argvs


BF16_ROWS = [row.name for row in rl_iteration.ROWS if "--cpu_bf16" in row.flags]
SKIPPED = [row.name for row in rl_iteration.ROWS if not row.in_float32]


@pytest.mark.parametrize("native", [False, None])  # None: /proc/cpuinfo could not be read
def test_without_native_bf16_the_bf16_rows_are_skipped_or_run_in_float32(played, monkeypatch, tmp_path, capsys, native):
    monkeypatch.setattr(rl_iteration, "cpu_native_bf16", lambda: native)
    assert SKIPPED and set(SKIPPED) < set(BF16_ROWS)  # some bf16 rows have a float32 meaning (the reused pass)
    assert rl_iteration.main(["--out", str(tmp_path / "rows.json")]) == 0
    assert len(played) == len(rl_iteration.ROWS) - len(SKIPPED)
    assert not any("--cpu_bf16" in argv for argv in played)
    assert sum("--reuse_rollout_pass" in argv for argv in played) == 2  # its row and the static cache's, in float32
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["row"] for r in rows if "skipped" in r] == SKIPPED
    ran = [r["row"] for r in rows if "skipped" not in r]
    assert ran == [f"{row.name} (float32)" if row.name in BF16_ROWS else row.name
                   for row in rl_iteration.ROWS if row.in_float32]
    assert all("s_per_iteration" in r for r in rows if "skipped" not in r)
    said = capsys.readouterr().out
    assert "No native bfloat16" in said and "--emulated_bf16" in said
    assert all(name in said.split("No native bfloat16")[1] for name in SKIPPED)


@pytest.mark.parametrize("how", ["native", "asked", "cuda"])
def test_the_bf16_rows_run_where_bf16_is_native_on_cuda_or_when_asked(played, monkeypatch, tmp_path, capsys, how):
    monkeypatch.setattr(rl_iteration, "cpu_native_bf16", lambda: how == "native")
    if how == "cuda":
        monkeypatch.setattr(rl_iteration, "cuda_available", lambda: True)
    argv = ["--out", str(tmp_path / "rows.json"), *(["--emulated_bf16"] if how == "asked" else [])]
    assert rl_iteration.main(argv) == 0
    assert len(played) == len(rl_iteration.ROWS)
    assert not any("--emulated_bf16" in argv for argv in played)  # the benchmark's own flag, not the scripts'
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["row"] for r in rows] == [row.name for row in rl_iteration.ROWS] and not any("skipped" in r for r in rows)
    assert "No native bfloat16" not in capsys.readouterr().out
