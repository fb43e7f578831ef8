"""Shared fixtures: offline, seeded, the tiny model, temporary run directories."""

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from experiment_args import ScriptArguments  # noqa: E402


@pytest.fixture
def make_args(tmp_path):
    """ScriptArguments for the tiny model, writing runs under the test's temp dir."""

    def factory(**overrides) -> ScriptArguments:
        values = {"model_name": "tiny-gpt2", "ckpt_path": str(tmp_path / "results")}
        values.update(overrides)
        return ScriptArguments(**values)

    return factory


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    import tiny_gpt2

    return tiny_gpt2.tiny_gpt2_path()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_path):
    import models

    return models.load_tokenizer("tiny-gpt2")


def snapshot(folder: Path) -> dict:
    """Names, sizes and modification times of everything under ``folder``."""
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in folder.rglob("*")}
