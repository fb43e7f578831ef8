"""The runner's tables (``demo.py``): a seed's table shaped like the paper's, the table over seeds, the reflector's
accuracy, and how many held-out episodes stand behind each figure."""

import math

import numpy as np

from recipes.base import REFLECT_RL, Recipe


def accuracy_table(accuracy: dict[str, list]) -> str:
    steps = accuracy["steps"]
    lines = ["The SFT reflector advises the oracle's move (held-out episodes of 'SFT only, with reflection'):", "",
             "| step | " + " | ".join(str(step) for step, _, _ in steps) + " | all |",
             "|---|" + "---:|" * (len(steps) + 1),
             "| accuracy | " + " | ".join(f"{acc:.2f}" for _, acc, _ in steps) + f" | {accuracy['all'][0]:.2f} |",
             "| states | " + " | ".join(str(n) for _, _, n in steps) + f" | {accuracy['all'][1]} |"]
    return "\n".join(lines) + "\n"


def interval(p: float, n: int) -> float:
    """Half-width of the normal-approximation 95% interval of a success rate over ``n`` independent episodes."""
    return 1.96 * math.sqrt(p * (1 - p) / n) if n else float("nan")


def replays_tasks(recipe: Recipe) -> bool:
    """Whether the recipe replays a few tasks to reach its episodes a level (``eval_level_episodes``: AutoExplore's
    8-13 test tasks a depth, ALFWorld's 4 trials), so that its episodes are not independent draws."""
    return bool(recipe.budget.get("eval_level_episodes"))


def mean_interval(values) -> float:
    """Half-width of the normal-approximation 95% interval of the mean of ``values`` (at least two), one a task."""
    return 1.96 * float(np.std(values, ddof=1)) / math.sqrt(len(values))


def success_interval(recipe: Recipe, figure: dict) -> float:
    """Half-width of the 95% interval of a level's success rate. Over its episodes, where they are independent draws
    (Taxi's held-out seeds); over its tasks where the recipe replays them (:func:`replays_tasks`; a near-greedy
    policy's replays of one task mostly repeat its first): the interval of the mean of the tasks' success rates
    (each task played as often, so their mean is the level's rate). With a handful of tasks this is much wider than
    the episodes' interval, and still a little narrow (Student's t for 8 tasks: 2.36, not 1.96). A figure from
    before the tasks' rates were recorded gets the episodes' interval."""
    rates = list((figure.get("unit_success") or {}).values())
    if not replays_tasks(recipe) or len(rates) < 2:
        return interval(figure["success"], figure["episodes"])
    return mean_interval(rates)


def paired_gaps(recipe: Recipe, results: list[dict], against: str = REFLECT_RL) -> str:
    """Where the recipe replays its tasks (:func:`replays_tasks`), ``against`` minus each other row, per column: the
    mean over the tasks both played of the difference of their success rates, ± the 95% interval of that mean.
    Every row plays the same tasks, so the paired gap tells two rows apart where their own intervals
    (:func:`success_interval`), each spanning the tasks' spread, overlap. Empty where there is nothing to pair;
    else the table and a blank line."""
    rows = {result["name"]: result["levels"] for result in results}
    if not replays_tasks(recipe) or against not in rows:
        return ""
    table = columns(recipe)
    base = {level: (rows[against].get(level) or {}).get("unit_success") or {} for level, _ in table}
    lines = []
    for name, levels in rows.items():
        if name == against:
            continue
        cells = []
        for level, _ in table:
            theirs = (levels.get(level) or {}).get("unit_success") or {}
            gaps = [base[level][unit] - theirs[unit] for unit in sorted(set(base[level]) & set(theirs))]
            cells.append(f"{100 * np.mean(gaps):+.1f} ± {100 * mean_interval(gaps):.1f} ({len(gaps)})"
                         if len(gaps) >= 2 else "–")
        if any(cell != "–" for cell in cells):
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if not lines:
        return ""
    head = [f"{against} minus each row, paired over the tasks both played (points ± 95%, tasks):", "",
            "| minus | " + " | ".join(title for _, title in table) + " |", "|---|" + "---:|" * len(table)]
    return "\n".join(head + lines) + "\n\n"  # a paragraph of its own


def columns(recipe: Recipe) -> list[tuple[str, str]]:
    """(result level, column name) of every column of the recipe's table, the main evaluation's first."""
    out = []
    for name, evaluation in recipe.evaluations.items():
        prefix = level_prefix(recipe, name)
        out += [(prefix + level, prefix + title) for level, title in evaluation.columns]
    return out


def level_prefix(recipe: Recipe, evaluation: str) -> str:
    """How an evaluation's levels are named in a seed's results: the main (first) one's as they are, the
    others' after their evaluation's name."""
    return "" if evaluation == next(iter(recipe.evaluations)) else f"{evaluation}: "


def paper_table(recipe: Recipe, results: list[dict]) -> str:
    if len(columns(recipe)) == 1:
        ((level, title),) = columns(recipe)
        lines = [f"| model / method | {title} success (± 95% interval) | avg cost | episodes |", "|---|---:|---:|---:|"]
        for result in results:
            figure = result["levels"][level]
            p, n = figure["success"], figure["episodes"]
            lines.append(f"| {result['name']} | {100 * p:.1f}% ± {100 * success_interval(recipe, figure):.1f} | "
                         f"{figure['cost']:.3f} | {n} |")
        return "\n".join(lines) + "\n"
    lines = ["| model / method | " + " | ".join(f"{title} (± 95%, episodes)" for _, title in columns(recipe)) + " |",
             "|---|" + "---:|" * len(columns(recipe))]
    for result in results:
        cells = []
        for level, _ in columns(recipe):
            figure = result["levels"].get(level)
            if figure is None:
                cells.append("–")
                continue
            p, n = figure["success"], figure["episodes"]
            cells.append(f"{100 * p:.1f}% ± {100 * success_interval(recipe, figure):.1f} ({n})")
        lines.append(f"| {result['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def seeds_report(recipe: Recipe, runs: dict[int, dict]) -> str:
    """Each row's success per seed, its mean and range (per column), then every seed's own table."""
    seeds = list(runs)
    lines = [f"# Reflect-RL demo over training seeds {', '.join(map(str, seeds))}: {recipe.title}, {recipe.model_label}", ""]
    for level, title in columns(recipe):
        success = {row.name: [] for row in recipe.rows}
        for run in runs.values():
            for result in run["results"]:
                if level in result["levels"]:
                    success[result["name"]].append(100 * result["levels"][level]["success"])
        if len(columns(recipe)) > 1:
            lines += [f"## {title}", ""]
        lines += ["| model / method | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | range |",
                  "|---|" + "---:|" * (len(seeds) + 2)]
        for row, values in success.items():
            if values:
                cells = " | ".join(f"{v:.1f}%" for v in values)
                lines.append(f"| {row} | {cells} | {np.mean(values):.1f}% | {min(values):.1f}–{max(values):.1f} |")
        lines.append("")
    per_seed = "\n".join(f"## Seed {s}\n\n{paper_table(recipe, run['results'])}\n"
                         f"{paired_gaps(recipe, run['results'])}"
                         f"{accuracy_table(run['reflector_accuracy']) if run['reflector_accuracy'] else ''}"
                         for s, run in runs.items())
    first = next(iter(runs.values()))["results"]
    return "\n".join(lines) + f"\n{episodes_note(recipe, first)} per row and seed (one fixed set).\n\n{per_seed}"


def episodes_note(recipe: Recipe, results: list[dict]) -> str:
    """How many held-out episodes stand behind each figure: the recipe's repetitions, or (with a per-level
    minimum) each column's episodes and the distinct tasks they repeat."""
    if not replays_tasks(recipe):
        return f"{recipe.budget['eval_episodes']} held-out episodes"
    levels = results[0]["levels"]
    shown = [level for level, _ in columns(recipe) if level in levels]
    cells = [f"{title}: {levels[level]['episodes']} episodes of {levels[level]['units']} distinct tasks"
             for level, title in columns(recipe) if level in levels]
    over_tasks = all(len(levels[level].get("unit_success") or {}) >= 2 for level in shown)  # as success_interval
    return "Held-out episodes (" + "; ".join(cells) + ")" + (
        "; each ± is a 95% interval over the tasks, whose replays are not independent draws" if over_tasks else "")
