"""AutoExplore: the gymnasium contract, the action list, costs, leave-out, file views, modes."""

import os
import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from envs.auto_explore import AutoExploreEnv, optimal_path
from envs.sandbox import MAX_TOKENS, TOKEN_RE, file_kind, pristine_copy, quote_path

TARGET = "src/utils/helpers.py"


def write(path, text: str = "x\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def repo(tmp_path):
    """A small known tree: folders, allowed and disallowed files, a name with a space, an empty folder."""
    root = tmp_path / "demo_repo"
    write(root / "README.md", "# Demo\nA demo repository.\n")
    write(root / "main.py", "import os\nprint('main')\n")
    write(root / "LICENSE", "\n".join(f"license line {i}" for i in range(30)) + "\n")
    write(root / "docs" / "my file.txt", "notes\n")
    write(root / "docs" / "guide.rst", "Guide\n=====\n")
    write(root / "src" / "data.csv", "".join(f"{i},{i * i}\n" for i in range(20)))
    write(root / "src" / "run.sh", "echo run\n")
    write(root / "src" / "image.png", "not really\n")
    write(root / TARGET, "def helper():\n    return 42\n")
    write(root / "src" / "utils" / "more.go", "package utils\n")
    (root / "empty").mkdir()
    return root


def make_task(repo, filename=TARGET, question="Which file defines helper()?") -> dict:
    return {"question": question, "answer": "helpers.py", "filename": filename, "root": str(repo),
            "optimal_path": [], "n_level": 2, "model": "test"}


def make_env(repo, **kwargs) -> AutoExploreEnv:
    kwargs.setdefault("tasks", [make_task(repo)])
    return AutoExploreEnv(**kwargs)


def run(env, commands):
    """Step through ``commands``; the list of (reward, terminated, truncated, info)."""
    steps = []
    for command in commands:
        _, reward, terminated, truncated, info = env.step_command(command)
        steps.append((reward, terminated, truncated, info))
    return steps


def tree(root) -> set[str]:
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in dirnames + filenames:
            found.add(os.path.normpath(os.path.join(rel, name)))
    return found


# --- the gymnasium contract -------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{}, {"shuffle_action": True, "leaveout_prob": 0.5}, {"first_step": True}])
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
    env = make_env(repo)
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


def test_error_and_warning_costs(repo):
    env = make_env(repo)
    env.reset(seed=0)
    steps = run(env, ["cat nope.py", "cd nowhere", "id LICENSE", "ls", "ls docs", "ls docs", "head main.py",
                      "head main.py", "cat main.py", "tail main.py", "cd src", "cd .."])
    costs = [-reward for reward, *_ in steps]
    assert costs == [3, 3, 3, 2, 1, 2, 1, 2, 1, 2, 1, 1]
    assert [info["error"] for *_, info in steps[:3]] == [True] * 3
    assert not any(terminated or truncated for _, terminated, truncated, _ in steps)
    assert env.observation.count("# Execution result of your last command\nMoved to the repository root.") == 1


def test_errors_do_not_end_the_episode_and_say_error(repo):
    env = make_env(repo)
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
    env = make_env(repo)
    env.reset(seed=0)
    first = env.sandbox_root
    env.reset(seed=1)
    assert not os.path.exists(first) and os.path.isdir(env.sandbox_root)
    second = env.sandbox_root
    env.close()
    env.close()
    assert not os.path.exists(second)


# --- file views ---------------------------------------------------------------------------


def last_result(obs: str) -> str:
    return obs.split("# Execution result of your last command\n")[1].split("# Choose from below")[0][:-1]


def cat(env, name: str) -> str:
    obs, *_ = env.step_command(f"cat {name}")
    return last_result(obs)


def test_cat_truncation_by_kind(repo):
    write(repo / "short.py", "a = 1\nb = 2\n")
    write(repo / "long.py", " \n" * 1200)  # blank lines: the line limit, not the token cap, applies
    write(repo / "table.tsv", "".join(f"{i}\t{i}\n" for i in range(9)))
    write(repo / "notes.md", "".join(f"n{i}\n" for i in range(150)))
    write(repo / "plain", "".join(f"p{i}\n" for i in range(12)))
    write(repo / "empty.txt", "")
    env = AutoExploreEnv(tasks=[make_task(repo)])
    env.reset(seed=0)
    assert cat(env, "short.py") == "a = 1\nb = 2"
    assert cat(env, "empty.txt") == "(empty file)"
    long = cat(env, "long.py").splitlines()
    assert len(long) == 1001 and long[-1] == "[output cut (1000-line limit for this file type): showed 1000 of 1200 lines]"
    assert cat(env, "src/data.csv").splitlines() == ["0,0", "1,1", "2,4", "3,9", "4,16",
                                                     "[output cut (5-line limit for this file type): showed 5 of 20 lines]"]
    assert cat(env, "table.tsv").splitlines()[-1].endswith("showed 5 of 9 lines]")
    notes = cat(env, "notes.md").splitlines()
    assert notes[:2] == ["n0", "n1"] and len(notes) == 101 and notes[-1].endswith("showed 100 of 150 lines]")
    plain = cat(env, "plain").splitlines()
    assert plain[-2:] == ["p9", "[output cut (10-line limit for this file type): showed 10 of 12 lines]"]
    assert cat(env, "LICENSE").splitlines()[-1].endswith("showed 10 of 30 lines]")
    assert file_kind("run.SH") == "exec" and file_kind("LICENSE") is None


def test_cat_token_cap(repo):
    write(repo / "big.py", "".join(f"value_{i} = {i}\n" for i in range(400)))  # 3 tokens a line
    write(repo / "word.txt", "w" * 10_000 + "\n")  # one huge "token": the character cap applies
    env = AutoExploreEnv(tasks=[make_task(repo)])
    env.reset(seed=0)
    *body, note = cat(env, "big.py").splitlines()
    assert len(TOKEN_RE.findall("\n".join(body))) == MAX_TOKENS
    assert body[0] == "value_0 = 0" and note.startswith(f"[output cut (~{MAX_TOKENS}-token limit)")
    assert note.endswith("of 400 lines]")
    body, note = cat(env, "word.txt").splitlines()
    assert len(body) < 5000 and "token limit" in note


def test_head_and_tail(repo):
    write(repo / "lines.txt", "".join(f"line {i}\n" for i in range(30)))
    write(repo / "wide.py", "".join(" ".join(f"t{i}_{j}" for j in range(100)) + "\n" for i in range(12)))
    env = AutoExploreEnv(tasks=[make_task(repo)])
    env.reset(seed=0)
    obs, *_ = env.step_command("head lines.txt")
    assert last_result(obs).splitlines() == [f"line {i}" for i in range(10)]
    obs, *_ = env.step_command("tail lines.txt")
    assert last_result(obs).splitlines() == [f"line {i}" for i in range(20, 30)]
    obs, *_ = env.step_command("head wide.py")
    *body, note = last_result(obs).splitlines()
    assert body[0].startswith("t0_0 ") and len(TOKEN_RE.findall("\n".join(body))) == MAX_TOKENS
    assert note.startswith("[output cut") and "first" in note
    obs, *_ = env.step_command("tail wide.py")
    *body, note = last_result(obs).splitlines()
    assert body[-1].endswith("t11_99") and len(TOKEN_RE.findall("\n".join(body))) <= MAX_TOKENS
    assert "last" in note


# --- modes and tasks ----------------------------------------------------------------------


def test_easy_mode_question(repo):
    env = make_env(repo, easy=True)
    obs, _ = env.reset(seed=0)
    assert obs.startswith("# Task\nFind helpers.py\n# Current working directory\n")


def test_first_step_mode_completes_with_the_oracle(repo):
    env = make_env(repo, first_step=True)
    results = {}
    for first in ("cd src", "cd docs", "id main.py", "cat main.py"):
        env.reset(seed=0)
        _, reward, terminated, truncated, info = env.step(env.label_of(first))
        assert terminated and not truncated and env.done
        results[first] = (reward, info["success"], info.get("oracle_completion"))
    assert results["cd src"] == (env.horizon - 4, True, ["cd utils", "cat helpers.py", "id helpers.py"])
    assert results["cd docs"][:2] == (env.horizon - 6, True)
    assert results["cat main.py"][:2] == (env.horizon - 5, True)
    assert results["id main.py"] == (-1 - env.horizon, False, None)
    assert results["cd src"][0] > results["cat main.py"][0] > results["cd docs"][0] > results["id main.py"][0]


def test_first_step_mode_charges_running_out(repo):
    env = make_env(repo, first_step=True, horizon=3)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(env.label_of("cd docs"))
    assert terminated and not info["success"]
    assert -reward == 3 + 3 and info["oracle_completion"] == ["cd ..", "cd src"]


def test_several_targets_oracle_takes_the_nearest(repo):
    task = make_task(repo, filename=[TARGET, "docs/guide.rst"])
    env = make_env(repo, tasks=[task])
    assert optimal_path(task) == ["cd docs", "cat guide.rst", "id guide.rst"]
    _, info = env.reset(seed=0)
    assert env.targets == ["docs/guide.rst", TARGET]
    assert info["actions"][info["labels"].index(info["oracle_label"])] == "cd docs"
    run(env, ["cd src"])  # now the other target is nearer
    assert env._oracle_command() == "cd utils"
    steps = run(env, ["cd utils", "cat helpers.py", "id helpers.py"])
    assert steps[-1][3]["success"]


def test_task_from_options_and_repos_dir(repo):
    env = AutoExploreEnv(repos_dir=repo.parent)
    task = make_task(repo)
    task["root"] = "demo_repo"
    obs, _ = env.reset(seed=0, options={"task": task})
    assert "# Current working directory\ndemo_repo\n" in obs and env.cwd == ""
    other = AutoExploreEnv()
    other.reset(seed=0, options={"task": task, "repos_dir": str(repo.parent)})
    assert other.targets == [TARGET]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"filename": "src/utils/missing.py"}, "src/utils/missing.py"),
        ({"filename": "src/image.png"}, "allowed suffix"),
        ({"filename": "../outside.py"}, "filename"),
        ({"filename": []}, "filename"),
        ({"question": None}, "question"),
        ({"root": "no_such_repo"}, "no_such_repo"),
    ],
)
def test_bad_tasks_raise_naming_the_value(repo, change, message):
    task = {**make_task(repo), **change}
    env = AutoExploreEnv(repos_dir=repo.parent)
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        env.reset(seed=0, options={"task": task})


def test_reset_without_any_task_raises():
    with pytest.raises(ValueError, match="task"):
        AutoExploreEnv().reset(seed=0)
    with pytest.raises(ValueError, match="leaveout_prob"):
        AutoExploreEnv(leaveout_prob=1.5)


def test_step_command_matches_label_steps(repo):
    a, b = make_env(repo), make_env(repo)
    a.reset(seed=0)
    b.reset(seed=0)
    for command in ["cd src", "cat run.sh", "cd utils"]:
        assert a.step(a.label_of(command)) == b.step_command(command)
