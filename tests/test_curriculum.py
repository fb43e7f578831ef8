"""Curricula: Taxi thirds, AutoExplore depth levels, proportional schedules, one level."""

import pytest

from envs.auto_explore import task_depth
from envs.curriculum import depth_curriculum, proportional_steps, taxi_curriculum


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
