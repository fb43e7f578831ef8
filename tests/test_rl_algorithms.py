"""The learners' pure pieces against hand computations."""

import numpy as np
import pytest
import torch

from rl_algorithms import ReplayBuffer, ValueHead, cost_to_go, pg_loss, ppo_loss, refuel_loss, value_loss


def test_cost_to_go():
    assert cost_to_go([1.0, 2.0, 3.0]) == [6.0, 5.0, 3.0]
    assert cost_to_go([0.05, 0.05, -0.95]) == pytest.approx([-0.85, -0.9, -0.95])
    assert cost_to_go([]) == []


def test_pg_loss_equals_hand_computation():
    logp = torch.tensor([-0.5, -1.0, -2.0, -0.1])
    q = torch.tensor([3.0, 2.0, 1.0, -4.0])
    # two episodes in the batch: sum_t logp_t * (Q_t - b) / 2
    assert float(pg_loss(logp, q, 0.0, 2)) == pytest.approx((-1.5 - 2.0 - 2.0 + 0.4) / 2)
    baseline = q.mean()  # 0.5
    expected = (-0.5 * 2.5 - 1.0 * 1.5 - 2.0 * 0.5 - 0.1 * -4.5) / 2
    assert float(pg_loss(logp, q, baseline, 2)) == pytest.approx(expected)


def test_pg_gradient_lowers_probability_of_costly_actions():
    logits = torch.zeros(2, 3, requires_grad=True)
    logp = torch.log_softmax(logits, -1)[[0, 1], [0, 1]]
    pg_loss(logp, torch.tensor([5.0, -5.0]), 0.0, 1).backward()
    step = -logits.grad  # a gradient-descent step
    assert step[0, 0] < 0 and step[1, 1] > 0


def test_ppo_first_epoch_gives_the_pg_gradient():
    logits = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    actions = torch.tensor([0, 3, 1, 2, 2])
    q = torch.tensor([1.0, -2.0, 0.5, 3.0, -1.0])

    def grad(loss_fn):
        x = logits.clone().requires_grad_(True)
        logp = torch.log_softmax(x, -1)[torch.arange(5), actions]
        loss_fn(logp).backward()
        return x.grad

    old = torch.log_softmax(logits, -1)[torch.arange(5), actions].detach()
    for baseline in (0.0, q.mean()):
        pg = grad(lambda lp, b=baseline: pg_loss(lp, q, b, 2))
        ppo = grad(lambda lp, b=baseline: ppo_loss(lp, old, q, b, 0.1, 2))
        torch.testing.assert_close(ppo, pg)


def test_ppo_clips_large_ratios():
    old = torch.log(torch.tensor([0.5, 0.5]))
    new = torch.log(torch.tensor([0.9, 0.1])).requires_grad_(True)
    q = torch.tensor([-1.0, 1.0])  # both moved in the advantageous direction, beyond the clip
    loss = ppo_loss(new, old, q, 0.0, 0.1, 1)
    # ratios 1.8 and 0.2, advantages +1 and -1: min(1.8, 1.1) + min(-0.2, -0.9) = 0.2
    assert loss.item() == pytest.approx(-0.2)
    loss.backward()
    assert torch.all(new.grad == 0)  # clipped on both: no gradient


def test_refuel_loss_on_toy_tensors():
    logp = torch.tensor([-0.2, -1.0])
    old = torch.tensor([-0.5, -1.0])
    branch = torch.tensor([-2.0, -0.3])
    branch_old = torch.tensor([-1.5, -0.2])
    returns = torch.tensor([1.0, -1.0])
    branch_returns = torch.tensor([0.0, 0.5])
    eta = 0.5
    gains = [(-0.2 + 0.5) - (-2.0 + 1.5), (-1.0 + 1.0) - (-0.3 + 0.2)]
    targets = [eta * 1.0, eta * -1.5]
    expected = np.mean([(g - t) ** 2 for g, t in zip(gains, targets)])
    assert float(refuel_loss(logp, old, branch, branch_old, returns, branch_returns, eta)) == pytest.approx(expected)


def test_refuel_minimum_matches_return_gap():
    # At the optimum the log-ratio gain equals eta * (G - G').
    logp = torch.tensor([0.3]) - 1.0
    assert float(refuel_loss(logp, torch.tensor([-1.0]), torch.tensor([-1.0]), torch.tensor([-1.0]),
                             torch.tensor([0.6]), torch.tensor([0.0]), 0.5)) == pytest.approx(0.0, abs=1e-12)


def test_replay_buffer_keeps_recent_successes():
    buffer = ReplayBuffer(3)
    for i in range(6):
        buffer.add({"id": i, "success": i % 2 == 0})
    assert [e["id"] for e in buffer.episodes] == [0, 2, 4]
    buffer.add({"id": 6, "success": True})
    assert [e["id"] for e in buffer.episodes] == [2, 4, 6]
    picks = buffer.sample(2, np.random.default_rng(0))
    assert len(picks) == 2 and len({p["id"] for p in picks}) == 2
    assert len(buffer.sample(10, np.random.default_rng(0))) == 3
    clone = ReplayBuffer(1)
    clone.load_state_dict(buffer.state_dict())
    assert list(clone.episodes) == list(buffer.episodes) and clone.capacity == 3
    off = ReplayBuffer(0)
    off.add({"id": 1, "success": True})
    assert len(off) == 0 and off.sample(4, np.random.default_rng(0)) == []


def test_value_head_starts_at_zero_and_learns():
    head = ValueHead(4)
    hidden = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    assert torch.all(head(hidden) == 0)
    target = hidden @ torch.tensor([1.0, -2.0, 0.5, 0.0])
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    first = value_loss(head(hidden), target).item()
    for _ in range(200):
        optimizer.zero_grad()
        value_loss(head(hidden), target).backward()
        optimizer.step()
    assert value_loss(head(hidden), target).item() < first / 10
