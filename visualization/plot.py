"""Training curves of RL runs: success rate, cost and loss, with a moving average.

    python -m visualization.plot --expdirs results/12_rl_finetune results/15_rl_finetune

Edit ``expdirs`` in :func:`main` (as the paper's users do) or pass ``--expdirs``. Give
the LATEST directory of a resumed run: a run resumed from ``a`` into ``b`` holds the
whole curve in ``b``. A directory may be written ``NAME=DIR`` to set its legend label.
Saves ``curves.png`` (or ``--output_file``) and prints where.
"""

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import metrics  # noqa: E402
from experiment_args import parse_args  # noqa: E402

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


def parse_expdir(entry: str) -> tuple[str, Path]:
    name, _, path = entry.rpartition("=")
    path = Path(path)
    return (name or path.name), path


def plot(expdirs: list[str], output: Path, window: int = 10, title: str | None = None) -> Path:
    if not expdirs:
        raise ValueError("--expdirs: give at least one run directory (or edit expdirs in visualization/plot.py)")
    figure, axes = plt.subplots(1, len(PANELS), figsize=(4.5 * len(PANELS), 3.8), constrained_layout=True)
    for entry in expdirs:
        name, path = parse_expdir(entry)
        records = metrics.read_metrics(path)
        for axis, (key, _, smoothed) in zip(axes, PANELS):
            points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
            if not points:
                continue
            steps, values = zip(*points)
            if smoothed:
                line, = axis.plot(steps, moving_average(list(values), window), label=name, linewidth=2)
                axis.plot(steps, values, color=line.get_color(), alpha=0.2, linewidth=1)
            else:
                axis.plot(steps, values, marker="o", markersize=3, label=name, linewidth=2)
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
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=120)
    plt.close(figure)
    return output


def main(args, window: int = 10) -> int:
    # Edit this list to plot your runs (the latest directory of each), e.g.
    # "Reflect-RL=results/12_rl_finetune"
    expdirs: list[str] = []
    output = Path(args.output_file or Path(args.ckpt_path) / "curves.png")
    path = plot(list(args.expdirs or []) + expdirs, output, window)
    print(f"[plot] saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args(prog="python -m visualization.plot")))
