"""Each learner behind the one interface, on a toy batch of Taxi episodes with tiny-gpt2."""

import numpy as np
import pytest
import torch
from accelerate import Accelerator

import models
from envs import make_env
from rl_algorithms import LEARNERS, UpdateResult
from rollout import EpisodeStart, TwoPlayerRollout


@pytest.fixture
def toy(make_args):
    """A rollout over 3 Taxi envs and a batch of 3 episodes played with it."""

    def build(trainer, **overrides):
        args = make_args(**{"env": "taxi", "trainer": trainer, "horizon": 4, "learning_rate": 1e-2,
                            "per_device_train_batch_size": 2, **overrides})
        policy, tokenizer = models.load_model_and_tokenizer(args)
        policy.eval()
        rollout = TwoPlayerRollout.from_args(args, policy, tokenizer)
        envs = [make_env("taxi", horizon=4) for _ in range(3)]

        def play(starts, rng):
            return rollout.run(envs[:len(starts)], starts, rng)

        rng = np.random.default_rng(0)
        episodes = play([EpisodeStart(seed=s, options={"curriculum": "full"}) for s in (1, 2, 3)], rng)
        learner = LEARNERS[trainer](args, rollout.scorer, Accelerator(cpu=True))
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
