"""Refactors of the RL core must change no number; a change to a learner's maths must fail here.

A fixed-seed run of each learner is compared with ``tests/golden/learner_runs.json``:
* the discrete record exactly: every episode's labels, rewards, reflections and success, and
  each iteration's counts (tokens, REFUEL pairs, skipped updates, curriculum level);
* the floats (log-probabilities, entropies, losses, gradient norms, adapter weight sums) within
  tolerances set just above how far they move across CPU code paths and well below what one
  optimiser step changes (both measured; see FLOAT_SPREAD and ONE_STEP below).

The golden file is only ever rewritten on purpose, when a change is *meant* to change the
numbers: ``REFLECTRL_WRITE_GOLDEN=1 pytest tests/test_learner_golden.py``, and the commit says why.
"""

import json
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import rl_algorithms.pg
import rl_algorithms.ppo
import rl_algorithms.refuel
import rl_finetune
from utils.checkpoints import run_dirs

# CPU-path-sensitive: run again by make test's portable leg, on the AVX2 path (utils/cpu.py)
pytestmark = pytest.mark.cpu_path

GOLDEN = Path(__file__).parent / "golden" / "learner_runs.json"
COMMON = dict(env="taxi", taxi_curriculum=True, curriculum_index=0, per_device_eval_batch_size=3,
              per_device_train_batch_size=4, learning_rate=1e-3, horizon=4, max_steps=3, save_steps=3, seed=7,
              pickup_reward="add")  # the Taxi rule of the golden runs' time (the paper's is "replace")
CASES = {
    # The curriculum's full task played out by the oracle after the first decision (the bandit once named
    # --first_step, without a curriculum: the full task with the bonus then).
    "pg_none_replay": dict(trainer="pg", baseline="none", replay_batch_size=2, curriculum_index=2,
                           oracle_completion=True),
    "pg_mean_reflect": dict(trainer="pg", baseline="mean", reflect=True, reflect_max_new_tokens=6),
    "pg_critic": dict(trainer="pg", baseline="critic", replay_buffer_size=0),
    "ppo_mean": dict(trainer="ppo", baseline="mean", ppo_epochs=2),
    "ppo_critic_reflect": dict(trainer="ppo", baseline="critic", ppo_epochs=2, reflect=True, reflect_max_new_tokens=6),
    "refuel": dict(trainer="refuel"),
    "refuel_reflect": dict(trainer="refuel", reflect=True, reflect_max_new_tokens=6),
}

# Largest difference seen between these runs under ATEN_CPU_CAPABILITY default / avx2 / avx512,
# 1 or 2 threads, and oneDNN on or off (AMD EPYC, torch 2.13.0+cpu): log-probabilities 1.1e-6
# absolute, losses 1.4e-6 relative, weight statistics 6.5e-7 relative. Threads and oneDNN moved
# nothing; the vector width did.
FLOAT_SPREAD = {"logprob": 1.1e-6, "loss": 1.4e-6, "weights": 6.5e-7}
# Smallest change one optimiser step (lr 1e-3) makes to any adapter tensor's sum of squares or of
# absolute values, over all cases (checkpoint-2 against checkpoint-3 of the same run).
ONE_STEP = {"weights": 1.7e-3}
TOLERANCE = {"logprob": 2e-5, "loss": 2e-5, "weights": 2e-5}
# Metrics that are floats only as means of the discrete record; every other float metric is computed
# by the network (loss, entropy, approx_kl, ...) and compared within TOLERANCE; ints and strings exactly.
RECORD_FLOAT_METRICS = {"success", "cost", "episode_length"}
IGNORED_METRICS = {"seconds", "reflect_seconds", "policy_seconds"}  # wall-clock


def _weight_stats(tensor: torch.Tensor) -> list[float]:
    """Sum, sum of squares and sum of absolute values (the first alone cancels: kept, compared
    against the third)."""
    t = tensor.double()
    return [float(t.sum()), float((t ** 2).sum()), float(t.abs().sum())]


def _fingerprint(run: Path) -> dict:
    checkpoint = run / "checkpoint-3"
    episodes = [json.loads(line) for line in (checkpoint / "episodes.jsonl").read_text().splitlines()]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    weights = load_file(str(checkpoint / "adapter_model.safetensors"))
    return {
        "episodes": [{"seed": e["seed"], "success": e["success"], "cost": e["cost"],
                      "labels": [s["label"] for s in e["steps"]], "rewards": [s["reward"] for s in e["steps"]],
                      "reflections": [s["reflection"] for s in e["steps"]],
                      "logprobs": [s["logprob"] for s in e["steps"]]} for e in episodes],
        "metrics": [{k: v for k, v in m.items() if k not in IGNORED_METRICS} for m in metrics],
        "weights": {k: _weight_stats(v) for k, v in sorted(weights.items())},
    }


def _close(got: float | None, want: float | None, tolerance: float) -> bool:
    if got is None or want is None:
        return got is want
    return math.isclose(got, want, rel_tol=tolerance, abs_tol=tolerance * 1e-1)


def differences(got: dict, want: dict) -> list[str]:
    """Every way ``got`` departs from ``want``: a discrete field at all, a float beyond TOLERANCE."""
    found = []
    if len(got["episodes"]) != len(want["episodes"]):
        return [f"{len(got['episodes'])} episodes, golden {len(want['episodes'])}"]
    for i, (g, w) in enumerate(zip(got["episodes"], want["episodes"])):
        found += [f"episode {i}: {key}" for key in ("seed", "success", "labels", "rewards", "reflections")
                  if g[key] != w[key]]
        if not math.isclose(g["cost"], w["cost"], abs_tol=1e-9):
            found.append(f"episode {i}: cost {g['cost']} != {w['cost']}")
        found += [f"episode {i} step {t}: logprob {a:.7f} != {b:.7f}"
                  for t, (a, b) in enumerate(zip(g["logprobs"], w["logprobs"]))
                  if abs(a - b) > TOLERANCE["logprob"]]
    if len(got["metrics"]) != len(want["metrics"]):
        return [*found, f"{len(got['metrics'])} metric lines, golden {len(want['metrics'])}"]
    for i, (g, w) in enumerate(zip(got["metrics"], want["metrics"])):
        if g.keys() != w.keys():
            found.append(f"iteration {i + 1}: metrics {sorted(g.keys() ^ w.keys())} added or gone")
        for key in g.keys() & w.keys():
            if not isinstance(w[key], float):
                same = g[key] == w[key]
            elif key in RECORD_FLOAT_METRICS:
                same = isinstance(g[key], float) and math.isclose(g[key], w[key], abs_tol=1e-9)
            else:
                same = _close(g[key], w[key], TOLERANCE["loss"])
            if not same:
                found.append(f"iteration {i + 1}: {key} {g[key]} != {w[key]}")
    if got["weights"].keys() != want["weights"].keys():
        return [*found, "adapter tensors differ"]
    for key, (total, squares, absolute) in want["weights"].items():
        g_total, g_squares, g_absolute = got["weights"][key]
        if (abs(g_total - total) > TOLERANCE["weights"] * absolute
                or not math.isclose(g_squares, squares, rel_tol=TOLERANCE["weights"])
                or not math.isclose(g_absolute, absolute, rel_tol=TOLERANCE["weights"])):
            found.append(f"{key}: weight statistics {got['weights'][key]} != {want['weights'][key]}")
    return found


def _run(make_args, tmp_path, case: str) -> dict:
    assert rl_finetune.main(make_args(**{**COMMON, **CASES[case]})) == 0
    (run,) = run_dirs(tmp_path / "results", "rl_finetune")
    return _fingerprint(run)


def test_tolerances_sit_between_the_cpu_spread_and_one_step():
    for kind, tolerance in TOLERANCE.items():
        assert tolerance >= 10 * FLOAT_SPREAD[kind], kind
    assert TOLERANCE["weights"] * 50 <= ONE_STEP["weights"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="golden numbers were taken on the CPU")
@pytest.mark.parametrize("case", sorted(CASES))
def test_fixed_seed_run_matches_golden(make_args, tmp_path, case):
    got = _run(make_args, tmp_path, case)
    if os.environ.get("REFLECTRL_WRITE_GOLDEN") == "1":
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
        golden[case] = got
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"golden numbers of {case} written")
    assert differences(got, json.loads(GOLDEN.read_text())[case]) == []


def _without_baseline(loss):
    return lambda logprobs, costs_to_go, baseline, normaliser: loss(logprobs, costs_to_go, 0.0, normaliser)


def _advantage_sign_flipped(loss):
    return lambda logprobs, old, costs_to_go, baseline, *rest: loss(logprobs, old, 2 * baseline - costs_to_go,
                                                                    baseline, *rest)


def _eta_sign_flipped(loss):
    return lambda *tensors_and_eta: loss(*tensors_and_eta[:-1], -tensors_and_eta[-1])


MUTATIONS = {  # one-line changes to a learner's maths, each caught by the golden comparison
    "pg_mean_reflect": (rl_algorithms.pg, "pg_loss", _without_baseline),
    "ppo_mean": (rl_algorithms.ppo, "ppo_loss", _advantage_sign_flipped),
    "refuel": (rl_algorithms.refuel, "refuel_loss", _eta_sign_flipped),
}


@pytest.mark.skipif(torch.cuda.is_available(), reason="golden numbers were taken on the CPU")
@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_a_change_to_the_maths_fails_the_golden(make_args, tmp_path, monkeypatch, case):
    module, name, mutate = MUTATIONS[case]
    monkeypatch.setattr(module, name, mutate(getattr(module, name)))
    found = differences(_run(make_args, tmp_path, case), json.loads(GOLDEN.read_text())[case])
    assert any("weight statistics" in line for line in found), found  # the floats alone catch it
