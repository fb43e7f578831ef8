"""The paper's main table (GPT-2 XL, success %), and ours beside it: ``demo.py --task all`` writes
``results/demo/paper_table.md`` from every recipe's seeds.

The paper's numbers live here and nowhere else. A column is named as the recipe's main evaluation names
it; a column no recipe reports yet, or a row of it not run (``demo.py --rows``), is shown with the paper's numbers
and "not run".
"""

import numpy as np

from recipes.base import REFLECT_RL, RLFT_ONLY, SFT_ONLY, WITHOUT_REFLECTION

# (column, {row: the paper's success %}); a row the paper does not report is absent
PAPER = (
    ("AutoExplore depth 1", {SFT_ONLY: 4, RLFT_ONLY: 12, WITHOUT_REFLECTION: 20,
                             "SFT+RLFT w/o negative": 33, REFLECT_RL: 36}),
    ("AutoExplore depth 2", {SFT_ONLY: 9, RLFT_ONLY: 3, WITHOUT_REFLECTION: 4,
                             "SFT+RLFT w/o negative": 12, REFLECT_RL: 17}),
    ("Taxi pickup", {SFT_ONLY: 7, RLFT_ONLY: 2, WITHOUT_REFLECTION: 6, REFLECT_RL: 58}),
    ("Taxi +drop-off", {SFT_ONLY: 0, RLFT_ONLY: 0, WITHOUT_REFLECTION: 0, REFLECT_RL: 29}),
    ("ALFWorld", {SFT_ONLY: 0, RLFT_ONLY: 0, WITHOUT_REFLECTION: 66, REFLECT_RL: 74}),
)


def ours_by_column(recipe_runs: list[tuple]) -> dict[str, dict[str, list[float]]]:
    """``{column title: {row: [success % per seed]}}`` over ``(recipe, {seed: run})`` pairs, from each
    recipe's main evaluation (the columns of the paper's table)."""
    out: dict[str, dict[str, list[float]]] = {}
    for recipe, runs in recipe_runs:
        for level, title in next(iter(recipe.evaluations.values())).columns:
            column = out.setdefault(title, {})
            for run in runs.values():
                for result in run["results"]:
                    if level in result["levels"]:
                        column.setdefault(result["name"], []).append(100 * result["levels"][level]["success"])
    return out


def row_order(recipe_runs: list[tuple]) -> list[str]:
    """Every row of the recipes run and of the paper, each recipe's (and the paper's) own order kept: a row not
    yet placed goes just before the first of its successors that is (a column's ablations before Reflect-RL)."""
    order: list[str] = []
    for names in [[row.name for row in recipe.rows] for recipe, _ in recipe_runs] + [list(rows) for _, rows in PAPER]:
        for i, name in enumerate(names):
            if name not in order:
                after = next((later for later in names[i + 1:] if later in order), None)
                order.insert(order.index(after) if after else len(order), name)
    return order


def markdown(recipe_runs: list[tuple], model: str = "tiny-gpt2", where: str = "CPU") -> str:
    """The table: per row and column, our mean over seeds with its range, and the paper's figure (``where``: the
    machine the recipes were made for, CPU or GPU)."""
    ours = ours_by_column(recipe_runs)
    columns = [title for title, _ in PAPER] + [title for title in ours if title not in dict(PAPER)]
    paper = dict(PAPER)
    seeds = sorted({seed for _, runs in recipe_runs for seed in runs})
    lines = [f"# The paper's table beside ours ({model}, offline, {where}; seeds {', '.join(map(str, seeds))})", "",
             "Each cell: our mean success over the seeds (min–max) / the paper's (GPT-2 XL). "
             "'–': the row is not in that column; 'not run': no seed of ours reports that column or row yet.", "",
             "| model / method | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for row in row_order(recipe_runs):
        cells = []
        for column in columns:
            values = ours.get(column, {}).get(row)
            theirs = paper.get(column, {}).get(row)
            mine = (f"{np.mean(values):.1f}% ({min(values):.1f}–{max(values):.1f})" if values else
                    "not run" if theirs is not None else "–")  # a column, or a row (--rows), not run yet
            cells.append(mine if theirs is None else f"{mine} / {theirs}%")
        if any(cell != "–" for cell in cells):
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
