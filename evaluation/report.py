"""The figures of evaluated episodes and their report: success rate, average cost and length per level, and the
table of ``results.json`` and ``results.md`` that ``evaluation.evaluate`` and the API-model evaluations write."""

import hashlib
import json
from pathlib import Path

import numpy as np


def figures(episodes) -> dict:
    """Success rate, average cost and length of ``episodes``, how many they are, and how many distinct
    held-out units (the options they were reset with: an AutoExplore task, an ALFWorld problem; a Taxi
    level is one unit whose episodes differ by seed) they repeat, with each unit's success rate (``unit_success``,
    by :func:`unit_id`: what an interval over the units, and two rows paired unit by unit, read in runner/report.py)."""
    units: dict[str, list[bool]] = {}
    for e in episodes:
        units.setdefault(unit_id(e.options), []).append(bool(e.success))
    return {"success": float(np.mean([e.success for e in episodes])), "cost": float(np.mean([e.cost for e in episodes])),
            "episodes": len(episodes), "steps": float(np.mean([len(e.decisions) for e in episodes])),
            "units": len(units), "unit_success": {unit: float(np.mean(found)) for unit, found in units.items()}}


def unit_id(options: dict) -> str:
    """A held-out unit's short name in ``unit_success``: a digest of the options it is reset with, the same for
    every row that plays it (so that two rows' rates pair up task by task)."""
    return hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode()).hexdigest()[:12]


def summarise(episodes) -> dict:
    """:func:`figures` per level, in the order the episodes reach them (:func:`evaluation.episodes.test_episodes`
    lists them in the order of the environment's held-out units: Taxi's curriculum, pickup, dropoff, full), then
    over all episodes (``"all"``)."""
    levels: dict[str, list] = {}
    for episode in episodes:
        levels.setdefault(episode.level, []).append(episode)
    return {**{level: figures(group) for level, group in levels.items()}, "all": figures(episodes)}


def success_name(args) -> str:
    """What an episode's 'success' measures: under --oracle_completion, an optimal first decision (the
    oracle solves almost every played-out episode), not a solved task."""
    return "optimal 1st decision" if args.oracle_completion else "success"


def markdown_table(results: list[dict], success: str = "success") -> str:
    levels = [level for level in results[0]["levels"] if level != "all"] + ["all"]
    header = "| configuration | " + " | ".join(f"{level}: {success} (n) | {level}: cost" for level in levels) + " |"
    rule = "|---|" + "---:|---:|" * len(levels)
    rows = []
    for result in results:
        cells = []
        for level in levels:
            figure = result["levels"][level]
            cells += [f"{100 * figure['success']:.1f}% ({figure['episodes']})", f"{figure['cost']:.3f}"]
        rows.append(f"| {result['name']} | " + " | ".join(cells) + " |")
    return "\n".join([header, rule, *rows]) + "\n"


def save_results(run_dir: Path, results: list[dict], title: str, footer: str = "", success: str = "success") -> str:
    """Write ``results.json`` and ``results.md`` (the table under ``title``); return the table."""
    table = markdown_table(results, success)
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (run_dir / "results.md").write_text(f"# {title}\n\n{table}{footer}", encoding="utf-8")
    return table
