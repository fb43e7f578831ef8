"""Training curves of RL runs: success rate, cost and loss, with a moving average.

    python -m visualization.plot --expdirs results/12_rl_finetune results/15_rl_finetune

Edit ``expdirs`` in :func:`main` (as the paper's users do) or pass ``--expdirs``; with
neither, the newest ``rl_finetune`` run under ``--ckpt_path`` is plotted. Give
the LATEST directory of a resumed run: a run resumed from ``a`` into ``b`` holds the
whole curve in ``b``. A directory may be written ``NAME=DIR`` to set its legend label.

Several runs of one configuration (seeds) are ensembled with ``NAME=DIR1,DIR2,...``: one
curve, the mean over the runs at every step they all logged, with the min–max band shaded;
the averaged log is written beside the figure as ``<figure>-<NAME>.jsonl``.
Saves ``curves.png`` (or ``--output_file``) and prints where.
"""

import json
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiment_args import run_script  # noqa: E402
from utils import (
    checkpoints,  # noqa: E402
    metrics,  # noqa: E402
)
from utils.errors import UsageError  # noqa: E402

# (metric, label, smoothed): training-episode figures are noisy and smoothed; the held-out
# panel (rl_finetune --eval_steps) is played on fixed episodes and shown as measured.
PANELS = (("heldout_success", "held-out success", False), ("success", "training success", True),
          ("entropy", "policy entropy (nats)", True), ("cost", "cost per episode", True), ("loss", "loss", True))


def moving_average(values: list[float], window: int) -> np.ndarray:
    """Mean of the last ``window`` values at each point (shorter at the start)."""
    values = np.asarray(values, dtype=float)
    cumulative = np.cumsum(np.insert(values, 0, 0.0))
    out = np.empty_like(values)
    for i in range(len(values)):
        start = max(0, i + 1 - window)
        out[i] = (cumulative[i + 1] - cumulative[start]) / (i + 1 - start)
    return out


def parse_expdir(entry: str) -> tuple[str, list[Path]]:
    """``[NAME=]DIR[,DIR...]`` -> (legend label, run directories)."""
    name, _, paths = entry.rpartition("=")
    folders = [Path(p) for p in paths.split(",") if p]
    if not folders:
        raise UsageError(f"--expdirs: {entry!r} names no run directory")
    return (name or folders[0].name), folders


def ensemble(runs: list[list[dict]]) -> list[dict]:
    """Log ensembling: per step that every run logged, the mean, min and max of each numeric metric
    that every run logged there (``key``, ``key_min``, ``key_max``), with the number of runs."""
    by_run = [{r["step"]: r for r in records if "step" in r} for records in runs]
    merged = []
    for step in sorted(set.intersection(*(set(steps) for steps in by_run))):
        rows = [steps[step] for steps in by_run]
        keys = set.intersection(*(set(k for k, v in row.items() if isinstance(v, (int, float))
                                      and not isinstance(v, bool)) for row in rows)) - {"step"}
        entry = {"step": step, "runs": len(rows)}
        for key in sorted(keys):
            values = [float(row[key]) for row in rows]
            entry.update({key: float(np.mean(values)), f"{key}_min": min(values), f"{key}_max": max(values)})
        merged.append(entry)
    return merged


def plot(expdirs: list[str], output: Path, window: int = 10, title: str | None = None) -> Path:
    if not expdirs:
        raise UsageError("--expdirs: give at least one run directory (or edit expdirs in visualization/plot.py)")
    figure, axes = plt.subplots(1, len(PANELS), figsize=(4.5 * len(PANELS), 3.8), constrained_layout=True)
    for entry in expdirs:
        name, paths = parse_expdir(entry)
        try:
            logs = [metrics.read_metrics(path) for path in paths]
        except UsageError as error:
            raise UsageError(f"--expdirs {entry}: {error}") from None
        records = logs[0] if len(paths) == 1 else ensemble(logs)
        if len(paths) > 1:
            log = output.with_name(f"{output.stem}-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.jsonl")
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
            name = f"{name} (mean of {len(paths)})"
        for axis, (key, _, smoothed) in zip(axes, PANELS):
            points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
            if not points:
                continue
            steps, values = zip(*points)
            if smoothed:
                line, = axis.plot(steps, moving_average(list(values), window), label=name, linewidth=2)
                axis.plot(steps, values, color=line.get_color(), alpha=0.2, linewidth=1)
            else:
                line, = axis.plot(steps, values, marker="o", markersize=3, label=name, linewidth=2)
            if len(paths) > 1:
                low = [r[f"{key}_min"] for r in records if key in r]
                high = [r[f"{key}_max"] for r in records if key in r]
                axis.fill_between(steps, low, high, color=line.get_color(), alpha=0.12, linewidth=0)
    for axis, (_, label, smoothed) in zip(axes, PANELS):
        axis.set_xlabel("RL iteration")
        axis.set_ylabel(label)
        axis.set_title(f"{label} (moving average over {window})" if smoothed else label)
        axis.grid(alpha=0.3)
    labelled = [axis for axis in axes if axis.get_legend_handles_labels()[0]]
    if labelled:  # the first panel that has a curve (runs without --eval_steps have no held-out one)
        labelled[0].legend(loc="best", fontsize=9)
    if title:
        figure.suptitle(title)
    return _save(figure, output)


def _save(figure, output: Path) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=120)
    plt.close(figure)
    return output


def plot_panel(runs: list[tuple[str, Path, int]], output: Path, xlabel: str = "RL iteration",
               title: str | None = None) -> Path:
    """One panel: the validation success (``heldout_success``) of each ``(name, run directory, shift)`` as
    measured, iterations shifted by ``shift`` (e.g. minus a pickup curriculum's iterations, so that every
    run's drop-off training starts at 0, as the paper's Figure 4)."""
    figure, axis = plt.subplots(figsize=(6.4, 4.8), constrained_layout=True)
    for name, path, shift in runs:
        points = [(r["step"] - shift, r["heldout_success"]) for r in metrics.read_metrics(path)
                  if isinstance(r.get("heldout_success"), (int, float))]
        if not points:
            raise ValueError(f"{path}: no validation-panel figure (heldout_success) to plot; was --eval_steps set?")
        steps, values = zip(*points)
        axis.plot(steps, values, marker="o", markersize=3, linewidth=2, label=name,
                  linestyle="-" if "w/o reflection" not in name else "--")
    if any(shift for _, _, shift in runs):
        axis.axvline(0, color="grey", linewidth=1, alpha=0.6)
    axis.set_xlabel(xlabel)
    axis.set_ylabel("validation success")
    axis.grid(alpha=0.3)
    # below the axes, not over them: several curves cross the middle of the panel
    figure.legend(loc="outside lower center", ncols=2, fontsize=9)
    if title:
        axis.set_title(title)
    return _save(figure, output)


def main(args, window: int = 10) -> int:
    # Edit this list to plot your runs (the latest directory of each), e.g.
    # "Reflect-RL=results/12_rl_finetune"
    expdirs: list[str] = []
    expdirs = list(args.expdirs or []) + expdirs
    if not expdirs:  # nothing named: the newest RL run under --ckpt_path
        runs = checkpoints.run_dirs(args.ckpt_path, "rl_finetune")
        if not runs:
            raise UsageError(f"--expdirs: no run named and no rl_finetune run in --ckpt_path {args.ckpt_path}")
        expdirs = [str(runs[-1])]
        print(f"[plot] no --expdirs: plotting the newest RL run, {runs[-1]}")
    output = Path(args.output_file or Path(args.ckpt_path) / "curves.png")
    path = plot(expdirs, output, window)
    print(f"[plot] saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m visualization.plot"))
