"""AutoExplore: the gymnasium contract, the action list, costs, leave-out, modes (file views and tasks: test_auto_explore_views.py)."""

import os
import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from envs.auto_explore_tasks import optimal_path
from envs.sandbox_copy import pristine_copy
from envs.sandbox_paths import quote_path
from tests.auto_explore_repos import TARGET, build_repo, make_env, make_task, run, tree


@pytest.fixture
def repo(tmp_path):
    return build_repo(tmp_path / "demo_repo")


# --- the gymnasium contract -------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{}, {"shuffle_action": True, "leaveout_prob": 0.5}, {"first_step": True},
                                    {"oracle_completion": True}])
def test_check_env(repo, kwargs):
    env = make_env(repo, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    assert [str(w.message) for w in caught] == []
    env.close()


def test_same_seed_same_labels_same_episode(repo):
    def rollout(seed):
        env = make_env(repo, leaveout_prob=0.5, shuffle_action=True)
        obs, info = env.reset(seed=seed)
        record = [(obs, info)]
        picker = np.random.default_rng(seed)
        for _ in range(env.horizon):
            label = info["labels"][int(picker.integers(len(info["labels"])))]
            obs, reward, terminated, truncated, info = env.step(label)
            record.append((obs, reward, terminated, truncated, info))
            if terminated or truncated:
                break
        env.close()
        return record

    for seed in range(5):
        assert rollout(seed) == rollout(seed)
    assert rollout(0)[0] != rollout(1)[0] or rollout(0) != rollout(2)


# --- the observation and the action list ------------------------------------------------


def test_observation_sections(repo):
    env = make_env(repo)
    obs, _ = env.reset(seed=0)
    assert obs == (
        "# Task\nWhich file defines helper()?\n"
        "# Current working directory\ndemo_repo\n"
        "# Files under current working directory\nREADME.md\ndocs/\nempty/\nmain.py\nsrc/\n"
        "# Command history\n(none)\n"
        "# Execution result of your last command\n(none)\n"
        "# Choose from below your command\n"
        "0. cd docs\n1. cd empty\n2. cd src\n3. cat README.md\n4. cat main.py\n5. id README.md\n6. id main.py\n"
    )
    obs, *_ = env.step_command("cd src")
    assert "# Current working directory\ndemo_repo/src\n" in obs
    assert "# Command history\ncd src\n" in obs
    assert "# Execution result of your last command\nMoved to src.\n" in obs


def test_action_lists(repo):
    env = make_env(repo)
    _, info = env.reset(seed=0)
    assert info["actions"] == ["cd docs", "cd empty", "cd src", "cat README.md", "cat main.py",
                               "id README.md", "id main.py"]
    _, _, _, _, info = env.step(env.label_of("cd docs"))
    assert info["actions"] == ["cd ..", 'cat guide.rst', 'cat "my file.txt"', "id guide.rst", 'id "my file.txt"']
    env.step(env.label_of("cd .."))
    _, _, _, _, info = env.step(env.label_of("cd src"))
    # image.png is not an allowed suffix: neither listed nor offered
    assert info["actions"] == ["cd ..", "cd utils", "cat data.csv", "cat run.sh", "id data.csv", "id run.sh"]
    assert "image.png" not in env.observation
    _, _, _, _, info = env.step(env.label_of("cd .."))
    _, _, _, _, info = env.step(env.label_of("cd empty"))
    assert info["actions"] == ["cd .."]
    assert "# Files under current working directory\n(empty directory)\n" in env.observation


def test_quoted_names_round_trip(repo):
    env = make_env(repo, tasks=[make_task(repo, filename="docs/my file.txt")])
    env.reset(seed=0)
    assert optimal_path(env.task) == ["cd docs", 'cat "my file.txt"', 'id "my file.txt"']
    steps = run(env, optimal_path(env.task))
    assert steps[1][3]["error"] is False and steps[-1][3]["success"] is True
    assert quote_path("a b/c.py") == '"a b/c.py"' and quote_path("a-b/c_d+1.py") == "a-b/c_d+1.py"


def test_read_files_leave_cat_list_but_stay_in_id_list(repo):
    env = make_env(repo, cost_rule="outcome")
    env.reset(seed=0)
    _, _, _, _, info = env.step(env.label_of("cat main.py"))
    assert "cat main.py" not in info["actions"] and "id main.py" in info["actions"]
    assert "cat README.md" in info["actions"]
    # reading a file again (free-form) is a warning
    _, reward, *_ = env.step_command("cat main.py")
    assert reward == -2.0


# --- costs ------------------------------------------------------------------------------


def test_oracle_reaches_the_target_with_cost_steps_minus_horizon(repo):
    env = make_env(repo)
    _, info = env.reset(seed=3)
    total, steps = 0.0, 0
    while True:
        _, reward, terminated, truncated, info = env.step(info["oracle_label"])
        total, steps = total - reward, steps + 1
        if terminated or truncated:
            break
    assert terminated and info["success"] and info["correct"]
    assert steps == len(optimal_path(env.task)) == 4
    assert total == info["cost"] == steps - env.horizon


def test_oracle_recovers_from_a_detour(repo):
    env = make_env(repo)
    env.reset(seed=0)
    info = run(env, ["cd docs", "cat guide.rst"])[-1][3]
    commands = []
    while True:
        command = info["actions"][info["labels"].index(info["oracle_label"])]
        commands.append(command)
        _, _, terminated, truncated, info = env.step(info["oracle_label"])
        if terminated or truncated:
            break
    assert commands == ["cd ..", "cd src", "cd utils", "cat helpers.py", "id helpers.py"]
    assert info["cost"] == 7 - env.horizon


def test_wrong_identification_costs_steps_plus_horizon(repo):
    env = make_env(repo)
    env.reset(seed=0)
    (reward, terminated, truncated, info), = run(env, ["id main.py"])
    assert terminated and not truncated and not info["success"] and not info["correct"]
    assert -reward == info["cost"] == 1 + env.horizon


def test_running_out_of_steps_costs_horizon_twice(repo):
    env = make_env(repo, horizon=4)
    env.reset(seed=0)
    steps = run(env, ["cd src", "cd ..", "cd src", "cd .."])
    assert [s[2] for s in steps] == [False, False, False, True]
    assert not steps[-1][1] and not steps[-1][3]["success"]
    assert steps[-1][3]["cost"] == 4 + 4


def test_an_invalid_label_costs_a_step(repo):
    env = make_env(repo)
    obs, _ = env.reset(seed=0)
    again, reward, terminated, truncated, info = env.step("\u00d8")
    assert again == obs and reward == -1.0 and info["invalid_label"] and not (terminated or truncated)


def test_error_and_warning_costs(repo):
    env = make_env(repo, cost_rule="outcome")
    env.reset(seed=0)
    steps = run(env, ["cat nope.py", "cd nowhere", "id LICENSE", "ls", "ls docs", "ls docs", "head main.py",
                      "head main.py", "cat main.py", "tail main.py", "cd src", "cd .."])
    costs = [-reward for reward, *_ in steps]
    assert costs == [3, 3, 3, 2, 1, 2, 1, 2, 1, 2, 1, 1]
    assert [info["error"] for *_, info in steps[:3]] == [True] * 3
    assert not any(terminated or truncated for _, terminated, truncated, _ in steps)
    assert env.observation.count("# Execution result of your last command\nMoved to the repository root.") == 1


def test_errors_do_not_end_the_episode_and_say_error(repo):
    env = make_env(repo, cost_rule="outcome")
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step_command("id nothing.py")
    assert reward == -3 and not terminated and info["error"]
    assert "# Execution result of your last command\nError: " in obs


# --- leave-out ----------------------------------------------------------------------------


def test_leave_out_keeps_the_path_to_the_target(repo):
    on_path = {"src", "src/utils", TARGET}
    everything = tree(pristine_copy(repo))
    env = make_env(repo, leaveout_prob=1.0)
    for seed in range(10):
        env.reset(seed=seed)
        assert tree(env.sandbox_root) == on_path
    env = make_env(repo, leaveout_prob=0.0)
    env.reset(seed=0)
    assert tree(env.sandbox_root) == everything
    env = make_env(repo, leaveout_prob=0.5)
    copies = set()
    for seed in range(20):
        env.reset(seed=seed)
        copy = frozenset(tree(env.sandbox_root))
        assert on_path <= copy <= everything
        copies.add(copy)
    assert len(copies) > 1


def test_episode_copies_are_removed(repo):
    """A training episode's copy (entries left out) is its own, removed at the next reset and at close;
    without leave-out every episode reads the process's pristine copy, which the process keeps."""
    env = make_env(repo, leaveout_prob=0.5)
    env.reset(seed=0)
    first = env.sandbox_root
    env.reset(seed=1)
    assert not os.path.exists(first) and os.path.isdir(env.sandbox_root) and first != env.sandbox_root
    second = env.sandbox_root
    env.close()
    env.close()
    assert not os.path.exists(second)
    whole = make_env(repo)
    whole.reset(seed=0)
    assert whole.sandbox_root == pristine_copy(repo)
    whole.close()
    assert os.path.isdir(pristine_copy(repo))


# --- file views ---------------------------------------------------------------------------


# --- modes and tasks ----------------------------------------------------------------------


def test_easy_mode_question(repo):
    env = make_env(repo, easy=True)
    obs, _ = env.reset(seed=0)
    assert obs.startswith(f"# Task\nFind {TARGET}\n# Current working directory\n")


def test_oracle_completion_plays_the_rest_with_the_oracle(repo):
    env = make_env(repo, oracle_completion=True)
    results = {}
    for first in ("cd src", "cd docs", "id main.py", "cat main.py"):
        env.reset(seed=0)
        _, reward, terminated, truncated, info = env.step(env.label_of(first))
        assert terminated and not truncated and env.done
        results[first] = (reward, info["success"], info.get("oracle_completion"))
    # 'success' is whether the first decision was optimal, not whether the played-out episode was solved.
    assert results["cd src"] == (env.horizon - 4, True, ["cd utils", "cat helpers.py", "id helpers.py"])
    assert results["cd docs"][:2] == (env.horizon - 6, False)
    assert results["cat main.py"][:2] == (env.horizon - 5, False)
    assert results["id main.py"] == (-1 - env.horizon, False, None)
    assert results["cd src"][0] > results["cat main.py"][0] > results["cd docs"][0] > results["id main.py"][0]


def test_oracle_completion_charges_running_out(repo):
    env = make_env(repo, oracle_completion=True, horizon=3)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(env.label_of("cd docs"))
    assert terminated and not info["success"]
    assert -reward == 3 + 3 and info["oracle_completion"] == ["cd ..", "cd src"]


def test_step_command_matches_label_steps(repo):
    a, b = make_env(repo), make_env(repo)
    a.reset(seed=0)
    b.reset(seed=0)
    for command in ["cd src", "cat run.sh", "cd utils"]:
        assert a.step(a.label_of(command)) == b.step_command(command)




def test_keyword_costs_as_the_papers_code(repo):
    (repo / "errors.md").write_text("Error handling: every Warning is logged.\n")
    step, outcome, keywords = make_env(repo), make_env(repo, cost_rule="outcome"), make_env(repo, cost_rule="keywords")
    for env in (step, outcome, keywords):
        env.reset(seed=0)
    # Reading a file that mentions errors: no extra cost by outcome; error and warning costs by keywords.
    # The default (the paper's code in effect): every step costs 1, a failed command too.
    assert [-r for r, *_ in run(step, ["cat errors.md", "cat nope.py", "cat errors.md"])] == [1, 1, 1]
    assert [-r for r, *_ in run(outcome, ["cat errors.md", "cat nope.py"])] == [1, 3]
    assert [-r for r, *_ in run(keywords, ["cat errors.md", "cat nope.py"])] == [1 + 2 + 1, 3]
    with pytest.raises(ValueError, match="cost_rule"):
        make_env(repo, cost_rule="words")
