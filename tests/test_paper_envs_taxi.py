"""Taxi plays as the paper's code does (``../shared/PARITY.md``, "Checked by playing"): fixed action
sequences from fixed states, asserting the rewards, ends and success the paper's rules give.

Rules used (all rewards /20): a move costs -1; delivering earns +20; without ``--taxi_curriculum`` the
task has no pickup bonus and the paper's success threshold (cost < -1) is out of reach, so success is
the delivery; ``first_step`` is one decision scored by its own reward; the paper's code checks the
dangerous rule from the second step only (``--no_danger_on_first_step``).
"""

import numpy as np
import pytest

from envs import EnvSettings, env_kwargs, make_env
from envs.taxi import ACTION_NAMES, PLAIN, shortest_plan
from experiment_args import parse_args

SOUTH, NORTH, EAST, WEST, PICKUP, DROPOFF = range(6)


def _at(env, row, col, passenger, destination):
    env.state = env._taxi.encode(row, col, passenger, destination)
    env._initial_grid = env._grid(env.state)
    env._observe()


def _play(env, actions):
    """Step the given action indices; the rewards, and the last step's (terminated, truncated, info)."""
    rewards = []
    for action in actions:
        _, reward, terminated, truncated, info = env.step(str(action))
        rewards.append(reward)
        if terminated or truncated:
            break
    return rewards, terminated, truncated, info


def test_without_a_curriculum_a_pickup_earns_one_moves_cost():
    # the flags' defaults: no curriculum
    env = make_env("taxi", **env_kwargs(EnvSettings.from_args(parse_args(["--env", "taxi"]))))
    env.reset(seed=0)
    assert env.stage == PLAIN
    _at(env, 0, 0, 0, 2)  # at R, the passenger at R, destination Y
    rewards, terminated, *_ = _play(env, [PICKUP])
    assert rewards == [pytest.approx(-0.05)] and not terminated


def test_without_a_curriculum_the_delivery_is_the_success():
    env = make_env("taxi", horizon=50)
    env.reset(seed=0)
    _at(env, 0, 0, 0, 2)  # R -> Y: pickup, then the shortest drive and the drop-off
    plan = [PICKUP] + shortest_plan(env._taxi, env._taxi.encode(0, 0, 4, 2), "deliver")
    rewards, terminated, truncated, info = _play(env, plan)
    assert terminated and not truncated and info["success"]
    assert rewards[-1] == pytest.approx(1.0) and all(r == pytest.approx(-0.05) for r in rewards[:-1])
    # The paper's threshold could not have counted it: cost 0.05 * (moves) - 1 > -1.
    assert info["cost"] == pytest.approx(0.05 * (len(plan) - 1) - 1.0) and info["cost"] > -1


def test_the_curriculums_full_task_pays_the_bonus_and_keeps_the_papers_threshold():
    env = make_env("taxi", horizon=50, curriculum="full")
    env.reset(seed=0)
    _at(env, 0, 0, 0, 2)
    plan = [PICKUP] + shortest_plan(env._taxi, env._taxi.encode(0, 0, 4, 2), "deliver")
    rewards, terminated, _, info = _play(env, plan)
    assert rewards[0] == pytest.approx(1.0) and terminated and info["success"] and info["cost"] < -1


@pytest.mark.parametrize("curriculum", ["pickup", "dropoff", "full", "plain"])
def test_first_step_is_one_decision_scored_on_its_own(curriculum):
    env = make_env("taxi", first_step=True, curriculum=curriculum)
    _, info = env.reset(seed=4)
    _, reward, terminated, truncated, info = env.step(info["oracle_label"])
    assert terminated and env.done and env.steps == 1
    assert reward in (pytest.approx(-0.05), pytest.approx(1.0))  # a move, or a pickup's bonus
    assert info["success"] == (reward > 0 and curriculum == "pickup")


def test_first_step_pickup_in_one_decision_is_the_only_success():
    env = make_env("taxi", first_step=True, curriculum="pickup")
    env.reset(seed=0)
    _at(env, 0, 0, 0, 2)
    rewards, terminated, _, info = _play(env, [PICKUP])
    assert rewards == [pytest.approx(1.0)] and terminated and info["success"]


def test_a_random_policys_first_step_success_rate_is_low():
    env = make_env("taxi", first_step=True, curriculum="pickup")
    rng = np.random.default_rng(0)
    wins = []
    for seed in range(200):
        _, info = env.reset(seed=seed)
        *_, terminated, _, info = env.step(str(rng.choice(info["labels"])))
        assert terminated
        wins.append(info["success"])
    assert np.mean(wins) <= 0.5


@pytest.mark.parametrize("action, reward", [(WEST, -0.05), (PICKUP, -0.5)])
def test_the_papers_code_spares_a_pointless_first_move(action, reward):
    """From (0, 0) west is the wall; a pickup there with the passenger at G is illegal (gymnasium: -10)."""
    env = make_env("taxi", danger_on_first_step=False, horizon=50)
    env.reset(seed=0)
    _at(env, 0, 0, 1, 2)
    rewards, terminated, truncated, info = _play(env, [action])
    assert rewards == [pytest.approx(reward)] and not terminated and not truncated and "danger" not in info
    rewards, terminated, _, info = _play(env, [action])  # from the second step the rule holds
    assert rewards == [pytest.approx(-0.5)] and terminated and info["danger"]


def test_our_rule_holds_from_the_first_step():
    env = make_env("taxi", horizon=50)
    env.reset(seed=0)
    _at(env, 0, 0, 1, 2)
    rewards, terminated, _, info = _play(env, [WEST])
    assert rewards == [pytest.approx(-0.5)] and terminated and info["danger"]


def test_the_papers_map_hides_the_depot_letters():
    shown, hidden = make_env("taxi", with_prompt=True), make_env("taxi", with_prompt=True, depot_letters=False)
    a, _ = shown.reset(seed=1)
    b, _ = hidden.reset(seed=1)
    grid = lambda obs: obs.split("--- Current State ---\n")[1].split("The actions")[0]  # noqa: E731
    assert any(letter in grid(a) for letter in "RGYB")
    assert not any(letter in grid(b) for letter in "RGYB")
    assert "R (top left)" in a and "R (top left)" not in b  # the rules no longer name letters not shown


def test_the_papers_history_lists_one_action_per_line():
    env = make_env("taxi", text_layout="paper", horizon=50)
    _, info = env.reset(seed=1)
    for _ in range(2):
        obs, *_, info = env.step(info["oracle_label"])
    names = [name for name, _ in env._history]
    assert len(names) == 2 and set(names) <= set(ACTION_NAMES)
    assert "--- History ---\nActions taken so far, in order:\n" + "".join(f"{n}\n" for n in names) in obs


def test_evaluation_names_the_played_out_bandits_figure_for_what_it_is():
    from evaluation.report import markdown_table, success_name

    results = [{"name": "x", "levels": {"all": {"success": 0.5, "cost": 0.1, "episodes": 2}}}]
    assert success_name(parse_args(["--env=taxi", "--oracle_completion"])) == "optimal 1st decision"
    assert "all: optimal 1st decision (n)" in markdown_table(results, "optimal 1st decision")
    assert success_name(parse_args(["--env=taxi", "--first_step"])) == "success"
