"""Each learner behind the one interface, on a toy batch of Taxi episodes with tiny-gpt2."""

import dataclasses

import numpy as np
import pytest
import torch
from accelerate import Accelerator

from envs import make_env
from rl_algorithms import LEARNERS, LearnerSettings, UpdateResult
from rl_algorithms.base import flat_decisions
from rollout import EpisodeStart, TwoPlayerRollout
from tests.conftest import record_reads_and_gradients, same_gradients
from utils import models


@pytest.fixture
def toy(make_args):
    """A rollout over 3 Taxi envs and a batch of 3 episodes played with it."""

    def build(trainer, **overrides):
        args = make_args(**{"env": "taxi", "trainer": trainer, "horizon": 4, "learning_rate": 1e-2,
                            "per_device_train_batch_size": 2, **overrides})
        policy, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args))
        policy.eval()
        rollout = TwoPlayerRollout.from_args(args, policy, tokenizer)
        envs = [make_env("taxi", horizon=4) for _ in range(3)]

        def play(starts, rng):
            return rollout.run(envs[:len(starts)], starts, rng)

        rng = np.random.default_rng(0)
        episodes = play([EpisodeStart(seed=s, options={"curriculum": "full"}) for s in (1, 2, 3)], rng)
        learner = LEARNERS[trainer](LearnerSettings.from_args(args), rollout.scorer, Accelerator())
        return learner, episodes, play, rng

    return build


def _trainable(learner):
    return [p.detach().clone() for p in learner.params]


@pytest.mark.parametrize("trainer, overrides, keys", [
    ("pg", {}, {"grad_norm", "replayed", "replay_size"}),
    ("pg", {"baseline": "critic"}, {"grad_norm", "critic_loss"}),
    ("ppo", {"baseline": "mean", "ppo_epochs": 2}, {"grad_norm", "approx_kl", "clip_fraction", "ppo_ratio_max"}),
    ("refuel", {}, {"grad_norm", "refuel_pairs"}),
])
def test_each_learner_updates_the_policy_and_reports(toy, trainer, overrides, keys):
    learner, episodes, play, rng = toy(trainer, **overrides)
    before = _trainable(learner)
    result = learner.update(episodes, play, rng)
    assert isinstance(result, UpdateResult) and result.applied
    assert np.isfinite(result.loss) and keys <= set(result.metrics)
    assert result.metrics["grad_norm"] is not None and result.metrics["grad_norm"] >= 0
    changed = any(not torch.equal(a, b) for a, b in zip(before, _trainable(learner)))
    assert changed, "one optimiser step must move the weights (Adam with weight decay moves them even at zero grad)"
    assert all(p.grad is None for p in learner.params), "gradients are cleared after the step"


def test_ppo_reports_kl_and_clipping_that_grow_with_the_step(toy):
    small, episodes, play, rng = toy("ppo", baseline="mean", ppo_epochs=3, learning_rate=1e-6)
    first = small.update(episodes, play, rng)
    large, episodes, play, rng = toy("ppo", baseline="mean", ppo_epochs=3, learning_rate=3e-2)
    second = large.update(episodes, play, rng)
    assert 0 <= first.metrics["approx_kl"] < second.metrics["approx_kl"]
    assert first.metrics["clip_fraction"] <= second.metrics["clip_fraction"]


def test_pg_state_round_trips_its_replay_buffer_and_critic(toy):
    learner, episodes, play, rng = toy("pg", baseline="critic", replay_buffer_size=5)
    for episode in episodes:
        episode.success = True
    learner.update(episodes, play, rng)
    state = learner.state_dict()
    assert len(state["replay"]["episodes"]) == 3 and state["critic"] is not None
    clone, _, _, _ = toy("pg", baseline="critic", replay_buffer_size=5)
    clone.load_state_dict(state)
    assert len(clone.replay) == 3
    for key, value in learner.critic.state_dict().items():
        assert torch.equal(clone.critic.state_dict()[key], value)


def test_a_non_finite_loss_skips_the_step(toy):
    learner, _, _, _ = toy("pg")
    before = _trainable(learner)
    applied, norm = learner.step(float("nan"))
    assert (applied, norm) == (False, None)
    assert all(torch.equal(a, b) for a, b in zip(before, _trainable(learner)))


def test_refuel_branches_replay_the_episode_up_to_the_branch_step(toy):
    learner, episodes, play, rng = toy("refuel")
    branches = []

    def recording_play(starts, generator):
        played = play(starts, generator)
        branches.extend(zip(starts, played))
        return played

    learner.update(episodes, recording_play, rng)
    assert len(branches) == len(episodes)
    for (start, branch), episode in zip(branches, episodes):
        h = start.branch_step
        assert start.seed == episode.seed and 0 <= h < len(episode.decisions)
        for t in range(h):
            assert branch.decisions[t].action == episode.decisions[t].action
        assert branch.decisions[h].obs == episode.decisions[h].obs


def test_refuel_pairs_of_equal_returns_give_exactly_no_gradient(toy):
    """The behaviour's log-probabilities come from the update's own pass: the rollout's recorded ones
    (here off by 1e-6, as other batches and CPU kernels leave them) must not become a gradient,
    which Adam would scale to a full step."""
    import dataclasses

    learner, episodes, _, _ = toy("refuel")
    first = dataclasses.replace(episodes[0].decisions[0], logprob=episodes[0].decisions[0].logprob + 1e-6)
    second = episodes[1].decisions[0]
    learner._accumulate([(first, second, -1.0, -1.0)])
    assert all(p.grad is None or not p.grad.any() for p in learner.params)
    learner._accumulate([(first, second, -1.0, -3.0)])
    assert any(p.grad is not None and p.grad.any() for p in learner.params)


def _mean_entropy(learner, episodes) -> float:
    from rollout import entropy_of

    decisions = [d for e in episodes for d in e.decisions]
    with torch.no_grad():
        logp = learner.scorer.logprobs([d.prompt for d in decisions], [d.valid for d in decisions]).logprobs
    return float(entropy_of(logp).mean())


@pytest.mark.parametrize("trainer", ["pg", "ppo"])
def test_entropy_bonus_raises_the_policy_entropy(toy, trainer):
    after = {}
    for coef in (0.0, 5.0):
        learner, episodes, play, rng = toy(trainer, baseline="mean", entropy_coef=coef, learning_rate=1e-4)
        before = _mean_entropy(learner, episodes)
        learner.update(episodes, play, rng)
        after[coef] = _mean_entropy(learner, episodes)
    assert after[5.0] > after[0.0] and after[5.0] > before - 1e-6


def _critic_weights(learner):
    return [p.detach().clone() for p in learner.critic.parameters()]


@pytest.mark.parametrize("trainer", ["pg", "ppo"])
def test_the_papers_critic_schedule_trains_the_critic_every_n_iterations_with_its_own_optimiser(toy, trainer):
    learner, episodes, play, rng = toy(trainer, use_critic=True, critic_update_freq=2, critic_update_iter=3,
                                       critic_layer_type="mlp", ppo_epochs=2)
    assert learner.settings.baseline == "critic" and learner.critic_schedule
    critic_ids = {id(p) for p in learner.critic.parameters()}
    assert not critic_ids & {id(p) for p in learner.params}, "the policy's optimiser does not step the critic"
    decisions = sum(len(e.decisions) for e in episodes)

    start = _critic_weights(learner)
    first = learner.update(episodes, play, rng)
    assert first.metrics["critic_loss"] is None, "not due after one iteration"
    assert all(torch.equal(a, b) for a, b in zip(start, _critic_weights(learner)))
    assert sum(len(q) for _, q in learner.critic_data) == decisions, "each decision kept once (PPO: first epoch)"

    second = learner.update(episodes, play, rng)
    assert np.isfinite(second.metrics["critic_loss"])
    assert any(not torch.equal(a, b) for a, b in zip(start, _critic_weights(learner)))
    steps = {int(s["step"]) for s in learner.critic_optimizer.state_dict()["state"].values()}
    size = learner.settings.minibatch_size
    assert steps == {3 * -(-2 * decisions // size)}, "3 passes over both iterations' decisions, in minibatches"
    assert learner.critic_data == [] and learner.iterations_since_critic == 0


def test_the_critic_schedule_lowers_the_critics_error_and_round_trips(toy):
    # the hidden states have std ~5 over 128 dimensions: at 1e-2 Adam overshoots and the error swings
    # with the last digits of the numbers (a CUDA machine's 8-bit model ended above where it began)
    learner, episodes, _, rng = toy("pg", baseline="critic", critic_update_freq=1, critic_update_iter=20,
                                    learning_rate=3e-4)
    decisions, q = flat_decisions(episodes)
    with torch.no_grad():
        hidden = learner.scorer.logprobs([d.prompt for d in decisions], [d.valid for d in decisions],
                                         with_hidden=True).hidden

    def error():
        with torch.no_grad():
            return float(((learner.critic(hidden) - q.to(hidden.device)) ** 2).mean())

    before = error()
    learner.critic_data = [(hidden, q)]
    assert learner.train_critic_on_schedule(rng) is not None
    assert error() < 0.5 * before
    learner.critic_data, learner.iterations_since_critic = [(hidden[:2], q[:2])], 0
    clone, _, _, _ = toy("pg", baseline="critic", critic_update_freq=1, critic_update_iter=20)
    clone.load_state_dict(learner.state_dict())
    assert clone.critic_optimizer.state_dict()["state"] and torch.equal(clone.critic_data[0][0], hidden[:2])
    for key, value in learner.critic.state_dict().items():
        assert torch.equal(clone.critic.state_dict()[key], value)


def test_critic_flags(make_args):
    assert make_args(use_critic=True).baseline == "critic"
    with pytest.raises(ValueError, match="--use_critic: asks for a critic, but --baseline is 'mean'"):
        make_args(use_critic=True, baseline="mean")
    with pytest.raises(ValueError, match="--shared_critic: a critic with a model of its own is not available"):
        make_args(shared_critic=False)
    with pytest.raises(ValueError, match="--critic_update_freq: must be >= 1"):
        make_args(critic_update_freq=0)


def test_a_learner_gets_its_settings_not_the_flags(make_args):
    settings = LearnerSettings.from_args(make_args(per_device_train_batch_size=3, ppo_clip=0.3, refuel_eta=2.0))
    assert (settings.minibatch_size, settings.ppo_clip, settings.refuel_eta) == (3, 0.3, 2.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.ppo_clip = 0.1


# --- --reuse_rollout_pass: the update reads the rollout's own passes ------------------------------------------

def _kept_or_read_again(make_args, trainer, keep, episodes=4, **overrides):
    """A fresh float32 tiny-gpt2 policy (the same seed each time), ``episodes`` Taxi episodes played with or
    without keeping the policy's passes, its learner, a list that gets the rows of each forward pass of the
    policy from then on, and one that gets the gradients at each optimiser step."""
    args = make_args(**{"env": "taxi", "trainer": trainer, "horizon": 4, "learning_rate": 1e-2,
                        "per_device_train_batch_size": 2, "load_in_8bit": False, "bf16": False,
                        "prefix_cache": False, "reuse_rollout_pass": keep, **overrides})
    torch.manual_seed(0)
    policy, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args))
    policy.eval()
    rollout = TwoPlayerRollout.from_args(args, policy, tokenizer)
    envs = [make_env("taxi", horizon=4, labels=rollout.labels) for _ in range(episodes)]

    def play(starts, rng):
        return rollout.run(envs[:len(starts)], starts, rng, keep_passes=keep)

    rng = np.random.default_rng(0)
    group = args.group_size
    played = play([EpisodeStart(seed=s // group, options={"curriculum": "full"},
                                group=s // group if group > 1 else None) for s in range(episodes)], rng)
    learner = LEARNERS[trainer](LearnerSettings.from_args(args), rollout.scorer, Accelerator())
    calls, grads = record_reads_and_gradients(policy, learner)
    return learner, played, play, rng, calls, grads


@pytest.mark.parametrize("trainer, overrides", [
    ("pg", {"baseline": "mean"}),
    ("pg", {"entropy_coef": 0.1, "pg_normalize": "decisions"}),
    ("ppo", {"baseline": "mean", "ppo_epochs": 2}),
    ("rloo", {"group_size": 2}),
    ("grpo", {"group_size": 2, "ppo_epochs": 2}),
])
def test_the_update_from_the_rollouts_passes_equals_reading_the_prompts_again(make_args, trainer, overrides):
    results = {}
    for keep in (False, True):
        learner, episodes, play, rng, calls, grads = _kept_or_read_again(make_args, trainer, keep, **overrides)
        result = learner.update(episodes, play, rng)
        results[keep] = (episodes, result, grads, sum(calls))
    (episodes, plain, steps, read), (kept_episodes, kept, kept_steps, kept_read) = results[False], results[True]
    assert [e.to_dict() for e in kept_episodes] == [e.to_dict() for e in episodes]  # the pass with gradient: same numbers
    assert kept.applied and kept.loss == pytest.approx(plain.loss, rel=1e-5, abs=1e-7)
    same_gradients(kept_steps, steps)
    # the first (or only) epoch read no prompt again; later epochs read every one again at the new weights
    epochs = overrides.get("ppo_epochs", 1)
    decisions = sum(len(e.decisions) for e in episodes)
    assert read == epochs * decisions and kept_read == (epochs - 1) * decisions


def test_replayed_episodes_are_read_again_after_the_kept_ones(make_args):
    results = {}
    for keep in (False, True):
        # a small step: Adam's first one moves near-zero gradient entries by a rounding-sized amount times the
        # rate, and the second update's gradients are compared at the weights it left
        learner, episodes, play, rng, calls, grads = _kept_or_read_again(make_args, "pg", keep, baseline="mean",
                                                                         replay_batch_size=2, learning_rate=1e-6)
        for episode in episodes:
            episode.success = True
        learner.update(episodes, play, rng)  # fills the replay buffer
        fresh = play([EpisodeStart(seed=s, options={"curriculum": "full"}) for s in (7, 8)], rng)
        calls.clear()
        assert learner.update(fresh, play, rng).metrics["replayed"] == 2
        results[keep] = (grads, sum(calls), sum(len(e.decisions) for e in fresh))
    (steps, read, fresh_decisions), (kept_steps, kept_read, _) = results[False], results[True]
    assert kept_read == read - fresh_decisions > 0  # the replayed episodes' prompts, and only those
    same_gradients(kept_steps, steps)


def test_passes_kept_before_the_weights_changed_are_not_used(make_args):
    """An in-place change of the weights between the rollout and the update (an optimiser step, weights swapped
    in) drops the kept passes: the update reads the prompts again at the weights it steps from."""
    results = {}
    for keep in (False, True):
        learner, episodes, play, rng, calls, grads = _kept_or_read_again(make_args, "pg", keep, baseline="mean")
        with torch.no_grad():
            for p in learner.params:
                p.mul_(1.5)
        learner.update(episodes, play, rng)
        results[keep] = (grads, sum(calls))
    assert results[True][1] == results[False][1] > 0
    same_gradients(results[True][0], results[False][0])


def test_kept_passes_are_taken_once(make_args):
    learner, episodes, _, _, calls, _ = _kept_or_read_again(make_args, "pg", True)
    decisions, _ = flat_decisions(episodes)
    assert len(learner.scorer.kept.take(decisions)) == len(decisions)
    assert learner.scorer.kept.take(decisions) == []  # a graph is freed by its backward pass: never twice
    assert not calls


@pytest.mark.parametrize("overrides", [{"trainer": "refuel"}, {"baseline": "critic"}, {"use_critic": True}])
def test_reuse_rollout_pass_is_refused_where_the_update_reads_other_passes(make_args, overrides):
    with pytest.raises(ValueError, match="--reuse_rollout_pass"):
        make_args(env="taxi", reuse_rollout_pass=True, **overrides)
