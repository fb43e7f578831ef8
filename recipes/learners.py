"""The RL learners side by side on one column (``demo.py --learners pg ppo refuel rloo grpo gigpo``).

:func:`compare` turns a column's recipe into one whose RL variants are the column's Reflect-RL run and its
run without reflection, once per learner, each at the same budget of environment episodes per iteration:

* ``pg`` and ``ppo`` play the recipe's batch of episodes, each start once, with the recipe's baseline;
* ``refuel`` plays half the batch and a branch of each (an episode replayed to a random step, then played on
  by the current policy), so that it also plays the recipe's batch of episodes per iteration;
* the group learners (``rloo``, ``grpo``, ``gigpo``) play the batch as ``batch / GROUP_SIZE`` starts, each
  ``GROUP_SIZE`` times (``--group_size``), and take their baseline from the group.

PG and the group learners also train on up to ``rl_replay`` replayed successes (old episodes, no new play): the
learners that replay by default (``rl_algorithms/defaults.py``) are given the recipe's count.

The data and SFT models are the column's own, read from (or made in) its seed folder, and the held-out
evaluation and the validation panel are the column's, so every row is judged on the same episodes. Each learner's
runs are named ``<learner>, with reflection`` and ``<learner>, w/o reflection``; the figures plot every learner's
validation panel, with and without reflection.
"""

import dataclasses

from recipes.base import REFLECT_RL, WITHOUT_REFLECTION, CurveFigure, Recipe, Row, sft_roles_read
from utils.arg_groups import GROUP_LEARNERS

# Starts played GROUP_SIZE times each by the group learners: 4 starts of 4 episodes in a batch of 16. GiGPO's
# paper uses groups of 8 on ALFWorld; 4 keeps 4 distinct starts per iteration in the demo's small batch.
GROUP_SIZE = 4
REFLECTION = ("with", "without", "both")  # --reflection: which runs of each learner
WITH, WITHOUT = "with reflection", "w/o reflection"
# The column's runs a learner's runs are copies of (their SFT starts, iterations and curriculum): paper_rows'.
TEMPLATES = {WITH: REFLECT_RL, WITHOUT: WITHOUT_REFLECTION}


def learner_flags(learner: str, batch: int) -> tuple[str, ...]:
    """``rl_finetune``'s flags for ``learner`` on a recipe that plays ``batch`` episodes per iteration, so that
    it plays that many episodes too (see the module's docstring)."""
    if learner in GROUP_LEARNERS:
        if batch % GROUP_SIZE:
            raise ValueError(f"--learners {learner}: the recipe's batch of {batch} episodes is not a multiple of the "
                             f"group size {GROUP_SIZE}")
        return f"--trainer={learner}", f"--group_size={GROUP_SIZE}", "--baseline=none"
    if learner == "refuel":
        if batch % 2:
            raise ValueError(f"--learners refuel: the recipe's batch of {batch} episodes is odd; REFUEL plays half "
                             "of it and a branch of each")
        return "--trainer=refuel", "--baseline=none", f"--per_device_eval_batch_size={batch // 2}"
    return (f"--trainer={learner}",)


def run_name(learner: str, kind: str) -> str:
    return f"{learner}, {kind}"


def compare(recipe: Recipe, learners: list[str], reflection: str = "both") -> Recipe:
    """``recipe`` with one RL run per learner and kind (``reflection``: with reflection, without, or both), rows
    for each, the SFT-only rows of the models they start from (and only those models' SFT), and validation
    figures per kind. Results under ``<recipe>-learners``."""
    from rl_algorithms import LEARNERS  # the registry is the one list of learners

    unknown = [name for name in learners if name not in LEARNERS]
    if unknown or not learners or len(set(learners)) != len(learners):
        raise ValueError(f"--learners: each a learner of {tuple(LEARNERS)}, once; got {learners}")
    if reflection not in REFLECTION:
        raise ValueError(f"--reflection: one of {REFLECTION}, got {reflection!r}")
    missing = [run for run in TEMPLATES.values() if run not in recipe.rl]
    if missing:
        raise ValueError(f"--learners: recipe {recipe.name} has no {' or '.join(missing)} run to compare learners on")
    kinds = [kind for kind, asked in ((WITH, "with"), (WITHOUT, "without")) if reflection in (asked, "both")]
    rl, rows = {}, []
    for kind in kinds:  # the runs with reflection first: the slowest, so they start first
        template = recipe.rl[TEMPLATES[kind]]
        for learner in learners:
            name = run_name(learner, kind)
            rl[name] = dataclasses.replace(template, flags=template.flags + learner_flags(learner, recipe.budget["rl_batch"]))
            rows.append(Row(name, f"rl:{name}", template.reflector))
    # the column's SFT-only rows beside them, those of the SFT models the runs start from
    rows = [row for row in recipe.rows if row.sft_role and (row.sft_role, row.reflector) in
            {(variant.policy, variant.reflector) for variant in rl.values()}] + rows
    used = sft_roles_read(rows, rl)
    sft_streams = tuple(kept for kept in (tuple(role for role in stream if role in used) for stream in recipe.sft_streams)
                        if kept)
    figures = tuple(CurveFigure(f"learners_{'with' if kind == WITH else 'without'}_reflection.png",
                                f"{recipe.title}: learners, {kind}",
                                tuple(run_name(learner, kind) for learner in learners)) for kind in kinds)
    return dataclasses.replace(
        recipe, name=f"{recipe.name}-learners", title=f"{recipe.title}, learners compared", rl=rl, shares=recipe.name,
        sft={role: spec for role, spec in recipe.sft.items() if role in used}, sft_streams=sft_streams,
        accuracy=recipe.accuracy if any(row.sft_role and row.reflector for row in rows) else None,
        rl_streams=tuple((name,) for name in rl), overlap=False, rows=tuple(rows), figures=figures, pretrained=None,
        evaluations={name: dataclasses.replace(evaluation, rows=None) for name, evaluation in
                     list(recipe.evaluations.items())[:1]},  # the column's main held-out episodes, every row
        extra={**recipe.extra, "learners": list(learners), "reflection": reflection, "group_size": GROUP_SIZE})
