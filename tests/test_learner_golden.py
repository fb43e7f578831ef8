"""Refactors of the RL core must change no number.

A fixed-seed run of each learner is compared with what the code produced when this test
was written (``tests/golden/learner_runs.json``, made by the RL loop of commit eeadb9f,
before the learners moved behind one interface): the same episodes (every label, reward,
reflection), the same losses, and the same adapter weights.

The golden file is only ever rewritten on purpose, when a change is *meant* to change
the numbers: ``REFLECTRL_WRITE_GOLDEN=1 pytest tests/test_learner_golden.py``, and the
commit says why. Weights are compared with a tolerance that absorbs float reduction
order, far below one optimiser step (lr 1e-3).
"""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import rl_finetune
from checkpoints import run_dirs

GOLDEN = Path(__file__).parent / "golden" / "learner_runs.json"
COMMON = dict(env="taxi", taxi_curriculum=True, curriculum_index=0, per_device_eval_batch_size=3,
              per_device_train_batch_size=4, learning_rate=1e-3, horizon=4, max_steps=3, save_steps=3, seed=7,
              pickup_reward="add")  # the Taxi rule of the golden runs' time (the paper's is "replace")
CASES = {
    "pg_none_replay": dict(trainer="pg", baseline="none", replay_batch_size=2, curriculum_index=None,
                           taxi_curriculum=False, first_step=True),
    "pg_mean_reflect": dict(trainer="pg", baseline="mean", reflect=True, reflect_max_new_tokens=6),
    "pg_critic": dict(trainer="pg", baseline="critic", replay_buffer_size=0),
    "ppo_mean": dict(trainer="ppo", baseline="mean", ppo_epochs=2),
    "ppo_critic_reflect": dict(trainer="ppo", baseline="critic", ppo_epochs=2, reflect=True, reflect_max_new_tokens=6),
    "refuel": dict(trainer="refuel"),
    "refuel_reflect": dict(trainer="refuel", reflect=True, reflect_max_new_tokens=6),
}


def _fingerprint(run: Path) -> dict:
    checkpoint = run / "checkpoint-3"
    episodes = [json.loads(line) for line in (checkpoint / "episodes.jsonl").read_text().splitlines()]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    weights = load_file(str(checkpoint / "adapter_model.safetensors"))
    return {
        "episodes": [{"seed": e["seed"], "success": e["success"], "cost": round(e["cost"], 6),
                      "labels": [s["label"] for s in e["steps"]], "rewards": [s["reward"] for s in e["steps"]],
                      "reflections": [s["reflection"] for s in e["steps"]],
                      "logprobs": [round(s["logprob"], 4) for s in e["steps"]]} for e in episodes],
        "loss": [m["loss"] for m in metrics],
        "weights": {k: [float(v.double().sum()), float((v.double() ** 2).sum())] for k, v in sorted(weights.items())},
    }


@pytest.mark.skipif(torch.cuda.is_available(), reason="golden numbers were taken on the CPU")
@pytest.mark.parametrize("case", sorted(CASES))
def test_fixed_seed_run_matches_golden(make_args, tmp_path, case):
    assert rl_finetune.main(make_args(**{**COMMON, **CASES[case]})) == 0
    (run,) = run_dirs(tmp_path / "results", "rl_finetune")
    got = _fingerprint(run)
    if os.environ.get("REFLECTRL_WRITE_GOLDEN") == "1":
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
        golden[case] = got
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"golden numbers of {case} written")
    want = json.loads(GOLDEN.read_text())[case]
    assert len(got["episodes"]) == len(want["episodes"])
    for i, (g, w) in enumerate(zip(got["episodes"], want["episodes"])):
        for key in ("seed", "success", "labels", "rewards", "reflections"):
            assert g[key] == w[key], f"episode {i}: {key}"
        assert g["cost"] == pytest.approx(w["cost"], abs=1e-6)
        assert g["logprobs"] == pytest.approx(w["logprobs"], abs=2e-4)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-6)
    assert got["weights"].keys() == want["weights"].keys()
    for key, (total, squares) in want["weights"].items():
        assert got["weights"][key] == pytest.approx([total, squares], rel=1e-4, abs=1e-6), key
