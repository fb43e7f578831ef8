"""Metrics of a run: ``<run_dir>/metrics.jsonl`` (one JSON record per step) and TensorBoard."""

import json
import logging
import resource
import sys
from pathlib import Path
from typing import Any

from utils.errors import UsageError

logger = logging.getLogger(__name__)


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
    """The records of ``run_dir``'s metrics log. A last line without its newline is a record the run was
    killed while writing: left out, with a warning (the run resumes from its checkpoint, which came before)."""
    path = Path(run_dir) / MetricLogger.FILE
    if not Path(run_dir).is_dir():
        what = "a file, not a folder" if Path(run_dir).exists() else "no such folder"
        raise UsageError(f"{run_dir}: {what} (give the run folder of supervised_pretrain.py or rl_finetune.py that "
                         f"holds {MetricLogger.FILE})")
    if not path.is_file():
        raise UsageError(f"{run_dir}: no {MetricLogger.FILE} in it (a run folder of supervised_pretrain.py or "
                         "rl_finetune.py has one)")
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number == len(lines) and not text.endswith("\n"):
                logger.warning("%s:%d: a record cut short (the run was stopped while writing it): left out",
                               path, number)
                break
            raise UsageError(f"{path}:{number}: not a JSON record ({error.msg})") from None
    return records
