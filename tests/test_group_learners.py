"""The group learners (RLOO, GRPO, GiGPO) and ``--group_size``: grouped starts, the advantages against their
formulas on hand-made batches, the environments' state keys, resume, and the flags' refusals."""

import dataclasses
import json
import math
import sys

import numpy as np
import pytest
import torch

import rl_finetune
from envs import make_env
from envs.taxi import taxi_curriculum
from experiment_args import ScriptArguments, parse_args, run_script
from rl_algorithms import LEARNERS, LearnerSettings
from rl_algorithms.gigpo import anchor_groups, discounted_returns
from rl_algorithms.group import EPS, group_members, group_relative, leave_one_out
from rollout import Decision, Episode, PolicyScorer, TwoPlayerRollout
from utils import checkpoints, metrics, models


def _episode(group, rewards, states=None, logprob=-1.0):
    states = states or [f"s{t}" for t in range(len(rewards))]
    return Episode(seed=group, options={}, group=group, decisions=[
        Decision(obs="o", prompt=f"prompt {s}", valid=[0, 1], action=0, logprob=logprob, entropy=0.5, reward=r, state=s)
        for r, s in zip(rewards, states, strict=True)])


@pytest.fixture(scope="module")
def scorer():
    torch.manual_seed(0)
    tiny = models.ModelSettings.from_args(ScriptArguments(model_name="tiny-gpt2"))
    policy, tokenizer = models.load_model_and_tokenizer(tiny, shrink_head=True)
    policy.eval()
    return PolicyScorer(policy, tokenizer, 256, 1.0)


def _learner(name, scorer, **flags):
    from accelerate import Accelerator

    args = ScriptArguments(model_name="tiny-gpt2", trainer=name, group_size=2, **flags)
    return LEARNERS[name](LearnerSettings.from_args(args), scorer, Accelerator())


# --- grouped starts -------------------------------------------------------------------------------

def test_a_groups_episodes_share_their_start_and_differ_in_their_sampling():
    args = ScriptArguments(model_name="tiny-gpt2")
    torch.manual_seed(0)
    policy, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args), shrink_head=True)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    policy.eval()
    rollout = TwoPlayerRollout(policy, tokenizer)
    starts = rl_finetune.episode_starts(taxi_curriculum(10).only(0), 0, 8, np.random.default_rng(0), group_size=4)
    assert [s.group for s in starts] == [0, 0, 0, 0, 1, 1, 1, 1]
    for group in (starts[:4], starts[4:]):
        assert len({(s.seed, json.dumps(s.options)) for s in group}) == 1
    assert starts[0].seed != starts[4].seed
    envs = [make_env("taxi", horizon=6, labels=rollout.labels) for _ in starts]
    episodes = rollout.run(envs, starts, np.random.default_rng(1))
    for members in group_members(episodes):
        first = [episodes[i].decisions[0] for i in members]
        assert len({d.obs for d in first}) == 1 and len({d.state for d in first}) == 1  # the same start
        played = {tuple(d.action for d in episodes[i].decisions) for i in members}
        assert len(played) > 1  # each episode sampled its own actions
    # without groups, every start is drawn once, as before
    plain = rl_finetune.episode_starts(taxi_curriculum(10).only(0), 0, 4, np.random.default_rng(0))
    assert len({s.seed for s in plain}) == 4 and all(s.group is None for s in plain)


def test_taxi_state_key_ignores_the_history():
    env = make_env("taxi", horizon=10)
    for there, back in (("Move north", "Move south"), ("Move south", "Move north"),
                        ("Move east", "Move west"), ("Move west", "Move east")):
        obs, info = env.reset(seed=3, options={"curriculum": "pickup"})
        start = info["state_key"]
        _, _, done, _, info = env.step(env.label_of(there))
        if not done and info["state_key"] != start:  # it moved (not into a wall): come back
            _, _, done, _, info = env.step(env.label_of(back))
            assert not done
            assert info["state_key"] == start and env.observation != obs  # the same state, another history
            return
    pytest.fail("no move left the start cell")


# --- advantages against their formulas --------------------------------------------------------------

def test_rloo_advantage_is_the_return_minus_the_others_mean(scorer):
    episodes = [_episode(0, [1.0]), _episode(0, [0.5, 1.5]), _episode(0, [6.0]), _episode(1, [0.0]), _episode(1, [2.0])]
    expected = [1 - (2 + 6) / 2, 2 - (1 + 6) / 2, 6 - (1 + 2) / 2, 0 - 2, 2 - 0]
    per_decision = [expected[0], expected[1], expected[1], expected[2], expected[3], expected[4]]
    assert np.allclose(_learner("rloo", scorer).advantages(episodes), per_decision)
    assert np.allclose(leave_one_out(torch.tensor([1.0, 2.0, 6.0]), [[0, 1, 2]]), expected[:3])


@pytest.mark.parametrize("variant", ["grpo", "dr_grpo"])
def test_grpo_advantage_and_weights_follow_the_formula(scorer, variant):
    episodes = [_episode(0, [1.0]), _episode(0, [0.5, 1.5]), _episode(0, [6.0]), _episode(1, [3.0]), _episode(1, [3.0])]
    std = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + (6 - 3) ** 2) / 2)  # with Bessel's correction
    scale = std + EPS if variant == "grpo" else 1.0
    group = [(1 - 3) / scale, (2 - 3) / scale, (6 - 3) / scale]
    learner = _learner("grpo", scorer, grpo_variant=variant)
    assert np.allclose(learner.advantages(episodes), [group[0], group[1], group[1], group[2], 0.0, 0.0])
    n = len(episodes)
    expected = [1 / n, 1 / (2 * n), 1 / (2 * n), 1 / n, 1 / n, 1 / n] if variant == "grpo" else [1 / n] * 6
    assert np.allclose(learner.weights(episodes), expected)


def test_gigpo_step_groups_follow_the_formula(scorer):
    gamma = 0.5
    # one start played twice: both pass through states a and b; c and d are each met once
    first = _episode(0, [0.0, 0.0, 1.0], states=["a", "b", "c"])
    second = _episode(0, [0.0, 0.0, 0.0], states=["a", "d", "b"])
    episodes = [first, second]
    assert discounted_returns([0.0, 0.0, 1.0], gamma) == [0.25, 0.5, 1.0]
    assert sorted(map(sorted, anchor_groups(episodes, [[0, 1]]))) == [[0, 3], [1, 5], [2], [4]]

    dr = _learner("gigpo", scorer, grpo_variant="dr_grpo", gigpo_gamma=gamma, gigpo_weight=2.0)
    # episode level: returns 1 and 0, mean 0.5; steps: a (0.25 vs 0), b (0.5 vs 0), c and d alone
    episode_level = [0.5] * 3 + [-0.5] * 3
    step_level = [0.125, 0.25, 0.0, -0.125, 0.0, -0.25]
    assert np.allclose(dr.advantages(episodes), np.add(episode_level, np.multiply(2.0, step_level)))

    scaled = _learner("gigpo", scorer, grpo_variant="grpo", gigpo_gamma=gamma, gigpo_weight=1.0)
    unit = 1 / math.sqrt(2)  # two values: (v - mean) / std = +-1/sqrt(2)
    episode_level = [unit] * 3 + [-unit] * 3
    step_level = [unit, unit, 0.0, -unit, 0.0, -unit]
    assert np.allclose(scaled.advantages(episodes), np.add(episode_level, step_level), atol=1e-5)
    assert np.allclose(group_relative(torch.tensor([4.0]), [[0]], True), [0.0])  # a group of one


def test_group_learners_take_a_step(scorer):
    episodes = [_episode(0, [1.0], logprob=-0.7), _episode(0, [0.0], logprob=-0.7)]
    for name in ("rloo", "grpo", "gigpo"):
        learner = _learner(name, scorer, kl_coef=0.1 if name != "rloo" else 0.0, ppo_epochs=2)
        before = [p.detach().clone() for p in learner.params]
        result = learner.update(episodes, play=None, rng=np.random.default_rng(0))
        assert result.applied and result.metrics["advantage_abs"] > 0
        assert any(not torch.equal(a, p) for a, p in zip(before, learner.params))
        if name != "rloo":
            assert result.metrics["kl_reference"] >= 0 and result.metrics["clip_fraction"] >= 0
            with torch.no_grad():  # the reference is where the learner started, restored after use
                assert all(torch.equal(a, r) for a, r in zip(before, learner.reference))
        for p, value in zip(learner.params, before):  # leave the shared scorer as it was
            with torch.no_grad():
                p.copy_(value)


def test_an_episode_without_a_group_is_refused(scorer):
    with pytest.raises(ValueError, match="--group_size"):
        _learner("grpo", scorer).advantages([_episode(None, [1.0]), _episode(None, [0.0])])


# --- end to end: training, resume, the flags ------------------------------------------------------

FAST = dict(env="taxi", taxi_curriculum=True, curriculum_index=0, per_device_eval_batch_size=4, group_size=2,
            per_device_train_batch_size=8, learning_rate=1e-3, horizon=5)


@pytest.mark.parametrize("trainer, extra", [("rloo", {"replay_batch_size": 2, "entropy_coef": 0.01}),
                                            ("grpo", {"kl_coef": 0.05}), ("gigpo", {"replay_batch_size": 2})])
def test_a_group_learner_trains_and_resumes_exactly(make_args, tmp_path, trainer, extra):
    common = {**FAST, "trainer": trainer, **extra, "max_steps": 3, "save_steps": 1}
    assert rl_finetune.main(make_args(**common)) == 0
    (straight,) = checkpoints.run_dirs(tmp_path / "results", "rl_finetune")
    episodes = [json.loads(x) for x in (straight / "checkpoint-1" / "episodes.jsonl").read_text().splitlines()]
    assert [e["group"] for e in episodes] == [0, 0, 1, 1]
    assert all(d["state"] for e in episodes for d in e["steps"])
    assert rl_finetune.main(make_args(**common, resume_from=str(straight / "checkpoint-1"))) == 0
    resumed = checkpoints.run_dirs(tmp_path / "results", "rl_finetune")[-1]
    a, b = metrics.read_metrics(straight), metrics.read_metrics(resumed)
    assert [r["step"] for r in b] == [1, 2, 3]
    for x, y in zip(a, b, strict=True):
        assert x["success"] == y["success"] and x["loss"] == pytest.approx(y["loss"], abs=1e-6)
    state = torch.load(straight / "checkpoint-3" / checkpoints.TRAINER_STATE_FILE, weights_only=True)
    learner = state["state"]["ranks"][0]["learner"]
    assert (learner.get("reference") is not None) == ("kl_coef" in extra)
    assert learner["replay"]["capacity"] == 50  # the replay buffer is resumed with the run


@pytest.mark.parametrize("argv, says", [
    (["--trainer=rloo"], "--group_size: --trainer rloo compares the episodes of one start"),
    (["--trainer=grpo", "--group_size=1"], "--group_size: --trainer grpo compares"),
    (["--trainer=gigpo", "--group_size=3", "--per_device_eval_batch_size=8"], "--group_size: 3 does not divide"),
    (["--trainer=rloo", "--group_size=2", "--baseline=mean"], "--baseline: --trainer rloo takes its baseline"),
])
def test_bad_group_settings_are_refused_in_one_line(monkeypatch, capsys, tmp_path, argv, says):
    monkeypatch.setattr(sys, "argv", ["rl_finetune.py", "--model_name=tiny-gpt2", "--env=taxi",
                                      f"--ckpt_path={tmp_path / 'results'}", *argv])
    try:
        code = run_script(rl_finetune.main, "rl_finetune.py")
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("rl_finetune.py: error: ")]
    assert says in line and not (tmp_path / "results").exists()


def test_group_flags_apply_to_rl_only():
    args = parse_args(["--model_name=tiny-gpt2", "--env=taxi", "--trainer=gigpo", "--group_size=2"])
    assert (args.group_size, args.gigpo_weight, args.gigpo_gamma, args.grpo_variant) == (2, 1.0, 0.95, "dr_grpo")


# --- the options the ablation tried (docs/learners.md): replayed successes, the entropy bonus, the defaults -----

def _replayed(rewards):
    return dataclasses.replace(_episode(None, rewards), success=True)


@pytest.mark.parametrize("variant", ["grpo", "dr_grpo"])
def test_a_replayed_success_is_scored_against_the_fresh_batch(scorer, variant):
    # fresh: one start twice (returns 1 and 0), replayed: a success of return 3 over two decisions
    fresh = [_episode(0, [1.0]), _episode(0, [0.0])]
    replayed = [_replayed([1.0, 2.0])]
    # rloo: the fresh batch's mean return is 0.5, so the replayed success gets 3 - 0.5 = 2.5 at each decision
    assert np.allclose(_learner("rloo", scorer).advantages(fresh, replayed), [1.0, -1.0, 2.5, 2.5])
    # grpo: the group's as before; the replayed one against the fresh mean, scaled by the std of 1, 0 and 3
    learner = _learner("grpo", scorer, grpo_variant=variant)
    unit = 1 / math.sqrt(2)  # the group's (v - mean) / std
    std_all = math.sqrt(((1 - 4 / 3) ** 2 + (0 - 4 / 3) ** 2 + (3 - 4 / 3) ** 2) / 2)
    if variant == "grpo":
        expected = [unit, -unit, 2.5 / (std_all + EPS), 2.5 / (std_all + EPS)]
    else:
        expected = [0.5, -0.5, 2.5, 2.5]
    assert np.allclose(learner.advantages(fresh, replayed), expected, atol=1e-5)
    # its weights count it as one of the batch's N = 3 episodes
    batch = fresh + replayed
    assert np.allclose(learner.weights(batch), [1 / 3, 1 / 3, 1 / 6, 1 / 6] if variant == "grpo" else [1 / 3] * 4)
    # gigpo: a replayed success's steps are in no anchor group of the batch, so it keeps the episode level only
    gigpo = _learner("gigpo", scorer, grpo_variant=variant, gigpo_weight=2.0)
    fresh_only = gigpo.advantages(fresh)
    assert np.allclose(gigpo.advantages(fresh, replayed), [*fresh_only, *expected[2:]], atol=1e-5)
    # a batch of equal fresh returns does not blow a replayed one up: the scale takes the replayed return in
    flat = _learner("grpo", scorer, grpo_variant="grpo").advantages([_episode(0, [-0.5]), _episode(0, [-0.5])],
                                                                    [_replayed([1.0])])
    assert np.allclose(flat, [0.0, 0.0, 1.5 / (math.sqrt(0.75) + EPS)], atol=1e-5)


@pytest.mark.parametrize("name", ["rloo", "grpo", "gigpo"])
def test_a_group_learner_replays_successes_it_has_seen(scorer, name):
    learner = _learner(name, scorer, replay_batch_size=2, replay_buffer_size=3, ppo_epochs=1)
    before = [p.detach().clone() for p in learner.params]
    won, lost = dataclasses.replace(_episode(0, [1.0]), success=True), _episode(0, [0.0])
    rng = np.random.default_rng(0)
    first = learner.update([won, lost], play=None, rng=rng)
    assert (first.metrics["replayed"], first.metrics["replay_size"]) == (0, 1)  # only the success is kept
    second = learner.update([_episode(1, [0.0]), _episode(1, [1.0])], play=None, rng=rng)
    assert (second.metrics["replayed"], second.metrics["replay_size"]) == (1, 1)
    state = learner.state_dict()
    assert [e["group"] for e in state["replay"]["episodes"]] == [0]  # kept as played; replayed out of any group
    assert learner.replayed(np.random.default_rng(0))[0].group is None
    fresh = _learner(name, scorer, replay_batch_size=2, replay_buffer_size=3)
    fresh.load_state_dict(state)
    assert len(fresh.replay) == 1
    for p, value in zip(learner.params, before):  # leave the shared scorer as it was
        with torch.no_grad():
            p.copy_(value)


@pytest.mark.parametrize("name", ["rloo", "grpo"])
def test_the_entropy_bonus_of_a_group_learner_follows_the_formula(scorer, name):
    from rollout import entropy_of

    episodes = [_episode(0, [1.0, 0.0]), _episode(0, [0.0])]
    decisions = [d for e in episodes for d in e.decisions]
    with torch.no_grad():
        entropy = entropy_of(scorer.logprobs([d.prompt for d in decisions], [d.valid for d in decisions]).logprobs)
    coef, losses = 0.5, {}
    for c in (0.0, coef):
        learner = _learner(name, scorer, entropy_coef=c, grpo_variant="grpo", ppo_epochs=1)
        before = [p.detach().clone() for p in learner.params]
        losses[c] = learner.update(episodes, play=None, rng=np.random.default_rng(0)).loss  # the loss before its step
        for p, value in zip(learner.params, before):  # leave the shared scorer as it was
            with torch.no_grad():
                p.copy_(value)
    # rloo: c * the summed entropy per episode; grpo: weighted as its loss, each episode's mean over its decisions
    weights = [1 / 2] * 3 if name == "rloo" else [1 / 4, 1 / 4, 1 / 2]
    expected = coef * float((entropy * torch.tensor(weights)).sum())
    assert losses[0.0] - losses[coef] == pytest.approx(expected, rel=1e-4)


def test_each_learner_takes_its_own_defaults_and_help_lists_them(caplog):
    from rl_algorithms.defaults import LEARNER_DEFAULTS

    for trainer, values in LEARNER_DEFAULTS.items():
        group = ["--group_size=2"] if trainer in ("rloo", "grpo", "gigpo") else []
        with caplog.at_level("WARNING"):
            args = parse_args(["--model_name=tiny-gpt2", "--env=taxi", f"--trainer={trainer}", *group])
        assert {flag: getattr(args, flag) for flag in values} == values
        assert "do not apply" not in caplog.text  # a learner's own default is not a flag given
    given = parse_args(["--model_name=tiny-gpt2", "--trainer=grpo", "--group_size=2", "--replay_batch_size=3",
                        "--grpo_variant=grpo"])
    assert (given.replay_batch_size, given.grpo_variant) == (3, "grpo")  # a flag given wins
    ppo = parse_args(["--model_name=tiny-gpt2", "--trainer=ppo"])  # the flag does not apply; a value all the same
    assert isinstance(ppo.replay_batch_size, int) and "do not apply" not in caplog.text
    from experiment_args import build_parser

    text = " ".join(build_parser().format_help().split())
    for flag in ("replay_batch_size", "grpo_variant"):
        listed = ", ".join(f"{name} {values[flag]}" for name, values in LEARNER_DEFAULTS.items() if flag in values)
        assert listed in text
