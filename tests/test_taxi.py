"""DangerousTaxi: gymnasium's dynamics, the dangerous rule, bonus, curricula, oracle, API."""

from collections import deque

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from envs import make_env
from envs.taxi import ACTION_NAMES, DANGER_REWARD, PICKUP_BONUS, REWARD_SCALE, DangerousTaxiEnv, render_grid
from prompts import LABELS, split_observation


def _raw_taxi():
    return gymnasium.make("Taxi-v4", is_rainy=False, fickle_passenger=False).unwrapped


def _bfs_length(taxi, state, goal):
    """Independent BFS: number of actions of a shortest safe plan."""
    seen, queue = {state}, deque([(state, 0)])
    while queue:
        current, depth = queue.popleft()
        for action in range(6):
            ((_, after, _, done),) = taxi.P[current][action]
            if after == current:
                continue
            if (done if goal == "deliver" else taxi.decode(after)[2] == 4 and taxi.decode(current)[2] != 4):
                return depth + 1
            if after not in seen:
                seen.add(after)
                queue.append((after, depth + 1))
    raise AssertionError("unreachable goal")


@pytest.mark.parametrize("kwargs", [{}, {"shuffle_action": True, "with_history": True, "with_prompt": True},
                                    {"curriculum": "dropoff"}, {"first_step": True}])
def test_check_env(kwargs):
    check_env(DangerousTaxiEnv(**kwargs), skip_render_check=True)


def test_same_seed_same_labels_same_rollout():
    def rollout(seed):
        env = make_env("taxi", shuffle_action=True, with_history=True)
        obs, info = env.reset(seed=seed)
        trace = [obs]
        choices = np.random.default_rng(0)
        for _ in range(30):
            obs, reward, terminated, truncated, info = env.step(str(choices.choice(info["labels"])))
            trace.append((obs, reward, terminated, truncated, sorted(info.items())))
            if terminated or truncated:
                obs, info = env.reset()
                trace.append(obs)
        return trace

    assert rollout(5) == rollout(5)
    assert rollout(5) != rollout(6)


@pytest.mark.parametrize("stage", ["plain", "full"])
@pytest.mark.parametrize("seed", range(4))
def test_safe_random_actions_agree_with_gymnasium(seed, stage):
    env = make_env("taxi", horizon=200, curriculum=stage)
    _, info = env.reset(seed=seed)
    raw = _raw_taxi()
    raw.reset(seed=0)
    raw.s = env.state
    rng = np.random.default_rng(seed)
    bonus_steps = 0
    for _ in range(60):
        safe = [a for a in range(6) if raw.P[raw.s][a][0][1] != raw.s]
        action = int(rng.choice(safe))
        passenger_before = raw.decode(raw.s)[2]
        state, base_reward, raw_done, _, _ = raw.step(action)
        _, reward, terminated, truncated, info = env.step(info["labels"][action])
        assert env.state == state
        picked_up = passenger_before != 4 and raw.decode(state)[2] == 4
        bonus = PICKUP_BONUS if stage == "full" and picked_up and bonus_steps == 0 else 0.0
        bonus_steps += bonus > 0
        # The paper's rule: in the curriculum's full task the first pickup's reward is the bonus itself (it
        # replaces the step's -1); without a curriculum (plain) there is no bonus.
        assert reward * REWARD_SCALE == pytest.approx(bonus if bonus else base_reward)
        assert terminated == raw_done
        grid = split_observation(env.observation, env.action_head)[0].split("--- Current State ---\n")[1]
        assert grid == render_grid(raw, state)
        if terminated or truncated:
            break
    assert bonus_steps <= 1


def _place(env, row, col, passenger, destination):
    env.state = env._taxi.encode(row, col, passenger, destination)
    env._observe()


@pytest.mark.parametrize("setup, action", [
    ((0, 0, 1, 2), 3),   # west into the outer wall
    ((0, 1, 2, 3), 2),   # east into the wall between (0,1) and (0,2)
    ((4, 4, 2, 3), 0),   # south off the map
    ((2, 2, 0, 1), 4),   # pickup with no passenger here
    ((2, 2, 0, 1), 5),   # drop-off with nobody in the taxi
    ((2, 2, 4, 1), 5),   # drop-off off a depot
    ((0, 0, 4, 1), 4),   # pickup while the passenger is already inside
])
def test_dangerous_moves_end_the_episode(setup, action):
    env = make_env("taxi")
    env.reset(seed=0)
    _place(env, *setup)
    _, reward, terminated, truncated, info = env.step(str(action))
    assert terminated and not truncated and info["danger"] and not info["success"]
    assert reward == DANGER_REWARD / REWARD_SCALE


@pytest.mark.parametrize(("rule", "first_pickup"), [("replace", 1.0), ("add", 0.95)])
def test_pickup_bonus_is_paid_once(rule, first_pickup):
    env = make_env("taxi", horizon=50, pickup_reward=rule, curriculum="full")
    env.reset(seed=0)
    _place(env, 0, 0, 0, 2)  # at R with the passenger, destination Y
    _, reward, terminated, *_ = env.step("4")
    assert reward == pytest.approx(first_pickup) and not terminated
    _place(env, 0, 4, 4, 2)  # drive (teleport) to G and drop the passenger at the wrong depot: legal
    _, reward, terminated, *_ = env.step("5")
    assert reward == pytest.approx(-1 / REWARD_SCALE) and not terminated
    _, reward, *_ = env.step("4")  # pick up again: no second bonus
    assert reward == pytest.approx(-1 / REWARD_SCALE)


def test_pickup_curriculum_ends_at_pickup_and_dropoff_has_no_bonus():
    env = make_env("taxi", curriculum="pickup")
    _, info = env.reset(seed=3)
    while True:
        _, reward, terminated, truncated, info = env.step(info["oracle_label"])
        if terminated or truncated:
            break
    assert terminated and info["success"] and env._taxi.decode(env.state)[2] == 4
    assert reward == pytest.approx(PICKUP_BONUS / REWARD_SCALE)


@pytest.mark.parametrize("seed", range(5))
def test_dropoff_starts_with_the_passenger_in_the_taxi(seed):
    env = make_env("taxi", curriculum="dropoff")
    obs, _ = env.reset(seed=seed)
    grid = split_observation(obs, env.action_head)[0].split("--- Current State ---")[1]
    assert env._taxi.decode(env.state)[2] == 4 and "X" in grid and "P" not in grid


@pytest.mark.parametrize("curriculum, goal", [("full", "deliver"), ("pickup", "pickup"), ("dropoff", "deliver")])
@pytest.mark.parametrize("seed", range(10))
def test_oracle_is_bfs_optimal_and_succeeds(curriculum, goal, seed):
    env = make_env("taxi", curriculum=curriculum, shuffle_action=True)
    _, info = env.reset(seed=seed)
    optimum = _bfs_length(env._taxi, env.state, goal)
    steps = 0
    while True:
        label = info["oracle_label"]
        assert label in info["labels"]
        _, _, terminated, truncated, info = env.step(label)
        steps += 1
        if terminated or truncated:
            break
    assert steps == optimum and terminated and info["success"]


def test_success_thresholds_use_total_cost():
    env = make_env("taxi", curriculum="pickup", horizon=50)
    env.reset(seed=0)
    _place(env, 1, 1, 0, 2)
    for label in ["0", "1"] * 9:  # 18 wandering steps, then back at (1,1)
        env.step(label)
    env.step("1")  # north to (0,1)
    _, _, terminated, _, info = env.step("3")  # west to R: 20 steps, not yet picked up
    _, _, terminated, _, info = env.step("4")  # pickup at step 21: cost = (20 - 20) / 20, not below 0
    assert terminated and not info["success"] and info["cost"] == pytest.approx(0.0)


def test_horizon_truncates():
    env = make_env("taxi", horizon=4)
    env.reset(seed=0)
    _place(env, 2, 2, 0, 1)
    results = [env.step(label) for label in ["0", "1", "0", "1"]]
    assert [r[3] for r in results] == [False, False, False, True]
    assert not results[-1][2] and results[-1][4]["success"] is False
    with pytest.raises(RuntimeError, match="reset"):
        env.step("0")


def test_invalid_label_leaves_state_unchanged():
    env = make_env("taxi")
    obs, info = env.reset(seed=0)
    state = env.state
    obs2, reward, terminated, truncated, info2 = env.step("Z")
    # An unusable answer is a wasted move: it costs what a move costs (-1, scaled by 1/20).
    assert (obs2, reward, terminated, truncated) == (obs, -0.05, False, False)
    assert info2["invalid_label"] and env.state == state and info2["labels"] == info["labels"]


def test_an_agent_that_never_answers_usably_pays_every_step():
    env = make_env("taxi", horizon=5)
    env.reset(seed=0)
    for _ in range(5):
        *_, terminated, truncated, info = env.step("\u00d8")
    assert truncated and not terminated and not info["success"]
    assert info["cost"] == pytest.approx(0.25)  # not 0.000, which would beat every trained model


def test_oracle_completion_scores_the_first_decision_with_the_oracles_return():
    good, bad = make_env("taxi", oracle_completion=True), make_env("taxi", oracle_completion=True)
    _, info = good.reset(seed=2, options={"curriculum": "full"})
    bad.reset(seed=2, options={"curriculum": "full"})
    oracle = info["oracle_label"]
    wrong = next(label for label in info["labels"][:4]
                 if label != oracle and bad._taxi.P[bad.state][int(label)][0][1] != bad.state)
    _, good_reward, terminated, _, good_info = good.step(oracle)
    _, bad_reward, bad_terminated, _, bad_info = bad.step(wrong)
    assert terminated and bad_terminated and good_reward > bad_reward
    # 'success' there is 'the decision was optimal', not 'the task was solved' (both were played out).
    assert good_info["success"] and not bad_info["success"]
    assert good_reward == pytest.approx(-good_info["cost"])


def test_text_modes():
    env = make_env("taxi", with_prompt=True, with_history=True)
    obs, info = env.reset(seed=1)
    assert obs.startswith("You are driving a taxi") and "--- Initial State ---" in obs
    obs, *_ = env.step(info["oracle_label"])
    assert "--- Step 1: " in obs and obs.count("+---------+") == 6
    plain = make_env("taxi")
    obs, info = plain.reset(seed=1)
    obs, *_ = plain.step(info["oracle_label"])
    assert "Previous actions: " + ACTION_NAMES[int(info["oracle_label"])] in obs
    assert obs.endswith("".join(f"{i}. {name}\n" for i, name in enumerate(ACTION_NAMES)))


def test_shuffled_labels_are_a_random_sample():
    env = make_env("taxi", shuffle_action=True)
    seen = set()
    for seed in range(5):
        _, info = env.reset(seed=seed)
        assert len(set(info["labels"])) == 6 and set(info["labels"]) <= set(LABELS)
        assert info["actions"] == list(ACTION_NAMES)
        seen.add(tuple(info["labels"]))
    assert len(seen) == 5


def test_bad_curriculum_is_named():
    with pytest.raises(ValueError, match="curriculum"):
        make_env("taxi", curriculum="fly")
    with pytest.raises(ValueError, match="unknown environment"):
        make_env("chess")



MOVES = (0, 2, 1, 3, 0, 0, 2, 2)


def test_environments_share_gymnasiums_table_and_nothing_else():
    """One transition table per process (building it was most of an environment's construction); each
    environment's state stays its own: two played in alternation give what each gives alone."""
    first, second = DangerousTaxiEnv(), DangerousTaxiEnv()
    assert first._taxi.P is second._taxi.P and first._taxi is not second._taxi
    assert first._taxi.P == _raw_taxi().P

    def play(envs_and_seeds):
        traces = [[env.reset(seed=seed)[0]] for env, seed in envs_and_seeds]
        done = [False] * len(traces)
        for action in MOVES:
            for i, (env, _) in enumerate(envs_and_seeds):
                if not done[i]:
                    obs, reward, terminated, truncated, _ = env.step(action)
                    traces[i].append((obs, reward))
                    done[i] = terminated or truncated
        return traces

    alone = play([(DangerousTaxiEnv(), 3)]) + play([(DangerousTaxiEnv(), 4)])
    assert play([(first, 3), (second, 4)]) == alone and alone[0] != alone[1]
