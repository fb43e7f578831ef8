"""AutoExplore plays as the paper's code does (``../shared/PARITY.md``, "Checked by playing"): fixed
command sequences on a known repository, asserting the rewards, ends, success and curriculum levels
the paper's rules give.

Rules used: a step costs 1 whatever it shows (the paper's keyword costs never match); identifying a
target gains the horizon, a wrong file pays it; ``first_step`` is one decision: the task's first
optimal command earns 100 + horizon, any other a step's cost; success is a total cost < 0.01.
"""

import json

import numpy as np
import pytest

from envs import EnvSettings, env_kwargs, make_env
from envs.auto_explore_tasks import depth_curriculum, run_tasks
from experiment_args import parse_args
from tests.auto_explore_repos import TARGET, build_repo, make_task, run


@pytest.fixture
def repo(tmp_path):
    return build_repo(tmp_path / "repos" / "demo_repo")


def _task(repo, **fields):
    return dict(make_task(repo), optimal_path=["cd src", "cd utils", "cat helpers.py", "id helpers.py"], **fields)


def _paper_env(repo, tmp_path, *flags):
    task_file = tmp_path / "tasks.json"
    task_file.write_text(json.dumps([_task(repo)]))
    args = parse_args(["--preset=paper", "--env=auto_explore", f"--task_file={task_file}",
                       "--auto_explore_targets=task", *flags])
    return make_env("auto_explore", **env_kwargs(EnvSettings.from_args(args), evaluation=True)), args


def test_the_paper_preset_charges_one_for_reading_a_file_that_mentions_error(repo, tmp_path):
    (repo / "errors.md").write_text("Error: this file documents every Error and Warning.\n")
    env, args = _paper_env(repo, tmp_path)
    assert args.auto_explore_costs == "step"
    env.reset(seed=0, options={"task": _task(repo)})
    ((reward, *_),) = run(env, ["cat errors.md"])
    assert reward == -1 and "Error: this file documents" in env.observation  # shown, and not charged
    assert [-reward for reward, *_ in run(env, ["cat nope.md", "cd src"])] == [1, 1]


def test_the_default_returns_match_the_papers(repo):
    env = make_env("auto_explore", tasks=[_task(repo)])
    env.reset(seed=0)
    steps = run(env, ["cd src", "cd utils", "cat helpers.py", "id helpers.py"])
    assert [r for r, *_ in steps] == [-1, -1, -1, -1 + env.horizon] and steps[-1][1]
    assert steps[-1][3]["success"] and steps[-1][3]["cost"] == 4 - env.horizon
    env.reset(seed=0)
    steps = run(env, ["id main.py"])
    assert steps[0][0] == -1 - env.horizon and steps[0][1] and not steps[0][3]["success"]


def test_in_label_play_the_outcome_rule_charges_what_the_papers_does(repo):
    """The labels never offer a failing or repeated command, so 'outcome' and 'step' agree there."""
    for seed in range(20):
        rewards = {}
        for rule in ("step", "outcome"):
            env = make_env("auto_explore", tasks=[_task(repo)], cost_rule=rule)
            _, info = env.reset(seed=seed)
            picks, got = np.random.default_rng(seed), []
            while True:
                _, reward, terminated, truncated, info = env.step(str(picks.choice(info["labels"])))
                got.append(reward)
                if terminated or truncated:
                    break
            rewards[rule] = got
        assert rewards["step"] == rewards["outcome"]


@pytest.mark.parametrize("first, reward, success", [("cd src", 100 + 15, True), ("cd docs", -1, False),
                                                      ("cat main.py", -1, False), ("id main.py", -1 - 15, False)])
def test_first_step_scores_one_decision(repo, first, reward, success):
    env = make_env("auto_explore", tasks=[_task(repo)], first_step=True)
    env.reset(seed=0)
    ((got, terminated, truncated, info),) = run(env, [first])
    assert got == reward and terminated and not truncated and env.done and info["success"] == success


def test_a_random_policys_first_step_success_rate_is_not_above_half(repo):
    env = make_env("auto_explore", tasks=[_task(repo)], first_step=True)
    rng, wins = np.random.default_rng(0), []
    for seed in range(60):
        _, info = env.reset(seed=seed)
        *_, terminated, _, info = env.step(str(rng.choice(info["labels"])))
        assert terminated
        wins.append(info["success"])
    assert 0 < np.mean(wins) <= 0.5


def _tasks(repo, depths_per_task):
    files = {0: "main.py", 1: "src/run.sh", 2: TARGET}
    return [dict(make_task(repo, filename=[files[d] for d in depths], question=f"q{i}"), n_level=min(depths))
            for i, depths in enumerate(depths_per_task)]


def test_a_multi_target_task_is_placed_at_every_depth_of_its_targets(repo):
    tasks = _tasks(repo, [[1, 2], [2]])
    curriculum = depth_curriculum(tasks, 100)
    assert [level.name for level in curriculum.levels] == ["depth 1", "depth 2"]
    assert [[t["question"] for t in level.tasks] for level in curriculum.levels] == [["q0"], ["q0", "q1"]]


def test_merge_first_two_without_depth_0_merges_depths_1_and_2(repo):
    tasks = _tasks(repo, [[1], [2], [2]])
    curriculum = depth_curriculum(tasks, 30, merge_first_two=True)
    assert [level.name for level in curriculum.levels] == ["depth 1+2"]
    assert len(curriculum.levels[0].tasks) == 3


def test_the_papers_schedule_on_ten_tasks_and_a_thousand_steps(repo):
    # 9 tasks, one with targets at depths 0 and 1: 10 placements (1 / 3 / 4 / 2 over depths 0..3 after merging).
    depths = [[0], [0, 1], [1], [1], [2], [2], [2], [2], [1]]
    tasks = _tasks(repo, depths)
    curriculum = depth_curriculum(tasks, 1000, merge_after_first_k=3)
    assert [len(level.options) for level in curriculum.levels] == [2, 4, 4]
    # The paper's rule: max_steps // placements per placement, the rest to the last level.
    assert [0] + curriculum.boundaries()[:-1] == [0, 200, 600] and curriculum.boundaries()[-1] == 1000


def test_level_starts_as_the_paper_measured(repo, tmp_path):
    """PARITY.md: on 10 placements over 4 depths and 1000 steps the paper's levels start at 0/100/400/800."""
    deep = repo / "src" / "utils" / "deeper"
    deep.mkdir()
    (deep / "x.py").write_text("x = 1\n")
    files = {0: "main.py", 1: "src/run.sh", 2: TARGET, 3: "src/utils/deeper/x.py"}
    spec = [[0], [1, 2], [1], [1], [2], [2], [2], [3], [3]]
    tasks = [make_task(repo, filename=[files[d] for d in depths], question=f"q{i}") for i, depths in enumerate(spec)]
    curriculum = depth_curriculum(tasks, 1000)
    assert [len(level.options) for level in curriculum.levels] == [1, 3, 4, 2]
    assert [0] + curriculum.boundaries()[:-1] == [0, 100, 400, 800]


def test_tasks_with_an_empty_question_are_dropped_unless_easy(repo, tmp_path):
    task_file = tmp_path / "tasks.json"
    task_file.write_text(json.dumps([_task(repo, question=""), _task(repo, question="where?")]))
    argv = ["--env=auto_explore", f"--task_file={task_file}"]
    assert [t["question"] for t in run_tasks(EnvSettings.from_args(parse_args(argv)))] == ["where?"]
    assert len(run_tasks(EnvSettings.from_args(parse_args(argv + ["--easy"])))) == 2


def test_easy_names_one_target_by_its_path_and_only_it_counts(repo):
    task = make_task(repo, filename=[TARGET, "main.py"])
    env = make_env("auto_explore", tasks=[task], easy=True)
    seen = set()
    for seed in range(12):
        obs, _ = env.reset(seed=seed)
        (target,) = env.targets
        assert obs.startswith(f"# Task\nFind {target}\n")
        seen.add(target)
    assert seen == {TARGET, "main.py"}
    obs, _ = env.reset(seed=next(s for s in range(12) if env.reset(seed=s) and env.targets == ["main.py"]))
    ((reward, terminated, _, info),) = run(env, ["id main.py"])
    assert info["success"]
    env.reset(seed=next(s for s in range(12) if env.reset(seed=s) and env.targets == [TARGET]))
    ((reward, terminated, _, info),) = run(env, ["id main.py"])  # the other file no longer counts
    assert terminated and not info["success"]


def test_leave_out_keeps_every_entry_whose_path_prefixes_a_targets(repo):
    (repo / "src" / "util").mkdir()  # 'src/util' is a prefix of 'src/utils/helpers.py' (as strings)
    (repo / "src" / "util" / "a.py").write_text("left out: not a prefix\n")
    env = make_env("auto_explore", tasks=[make_task(repo)], leaveout_prob=1.0)
    env.reset(seed=0)
    run(env, ["cd src"])
    assert env._sandbox.entries() == (["util", "utils"], [])
    run(env, ["cd util"])
    assert env._sandbox.entries() == ([], [])


def test_the_papers_sandbox_dir_flag_places_the_copies(repo, tmp_path):
    args = parse_args(["--env=auto_explore", f"--sandbox_dir={tmp_path / 'boxes'}"])
    env = make_env("auto_explore", **env_kwargs(EnvSettings.from_args(args)), tasks=[make_task(repo)])
    env.reset(seed=0)
    assert env.sandbox_root.startswith(str((tmp_path / "boxes").resolve()))
    env.close()


def test_the_validation_panel_plays_the_validation_tasks(repo, tmp_path):
    from evaluation.episodes import test_episodes, validation_episodes

    train, valid = tmp_path / "train.json", tmp_path / "validate.json"
    train.write_text(json.dumps([_task(repo, question="train q")]))
    valid.write_text(json.dumps([_task(repo, question="valid q")]))
    args = parse_args(["--env=auto_explore", f"--task_file={train}", f"--validation_task_file={valid}"])
    env = make_env("auto_explore", **env_kwargs(EnvSettings.from_args(args), evaluation=True))
    assert {s.options["task"]["question"] for s in validation_episodes(args, env, 2)} == {"valid q"}
    assert {s.options["task"]["question"] for s in test_episodes(args, env, 2)} == {"train q"}
    with pytest.raises(ValueError, match="--validation_task_file: no such file"):
        validation_episodes(parse_args(["--env=auto_explore", f"--task_file={train}",
                                        f"--validation_task_file={tmp_path / 'none.json'}"]), env, 1)


def test_evaluation_repeats_a_levels_few_tasks_to_its_minimum_and_plays_only_the_levels_asked(repo, tmp_path):
    """--eval_level_episodes N: each depth gets at least N episodes (its tasks repeated alike); --eval_levels
    keeps the named depths only; figures count the distinct tasks behind them."""
    from evaluation.episodes import HELD_OUT_SEED, test_episodes
    from evaluation.report import figures
    from rollout import Episode

    tasks = _tasks(repo, [[0], [1], [2], [2], [2]])
    task_file = tmp_path / "test.json"
    task_file.write_text(json.dumps(tasks))
    args = parse_args(["--env=auto_explore", f"--task_file={task_file}", "--eval_level_episodes=7"])
    env = make_env("auto_explore", **env_kwargs(EnvSettings.from_args(args), evaluation=True))
    starts = test_episodes(args, env, 2, args.eval_level_episodes)
    per_level = {level: [s for s in starts if s.level == level] for level in ("depth 0", "depth 1", "depth 2")}
    assert {level: len(group) for level, group in per_level.items()} == {"depth 0": 7, "depth 1": 7, "depth 2": 9}
    assert [s.seed - HELD_OUT_SEED for s in per_level["depth 2"]] == [0, 1, 2] * 3  # each task 3 times alike
    assert test_episodes(args, env, 10, 7)[:10] == test_episodes(args, env, 10)[:10]  # reps above the minimum win

    only = parse_args(["--env=auto_explore", f"--task_file={task_file}", "--eval_levels", "depth 1", "depth 2"])
    assert {s.level for s in test_episodes(only, env, 1)} == {"depth 1", "depth 2"}
    with pytest.raises(ValueError, match="--eval_levels: no held-out unit is at any of \\['depth 5'\\]"):
        test_episodes(parse_args(["--env=auto_explore", f"--task_file={task_file}", "--eval_levels", "depth 5"]),
                      env, 1)
    episodes = [Episode(seed=s.seed, options=s.options, level=s.level, success=True) for s in per_level["depth 2"]]
    assert figures(episodes)["units"] == 3 and figures(episodes)["episodes"] == 9
    env.close()
