"""Curricula: Taxi thirds, AutoExplore depth levels, proportional schedules, one level; the tasks a run plays."""

import json

import pytest
import torch

from envs import EnvSettings, training_curriculum
from envs.auto_explore import AutoExploreEnv
from envs.auto_explore_tasks import depth_curriculum, run_tasks, task_depth
from envs.curriculum import proportional_steps
from envs.taxi import taxi_curriculum
from tests.auto_explore_repos import TARGET, build_repo, make_task, run


def _tasks(depth_counts):
    tasks = []
    for depth, count in depth_counts.items():
        for i in range(count):
            tasks.append({"filename": "/".join([f"d{k}" for k in range(depth)] + [f"f{i}.py"])})
    return tasks


def test_proportional_steps_sum_and_proportions():
    assert proportional_steps([1, 1, 1], 10) == [4, 3, 3]
    assert proportional_steps([10, 30, 60], 100) == [10, 30, 60]
    assert sum(proportional_steps([3, 7, 11, 2], 97)) == 97
    with pytest.raises(ValueError):
        proportional_steps([0, 0], 5)


def test_taxi_thirds():
    curriculum = taxi_curriculum(9)
    assert [level.name for level in curriculum.levels] == ["pickup", "dropoff", "full"]
    assert [curriculum.level_at(i) for i in range(11)] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2]
    only = taxi_curriculum(9, index=1)
    assert [level.name for level in only.levels] == ["dropoff"] and only.steps == [9]
    with pytest.raises(ValueError, match="--curriculum_index"):
        taxi_curriculum(9, index=3)


def test_depth_levels_shallow_first_with_proportional_steps():
    tasks = _tasks({2: 30, 0: 10, 1: 20})
    curriculum = depth_curriculum(tasks, 60)
    assert [level.name for level in curriculum.levels] == ["depth 0", "depth 1", "depth 2"]
    assert curriculum.steps == [10, 20, 30]
    assert all(task_depth(t) == 1 for t in curriculum.levels[1].tasks)


def test_merge_first_two_and_after_first_k():
    tasks = _tasks({0: 5, 1: 5, 2: 10, 3: 4, 4: 3, 5: 3})
    merged = depth_curriculum(tasks, 30, merge_first_two=True, merge_after_first_k=3)
    assert [level.name for level in merged.levels] == ["depth 0+1", "depth 2", "depth 3", "depth 4+5"]
    assert [len(level.tasks) for level in merged.levels] == [10, 10, 4, 6]
    assert sum(merged.steps) == 30
    unmerged = depth_curriculum(tasks, 30, merge_after_first_k=2)
    assert [level.name for level in unmerged.levels] == ["depth 0", "depth 1", "depth 2+3+4+5"]
    one = depth_curriculum(tasks, 30, merge_first_two=True, index=0)
    assert len(one.levels) == 1 and len(one.levels[0].tasks) == 10 and one.steps == [30]


# --- the tasks an AutoExplore run plays: --auto_explore_targets and --few_data --------------------


def _trajectory(filename, info="positive0"):
    return {"model_name": "gpt-4", "trajectory": [], "filename": filename, "info": info}


@pytest.fixture
def task_file(tmp_path):
    records = [
        {**make_task("repo_a", filename="src/a.py"),
         "trajectories": [_trajectory("docs/a.md"), _trajectory(None, "negative0"), _trajectory("src/a.py")]},
        {**make_task("repo_b", filename="b.py"), "trajectories": [_trajectory(None), _trajectory(None, "negative1")]},
        {**make_task("repo_c", filename="x/y/c.py"), "trajectories": [_trajectory("x/z.py")]},
    ]
    path = tmp_path / "train.json"
    path.write_text(json.dumps(records))
    return path


def test_writer_targets_add_the_files_the_writer_identified_and_drop_tasks_with_none(make_args, task_file):
    tasks = run_tasks(EnvSettings.from_args(make_args(task_file=str(task_file))))
    assert [t["filename"] for t in tasks] == ["src/a.py", "b.py", "x/y/c.py"]
    tasks = run_tasks(EnvSettings.from_args(make_args(task_file=str(task_file), auto_explore_targets="writer")))
    assert [t["filename"] for t in tasks] == [["src/a.py", "docs/a.md"], ["x/y/c.py", "x/z.py"]]
    assert [task_depth(t) for t in tasks] == [1, 2], "a task's depth stays its own file's"
    assert all("trajectories" not in t for t in tasks)


def test_a_writer_file_is_a_target_the_env_accepts(make_args, tmp_path):
    repo = build_repo(tmp_path / "repo")
    record = {**make_task(repo, filename=TARGET), "trajectories": [_trajectory("main.py")]}
    (tmp_path / "t.json").write_text(json.dumps([record]))
    (task,) = run_tasks(EnvSettings.from_args(make_args(task_file=str(tmp_path / "t.json"),
                                                        auto_explore_targets="writer")))
    env = AutoExploreEnv(tasks=[task])
    env.reset(seed=0)
    (outcome,) = run(env, ["id main.py"])
    assert outcome[1] and outcome[3]["correct"]
    env.close()


def test_writer_targets_need_trajectories_and_an_identified_file(make_args, tmp_path):
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps([make_task("repo", filename="a.py")]))
    with pytest.raises(ValueError, match="--auto_explore_targets writer: --task_file .*bare.json holds no traj"):
        run_tasks(EnvSettings.from_args(make_args(task_file=str(bare), auto_explore_targets="writer")))
    none = tmp_path / "none.json"
    none.write_text(json.dumps([{**make_task("repo", filename="a.py"), "trajectories": [_trajectory(None)]}]))
    with pytest.raises(ValueError, match="the writer identified no file in any task"):
        run_tasks(EnvSettings.from_args(make_args(task_file=str(none), auto_explore_targets="writer")))


def test_few_data_trains_on_the_first_tasks_only(make_args, task_file):
    args = make_args(env="auto_explore", task_file=str(task_file), few_data=2, max_steps=4)
    (level,) = training_curriculum(EnvSettings.from_args(args)).levels
    assert [o["task"]["filename"] for o in level.options] == ["src/a.py", "b.py"]
    with pytest.raises(ValueError, match="--few_data: is for --env=alfworld or auto_explore, got --env=taxi"):
        make_args(env="taxi", few_data=2)


def test_curriculum_steps_trains_the_first_levels_for_the_iterations_given(make_args):
    args = make_args(env="taxi", taxi_curriculum=True, curriculum_steps=[2, 3], max_steps=5)
    curriculum = training_curriculum(EnvSettings.from_args(args))
    assert [level.name for level in curriculum.levels] == ["pickup", "dropoff"] and curriculum.steps == [2, 3]
    assert [curriculum.level_at(i) for i in range(5)] == [0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match=r"--curriculum_steps: \[2, 3\] sum to 5, but --max_steps is 6"):
        make_args(env="taxi", taxi_curriculum=True, curriculum_steps=[2, 3], max_steps=6)
    with pytest.raises(ValueError, match="--curriculum_steps: splits iterations over several levels"):
        make_args(env="taxi", taxi_curriculum=True, curriculum_index=1, curriculum_steps=[2], max_steps=2)
    with pytest.raises(ValueError, match="--curriculum_steps: needs --taxi_curriculum or --depth_curriculum"):
        make_args(env="taxi", curriculum_steps=[2], max_steps=2)
    with pytest.raises(ValueError, match="one count of at least 1 per level"):
        make_args(env="taxi", taxi_curriculum=True, curriculum_steps=[2, 0], max_steps=2)
    with pytest.raises(ValueError, match="--curriculum_steps: 4 counts, but the curriculum has 3 levels"):
        training_curriculum(EnvSettings.from_args(make_args(env="taxi", taxi_curriculum=True,
                                                            curriculum_steps=[1, 1, 1, 1], max_steps=4)))


@pytest.mark.parametrize("mode", ["separate", "joint"])
def test_pickup_then_dropoff_hands_over_the_level_and_the_replay_buffer_as_replay_mode_says(make_args, tmp_path,
                                                                                            mode):
    """A curriculum run of --curriculum_steps 3 3: pickup, then drop-off; the buffer is emptied at the hand-over
    under --replay_mode separate (the paper's code) and kept under joint; the panel plays --eval_levels only."""
    import rl_finetune
    from utils import checkpoints, metrics

    args = make_args(env="taxi", taxi_curriculum=True, curriculum_steps=[3, 3], max_steps=6, save_steps=3,
                     oracle_completion=True, per_device_eval_batch_size=8, learning_rate=1e-3, replay_mode=mode,
                     replay_batch_size=2, eval_steps=3, eval_panel=2, eval_levels=["dropoff"], seed=1)
    assert rl_finetune.main(args) == 0
    (run,) = checkpoints.run_dirs(tmp_path / "results", "rl_finetune")
    records = metrics.read_metrics(run)
    training = [r for r in records if "level" in r]
    assert [r["level"] for r in training] == ["pickup"] * 3 + ["dropoff"] * 3
    panels = [r for r in records if "heldout_success" in r]
    assert [r["step"] for r in panels] == [0, 3, 6] and all(r["heldout_episodes"] == 2 for r in panels)

    def buffer(step: int) -> list[str]:
        state = torch.load(run / f"checkpoint-{step}" / checkpoints.TRAINER_STATE_FILE, weights_only=False)
        return [episode["level"] for episode in state["state"]["ranks"][0]["learner"]["replay"]["episodes"]]

    assert buffer(3) and set(buffer(3)) == {"pickup"}  # pickup successes were kept for replay
    after = buffer(6)
    if mode == "separate":
        assert "pickup" not in after  # emptied when drop-off began
        assert training[3]["replayed"] == 0  # the first drop-off iteration had nothing to replay
    else:
        assert after[:len(buffer(3))] == buffer(3)  # kept across the hand-over
        assert training[3]["replayed"] == 2
