"""rl_finetune.py end to end with tiny-gpt2 on Taxi: trainers, checkpoints, exact resume, NaN skips."""

import json

import pytest
import torch
from safetensors.torch import load_file

import rl_finetune
from utils import checkpoints, metrics, models

FAST = dict(env="taxi", taxi_curriculum=True, curriculum_index=0, oracle_completion=True, per_device_eval_batch_size=4,
            per_device_train_batch_size=8, learning_rate=1e-3, replay_batch_size=2)


def _runs(tmp_path):
    return checkpoints.run_dirs(tmp_path / "results", "rl_finetune")


def _adapter(checkpoint):
    return load_file(str(checkpoint / "adapter_model.safetensors"))


@pytest.mark.parametrize("trainer, extra", [("pg", {"baseline": "mean"}), ("pg", {"baseline": "critic"}),
                                            ("pg", {"baseline": "critic", "use_peft": False, "load_in_8bit": False}),
                                            ("ppo", {}), ("refuel", {"oracle_completion": False, "horizon": 4})])
def test_trainers_run_log_and_checkpoint(make_args, tmp_path, trainer, extra):
    args = make_args(**{**FAST, **extra, "trainer": trainer, "max_steps": 3, "save_steps": 2})
    assert rl_finetune.main(args) == 0
    (run,) = _runs(tmp_path)
    records = metrics.read_metrics(run)
    assert [r["step"] for r in records] == [1, 2, 3]
    for key in ("success", "cost", "loss", "entropy", "episode_length", "tokens", "seconds", "level", "nan_skips"):
        assert key in records[0], key
    # the two players' shares of each iteration's wall-clock (no reflector here)
    for record in records:
        assert 0 <= record["reflect_seconds"] < record["policy_seconds"] < record["seconds"]
    assert records[0]["level"] == "pickup"
    # the batch, and for REFUEL a branch of each of its episodes
    assert {r["episodes_played"] for r in records} == {args.per_device_eval_batch_size * (2 if trainer == "refuel" else 1)}
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    checkpoint = run / "checkpoint-2"
    weights = ("adapter_model.safetensors", "adapter_config.json") if extra.get("use_peft", True) else \
        ("model.safetensors", "config.json")  # --no_use_peft saves the whole model
    for name in (*weights, "tokenizer.json", checkpoints.SETTINGS_FILE, checkpoints.TRAINER_STATE_FILE, "episodes.jsonl"):
        assert (checkpoint / name).is_file(), name
    episodes = [json.loads(line) for line in (checkpoint / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 * 4 and {e["iteration"] for e in episodes} == {1, 2}
    state = torch.load(checkpoint / checkpoints.TRAINER_STATE_FILE, weights_only=True)
    assert state["step"] == 2 and state["optimizer"]["state"]
    assert (state["state"]["ranks"][0]["learner"]["critic"] is not None) == (extra.get("baseline") == "critic")
    assert records[0]["grad_norm"] >= 0 and records[0]["truncated_prompts"] == 0
    assert records[-1]["truncated_prompts_total"] == 0
    own = {"pg": ("replayed", "replay_size"), "ppo": ("approx_kl", "clip_fraction", "ppo_ratio_max"),
           "refuel": ("refuel_pairs",)}[trainer]
    for key in own:
        assert key in records[0], key


@pytest.mark.parametrize("baseline", [{"baseline": "mean"},  # the critic below trains at iteration 3, on 1-3:
                                      {"use_critic": True, "critic_update_freq": 3, "critic_update_iter": 2}])
def test_resume_is_exact(make_args, tmp_path, baseline):
    common = {**FAST, "trainer": "pg", **baseline, "replay_batch_size": 4}
    assert rl_finetune.main(make_args(**common, max_steps=4, save_steps=2)) == 0
    (straight,) = _runs(tmp_path)
    assert rl_finetune.main(make_args(**common, max_steps=4, save_steps=2,
                                      resume_from=str(straight / "checkpoint-2"))) == 0
    resumed = _runs(tmp_path)[-1]
    assert resumed != straight
    a, b = _adapter(straight / "checkpoint-4"), _adapter(resumed / "checkpoint-4")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert not torch.equal(a[next(iter(a))], _adapter(straight / "checkpoint-2")[next(iter(a))])
    straight_log, resumed_log = metrics.read_metrics(straight), metrics.read_metrics(resumed)
    assert [r["step"] for r in resumed_log] == [1, 2, 3, 4]
    for x, y in zip(straight_log, resumed_log):
        assert x["success"] == y["success"] and x["loss"] == pytest.approx(y["loss"], abs=1e-6)
    replay = torch.load(straight / "checkpoint-4" / checkpoints.TRAINER_STATE_FILE, weights_only=True)
    assert replay["state"]["ranks"][0]["learner"]["replay"]["episodes"], "the test should exercise the replay buffer"
    if "use_critic" in baseline:
        assert [r["critic_loss"] is not None for r in resumed_log] == [False, False, True, False]
        critics = [torch.load(run / "checkpoint-4" / checkpoints.TRAINER_STATE_FILE, weights_only=True)["state"]
                   ["ranks"][0]["learner"] for run in (straight, resumed)]
        for key, value in critics[0]["critic"].items():
            assert torch.equal(critics[1]["critic"][key], value), key
        assert critics[0]["critic_schedule"]["iterations"] == 1 and critics[0]["critic_schedule"]["data"]


def test_nan_loss_skips_the_update(make_args, tmp_path, monkeypatch):
    import rl_algorithms.pg

    real = rl_algorithms.pg.pg_loss
    monkeypatch.setattr(rl_algorithms.pg, "pg_loss", lambda *a: real(*a) * float("nan"))
    assert rl_finetune.main(make_args(**FAST, max_steps=2, save_steps=2)) == 0
    (run,) = _runs(tmp_path)
    assert [r["nan_skips"] for r in metrics.read_metrics(run)] == [1, 2]
    adapter = _adapter(run / "checkpoint-2")
    assert all(torch.count_nonzero(v) == 0 for k, v in adapter.items() if "lora_B" in k)  # never updated


def test_rl_from_an_sft_adapter_with_a_frozen_reflector(make_args, tmp_path):
    args = make_args()
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    model.save_pretrained(tmp_path / "policy")
    model.save_pretrained(tmp_path / "reflector")
    run_args = make_args(**FAST, max_steps=1, save_steps=1, shrink_head=True, load_dir=str(tmp_path / "policy"),
                         reflect_load_dir=str(tmp_path / "reflector"), reflect_max_new_tokens=8)
    assert rl_finetune.main(run_args) == 0
    (run,) = _runs(tmp_path)
    episodes = [json.loads(x) for x in (run / "checkpoint-1" / "episodes.jsonl").read_text().splitlines()]
    assert all(step["reflection"] for e in episodes for step in e["steps"])
    tuned = _adapter(run / "checkpoint-1")
    start = load_file(str(tmp_path / "policy" / "adapter_model.safetensors"))
    assert any(not torch.equal(tuned[k], start[k]) for k in start)


@pytest.mark.slow
def test_two_processes_roll_out_different_episodes_and_stay_in_sync(tmp_path):
    """Two ranks on the CPU (gloo) as ``accelerate launch --multi_gpu`` starts them, the run of
    ``benchmarks.two_process_exit`` (which measures how often it exits 0 under load). Each rank tears its process
    group down before it exits: a rank that still runs gloo's threads at exit aborts there now and then
    (utils/distributed.py), so that state is checked, not only this run's exit status."""
    import subprocess

    from benchmarks import two_process_exit
    from tests.conftest import REPO

    env = two_process_exit.environment()  # with PYTHONFAULTHANDLER: a rank killed by a signal shows its stack
    if torch.cuda.device_count() >= 2:  # one process per GPU where there are two; else both on the CPU, as in CI
        env.pop("CUDA_VISIBLE_DEVICES")
    result = subprocess.run(two_process_exit.command(REPO, tmp_path / "results"), cwd=REPO, capture_output=True,
                            text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-6000:]
    assert two_process_exit.gloo_at_exit(result.stderr) == {"0": 0, "1": 0}, result.stderr[-3000:]
    assert "gloo threads still run" not in result.stderr
    (run,) = _runs(tmp_path)  # only rank 0 writes
    state = torch.load(run / "checkpoint-2" / checkpoints.TRAINER_STATE_FILE, weights_only=True)
    ranks = state["state"]["ranks"]
    assert len(ranks) == 2 and ranks[0]["rng"] != ranks[1]["rng"]
    episodes = [json.loads(x) for x in (run / "checkpoint-2" / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 * 2 * 3 and len({e["seed"] for e in episodes}) == 12
    assert len(metrics.read_metrics(run)) == 2


def test_resume_with_other_settings_is_refused(make_args, tmp_path):
    assert rl_finetune.main(make_args(**FAST, max_steps=2, save_steps=1)) == 0
    (run,) = _runs(tmp_path)
    with pytest.raises(ValueError, match="--trainer='pg' there, 'ppo' here"):
        rl_finetune.main(make_args(**FAST, max_steps=2, save_steps=1, trainer="ppo",
                                   resume_from=str(run / "checkpoint-1")))


def _cli(**values) -> list[str]:
    return [f"--{key}={value}" for key, value in values.items()]


def test_resume_from_alone_continues_with_the_saved_settings(tmp_path):
    from experiment_args import parse_args

    results = tmp_path / "results"
    first = parse_args(_cli(**FAST, model_name="tiny-gpt2", trainer="pg", baseline="mean", max_steps=2,
                            save_steps=1, ckpt_path=results, seed=3))
    assert rl_finetune.main(first) == 0
    (run,) = _runs(tmp_path)
    resumed = parse_args([f"--resume_from={run / 'checkpoint-1'}"])
    for key, value in first.to_dict().items():
        if key != "resume_from":
            assert getattr(resumed, key) == value, key
    longer = parse_args([f"--resume_from={run / 'checkpoint-1'}", "--max_steps=3", "--save_steps=3"])
    assert (longer.max_steps, longer.save_steps, longer.baseline) == (3, 3, "mean")
    assert rl_finetune.main(longer) == 0
    assert [r["step"] for r in metrics.read_metrics(_runs(tmp_path)[-1])] == [1, 2, 3]


def test_resume_refuses_explicit_changes_that_would_not_continue_the_run(tmp_path, capsys):
    from experiment_args import parse_args

    results = tmp_path / "results"
    assert rl_finetune.main(parse_args(_cli(**FAST, model_name="tiny-gpt2", max_steps=1, save_steps=1,
                                            ckpt_path=results))) == 0
    checkpoint = _runs(tmp_path)[0] / "checkpoint-1"
    with pytest.raises(SystemExit):
        parse_args([f"--resume_from={checkpoint}", "--learning_rate=0.5", "--logging_steps=3"])
    err = capsys.readouterr().err
    assert "--learning_rate=0.001 there, 0.5 here" in err and "logging_steps" not in err


def test_resume_refuses_a_new_max_steps_under_a_multi_level_curriculum(make_args, tmp_path):
    common = {**FAST, "curriculum_index": None}
    assert rl_finetune.main(make_args(**common, max_steps=3, save_steps=1)) == 0
    (run,) = _runs(tmp_path)
    with pytest.raises(ValueError, match="--max_steps=3 there, 6 here"):
        rl_finetune.main(make_args(**common, max_steps=6, save_steps=1, resume_from=str(run / "checkpoint-1")))


def test_a_registered_learner_runs_through_the_loop(make_args, tmp_path, monkeypatch):
    from rl_algorithms import LEARNERS, Learner, UpdateResult

    seen = []

    class Counting(Learner):
        """Counts what the loop hands it; no optimiser step."""

        def update(self, episodes, play, rng):
            seen.append(len(episodes))
            return UpdateResult(loss=0.25, metrics={"counted": sum(seen)})

        def state_dict(self):
            return {"seen": list(seen)}

    monkeypatch.setitem(LEARNERS, "counting", Counting)
    assert rl_finetune.main(make_args(**FAST, trainer="counting", max_steps=2, save_steps=2)) == 0
    (run,) = _runs(tmp_path)
    assert seen == [4, 4]
    assert [(r["loss"], r["counted"]) for r in metrics.read_metrics(run)] == [(0.25, 4), (0.25, 8)]
    state = torch.load(run / "checkpoint-2" / checkpoints.TRAINER_STATE_FILE, weights_only=True)
    assert state["state"]["ranks"][0]["learner"] == {"seen": [4, 4]}


def test_held_out_panel_is_fixed_and_separate_from_training(make_args, tmp_path):
    from evaluation.episodes import HELD_OUT_SEED, VALIDATION_SEED, test_episodes
    from evaluation.evaluate import HeldOutPanel

    args = make_args(**FAST, max_steps=4, save_steps=4, eval_steps=2, eval_panel=3)
    assert rl_finetune.main(args) == 0
    (run,) = _runs(tmp_path)
    records = metrics.read_metrics(run)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert [("heldout_success" in r) for r in records] == [True, False, True, False, True]
    assert all(r["heldout_episodes"] == 3 for r in records if "heldout_success" in r)
    assert "success" not in records[0]  # step 0 is the panel before any update
    # The panel's seeds are validation seeds: above every seed training can draw, and apart from the
    # final evaluation's (whose choices must not be made on the episodes it reports).
    panel = HeldOutPanel(args, None)
    assert [s.seed for s in panel.starts] == [VALIDATION_SEED, VALIDATION_SEED + 1, VALIDATION_SEED + 2]
    evaluation = test_episodes(args, panel.envs[0], 10**6)
    assert not {s.seed for s in panel.starts} & {s.seed for s in evaluation} and HELD_OUT_SEED < VALIDATION_SEED
    episodes = [json.loads(x) for x in (run / "checkpoint-4" / "episodes.jsonl").read_text().splitlines()]
    assert all(e["seed"] < 2**31 - 1 < HELD_OUT_SEED for e in episodes)


def test_held_out_panel_leaves_training_unchanged(make_args, tmp_path):
    """Playing the panel draws nothing from the training streams: same episodes with and without it."""
    common = {**FAST, "max_steps": 3, "save_steps": 3}
    assert rl_finetune.main(make_args(**common)) == 0
    assert rl_finetune.main(make_args(**common, eval_steps=1, eval_panel=2)) == 0
    plain, paneled = _runs(tmp_path)
    logs = [(run / "checkpoint-3" / "episodes.jsonl").read_text() for run in (plain, paneled)]
    assert logs[0] == logs[1]
    assert torch.equal(*[next(iter(_adapter(run / "checkpoint-3").values())) for run in (plain, paneled)])
    tokens = [[r["tokens"] for r in metrics.read_metrics(run) if "tokens" in r] for run in (plain, paneled)]
    assert tokens[0] == tokens[1]  # the panel's prompts are not counted as training's


def test_reuse_rollout_pass_reaches_the_update_and_trains_as_reading_again(make_args, tmp_path, monkeypatch):
    """``--reuse_rollout_pass`` through the loop (on by default on a CPU): every update takes the rollout's passes,
    and the run plays the same episodes as one that reads its prompts again (float32: log-probs equal to
    rounding)."""
    from rollout import KeptPasses

    taken = []
    take = KeptPasses.take
    monkeypatch.setattr(KeptPasses, "take", lambda self, decisions: taken.append(take(self, decisions)) or taken[-1])
    common = {**FAST, "max_steps": 3, "save_steps": 3, "load_in_8bit": False, "bf16": False}
    assert rl_finetune.main(make_args(**common, reuse_rollout_pass=False)) == 0
    assert len(taken) == 3 and not any(taken)
    taken.clear()
    assert rl_finetune.main(make_args(**common)) == 0  # the default
    assert len(taken) == 3 and all(taken) == (not torch.cuda.is_available())  # each iteration's fresh decisions
    logs = [[json.loads(line) for line in (run / "checkpoint-3" / "episodes.jsonl").read_text().splitlines()]
            for run in _runs(tmp_path)]
    steps = [[s for e in log for s in e["steps"]] for log in logs]
    assert [s["label"] for s in steps[0]] == [s["label"] for s in steps[1]]
    assert [s["logprob"] for s in steps[0]] == pytest.approx([s["logprob"] for s in steps[1]], abs=1e-5)


@pytest.mark.parametrize(("flags", "cuda", "keeps"), [
    ({}, False, True), ({}, True, False),  # auto: on a CPU; off on CUDA, for a large model's activations
    ({"trainer": "refuel"}, False, False), ({"baseline": "critic"}, False, False),  # they read other passes
    ({"reuse_rollout_pass": False}, False, False), ({"reuse_rollout_pass": True}, True, True)])  # as given
def test_reuse_rollout_pass_is_on_by_default_where_it_applies_on_a_cpu(make_args, monkeypatch, flags, cuda, keeps):
    from utils import arg_groups

    monkeypatch.setattr(arg_groups, "cuda_available", lambda: cuda)
    args = make_args(**flags)
    assert args.keep_rollout_passes is keeps
    assert args.reuse_rollout_pass is flags.get("reuse_rollout_pass")  # the setting itself stays as given
