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

    def play(argv, count_flops=False):
        argvs.append(argv)
        # each row after the first halves the seconds and, counted, does 3/4 of the arithmetic of the row before
        row = len(argvs) - 1
        return {"seconds": [2.0, 0.5 ** row], "reflect_seconds": [0.5, 0.125 * 0.5 ** row],
                "policy_seconds": [0.5, 0.125 * 0.5 ** row], "decisions_per_iteration": [4, 4],
                "episodes": [json.dumps({"decisions": []})], "hit_rate": 0.0, "decisions": 8, "draft_acceptance": 0.0,
                "draft_passes": 0, **({"flops": 4e9 * 0.75 ** row, "peak_gflops": 10.0} if count_flops else {})}

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


def test_counted_arithmetic_gives_each_rows_share_of_the_peak_and_the_speed_up_it_bounds(played, monkeypatch, tmp_path,
                                                                                        capsys):
    """``--count_flops``: GFLOP per decision of the counted first iteration, the share of the product peak a row ran at
    (its seconds at the peak over its measured seconds), and the first row's seconds over this row's at the peak."""
    monkeypatch.setattr(rl_iteration, "cpu_native_bf16", lambda: True)
    assert rl_iteration.main(["--count_flops", "--out", str(tmp_path / "rows.json")]) == 0
    rows = json.loads((tmp_path / "rows.json").read_text())
    for index, row in enumerate(rows):
        gflop = 0.75 ** index  # 4 GFLOP x 0.75^row over 4 decisions
        assert row["gflop_per_decision"] == pytest.approx(gflop) and row["peak_gflops"] == 10.0
        assert row["share_of_peak"] == pytest.approx(gflop / 10 / (0.5 ** index / 4))  # s / decision: 0.5^row / 4
        assert row["speedup_bound"] == pytest.approx((1 / 4) / (gflop / 10))
    said = capsys.readouterr().out.split("Arithmetic (--count_flops")[1]
    assert "| everything off | 1.0 | 10 | 40% | 2.50x |" in said

    played.clear()
    assert rl_iteration.main([]) == 0  # without the flag: nothing counted, nothing said
    assert "Arithmetic" not in capsys.readouterr().out


def test_counting_the_arithmetic_plays_the_same_iterations(capsys):
    """The counter only watches: the same episodes with and without it, on tiny-gpt2; it needs a second iteration
    to time, and says so in one line."""
    argv = ["--model_name=tiny-gpt2", "--env=taxi", "--shrink_head", "--top_k=1", "--reflect_max_new_tokens=4",
            "--per_device_eval_batch_size=2", "--max_steps=2", "--no_use_peft", "--baseline=mean", "--horizon=4"]
    counted, plain = (rl_iteration.play_iterations(argv, count_flops=count) for count in (True, False))
    assert counted["episodes"] == plain["episodes"]
    assert counted["flops"] > 0 and counted["peak_gflops"] > 0 and "flops" not in plain

    from experiment_args import one_line_usage_errors

    capsys.readouterr()
    assert one_line_usage_errors("rl_iteration", rl_iteration.main, ["--count_flops", *argv, "--max_steps=1"]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert said == ["rl_iteration: error: --count_flops counts the first iteration and times the later ones: it needs "
                    "--max_steps 2 or more, got 1"]


def test_the_counter_counts_attention_on_a_cpu_as_written_out():
    """On a CPU, sdpa runs a fused kernel that torch's counter has no formula for. With the benchmark's counter, a
    forward and backward pass on sdpa counts what eager attention's products count, padded rows too, and the
    scores the fused backward computes again (Q times K transposed: half of the forward's two products)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    from utils import tiny_gpt2

    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 7, 8, 9, 10]])
    mask = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])
    total, forward = {}, {}
    for attention in ("sdpa", "eager"):
        model = AutoModelForCausalLM.from_pretrained(tiny_gpt2.tiny_gpt2_path(), attn_implementation=attention)
        for name, counter in (("benchmark", rl_iteration.flop_counter()), ("plain", FlopCounterMode(display=False))):
            with counter:
                model(input_ids=ids, attention_mask=mask).logits.sum().backward()
            total[attention, name] = counter.get_total_flops()
            forward[attention, name] = counter.get_flop_counts()["Global"].get(
                torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, 0)
    assert total["eager", "benchmark"] == total["eager", "plain"]
    assert forward["sdpa", "benchmark"] > 0 and total["sdpa", "plain"] < total["eager", "plain"]  # attention missed
    assert total["sdpa", "benchmark"] == total["eager", "plain"] + forward["sdpa", "benchmark"] // 2


def test_the_defaults_are_played_beside_everything_off_with_the_cpu_said(played, monkeypatch, tmp_path, capsys):
    """Rows 2 and 3 are what a user gets with no flag (in float32, and with --cpu_bf16); --rows plays some rows only,
    row 1 always (the others are measured against it); the CPU's capabilities are printed and kept with each row."""
    from utils import cpu

    monkeypatch.setattr(rl_iteration, "cpu_native_bf16", lambda: True)
    assert [row.flags for row in rl_iteration.ROWS[1:3]] == [(), ("--cpu_bf16",)]
    assert rl_iteration.main(["--rows", "2", "3", "--out", str(tmp_path / "rows.json")]) == 0
    assert len(played) == 3 and not set(rl_iteration.OFF) & set(played[1])  # the defaults: no optimisation off
    assert played[2] == [*played[1], "--cpu_bf16"]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["row"] for r in rows] == ["everything off", "the defaults", "the defaults with --cpu_bf16"]
    assert all(r["cpu"] == cpu.caps().describe() for r in rows)
    assert f"CPU: {cpu.caps().describe()}" in capsys.readouterr().out


def test_rows_out_of_range_are_refused_in_one_line(played, capsys):
    from experiment_args import one_line_usage_errors

    assert one_line_usage_errors("rl_iteration", rl_iteration.main, ["--rows", "0"]) == 2
    assert "--rows: each between 1 and" in capsys.readouterr().err and not played


def test_the_reference_path_benchmark_plays_each_workload_on_both_paths_in_turn(monkeypatch, tmp_path, capsys):
    from benchmarks import reference_path

    calls = []

    def timed(command, field, row, reference, threads):
        calls.append((command[0], reference))
        return 1.25 if reference else 1.0

    monkeypatch.setattr(reference_path, "timed", timed)
    assert reference_path.main(["--rounds", "2", "--out", str(tmp_path / "rows.json")]) == 0
    assert calls == [("benchmarks.sft_step", False), ("benchmarks.sft_step", True),  # each path first in turn
                     ("benchmarks.sft_step", True), ("benchmarks.sft_step", False),
                     ("benchmarks.rl_iteration", False), ("benchmarks.rl_iteration", True),
                     ("benchmarks.rl_iteration", True), ("benchmarks.rl_iteration", False)]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [round(r["cost"], 6) for r in rows] == [0.25, 0.25] and "+25%" in capsys.readouterr().out


@pytest.mark.parametrize("reference", [False, True])
def test_a_reference_path_run_reads_its_workloads_seconds(reference):
    """One real run of each path: the process starts on the path asked for, and its row's seconds are read back."""
    from benchmarks import reference_path

    command = ["benchmarks.rl_iteration", "--rows", "2", "--max_steps=2", "--per_device_eval_batch_size=2",
               "--reflect_max_new_tokens=4"]
    assert reference_path.timed(command, "s_per_iteration", 1, reference, threads=1) > 0


def test_two_process_exit_reads_each_ranks_threads_even_when_their_lines_mix():
    from benchmarks.two_process_exit import gloo_at_exit, kind

    mixed = ("[exit_probe] rank 1 threads at exit: python,gloo_tcp_loop,pt_gloo_runloop[exit_probe] rank 0 threads "
             "at exit: python,python\nterminate called without an active exception\n")
    assert gloo_at_exit(mixed) == {"1": 2, "0": 0}
    assert gloo_at_exit("[exit_probe] rank 0 threads at exit: python\n") == {"0": 0}
    assert kind(1, mixed) == "abort" and kind(1, "Traceback ...") == "exit 1"
