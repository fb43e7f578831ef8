"""Curricula: which tasks an RL iteration trains on. Each environment builds its own from these
pieces (its ``SPEC.curriculum``):

* Taxi (``--taxi_curriculum``): pickup, then drop-off, then the full task, a third of
  the iterations each.
* AutoExplore (``--depth_curriculum``): tasks grouped by target depth (number of '/'),
  shallow first, a task at every depth of its targets; ``--merge_first_two`` merges the first
  two non-empty depths; depths past the first ``--merge_after_first_k`` levels form one last
  level; each level gets iterations in proportion to its number of tasks (the paper's
  schedule, ``envs.auto_explore_tasks.depth_curriculum``).
* ``--curriculum_index k`` trains level k only, for all iterations.
* ``--curriculum_steps n0 n1 ...`` trains the first levels, level i for n_i iterations (Taxi
  ``--curriculum_steps 40 80``: pickup, then drop-off, the full task never).
"""

from dataclasses import dataclass, field


@dataclass
class Level:
    """A curriculum level: a name and the reset options its episodes start from."""

    name: str
    options: list[dict] = field(default_factory=list)

    @property
    def tasks(self) -> list[dict]:
        """The AutoExplore task dicts of the level."""
        return [option["task"] for option in self.options if "task" in option]


@dataclass
class Curriculum:
    levels: list[Level]
    steps: list[int]  # iterations given to each level, in order

    def __post_init__(self) -> None:
        if len(self.levels) != len(self.steps) or not self.levels:
            raise ValueError("a curriculum needs one step count per level, and at least one level")

    def level_at(self, iteration: int) -> int:
        """Index of the level trained at 0-based ``iteration`` (the last level after the end)."""
        for index, boundary in enumerate(self.boundaries()):
            if iteration < boundary:
                return index
        return len(self.levels) - 1

    def boundaries(self) -> list[int]:
        """Cumulative iteration counts: level i runs while iteration < boundaries()[i]."""
        total, out = 0, []
        for steps in self.steps:
            total += steps
            out.append(total)
        return out

    def first(self, steps: list[int]) -> "Curriculum":
        """The first ``len(steps)`` levels, level i for ``steps[i]`` iterations (``--curriculum_steps``)."""
        return Curriculum(self.levels[:len(steps)], list(steps))

    def only(self, index: int) -> "Curriculum":
        """Train level ``index`` alone for all iterations (``--curriculum_index``)."""
        if not 0 <= index < len(self.levels):
            raise ValueError(f"--curriculum_index {index} out of range: {len(self.levels)} levels "
                             f"({', '.join(level.name for level in self.levels)})")
        return Curriculum([self.levels[index]], [sum(self.steps)])


def proportional_steps(counts: list[int], total: int) -> list[int]:
    """Split ``total`` iterations in proportion to ``counts`` (largest remainders; sums to total)."""
    weight = sum(counts)
    if weight <= 0:
        raise ValueError(f"cannot split steps over empty levels {counts}")
    exact = [total * count / weight for count in counts]
    steps = [int(x) for x in exact]
    by_remainder = sorted(range(len(counts)), key=lambda i: (-(exact[i] - steps[i]), i))
    for i in by_remainder[: total - sum(steps)]:
        steps[i] += 1
    return steps


def single_level(name: str, options: list[dict], max_steps: int) -> Curriculum:
    """No curriculum: one level holding every task."""
    if not options:
        raise ValueError(f"no tasks for {name}")
    return Curriculum([Level(name, options)], [max_steps])
