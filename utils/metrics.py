"""Metrics of a run: ``<run_dir>/metrics.jsonl`` (one JSON record per step) and TensorBoard."""

import json
import resource
import sys
from pathlib import Path
from typing import Any


def peak_memory() -> str:
    """This process's peak memory so far, for a script's last line: the CUDA allocator's peak on
    a GPU, else the peak resident set size."""
    import torch

    if torch.cuda.is_available():
        return f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return f"peak memory {rss / (2**30 if sys.platform == 'darwin' else 2**20):.2f} GiB"


class MetricLogger:
    """Append metrics to ``<run_dir>/metrics.jsonl`` and to TensorBoard (``<run_dir>/tb``)."""

    FILE = "metrics.jsonl"

    def __init__(self, run_dir: str | Path, tensorboard: bool = True):
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(run_dir) / self.FILE
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(Path(run_dir) / "tb"))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **metrics}
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if self._writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._writer.add_scalar(key, value, step)
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / MetricLogger.FILE
    if not path.is_file():
        raise ValueError(f"{run_dir!r} has no {MetricLogger.FILE}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
