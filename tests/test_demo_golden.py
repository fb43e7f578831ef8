"""One seed, one table, on any x86 CPU with AVX2: ``python demo.py --profile smoke`` on the reference numerical path
(utils/cpu.py, the demo's default for tiny-gpt2) gives the committed table byte for byte, and every model it trains
the committed weights bit for bit.

The table of a few training steps is a weak witness alone: a last-bit difference moves a sampled action only where
the draw falls within that bit of a boundary. The weights are the strong one: a reduction summed in another order
(AVX-512 against AVX2 in torch's kernels, MKL's path for the CPU, another thread count) changes their bits at the
first step, and a full demo turns such bits into another table (issue 64: seed 0's Reflect-RL 66.0% on an AVX2 CPU,
30.5% on an AVX-512 one, before the path was pinned).

The demo sets the path itself when it starts (before torch), whatever the environment says, so this test runs once,
in the main leg of make test: the portable leg would play the same path again. Only ever rewritten on purpose, when a
change is meant to move the numbers: ``REFLECTRL_WRITE_GOLDEN=1 pytest tests/test_demo_golden.py``.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden"
TABLE, WEIGHTS = GOLDEN / "demo_smoke.md", GOLDEN / "demo_smoke_weights.json"


def weight_digests(runs: Path) -> dict[str, str]:
    """The SHA-256 of every weights file a seed's stages saved, by its path under ``runs`` (run folders numbered
    per script, so the same on every machine)."""
    return {str(path.relative_to(runs)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(runs.rglob("*.safetensors"))}


@pytest.mark.slow
def test_the_smoke_demo_gives_the_committed_table_and_weights(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}  # the demo fixes its threads
    done = subprocess.run([sys.executable, "demo.py", "--profile", "smoke", "--seed", "0", f"--ckpt_path={tmp_path}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "numerics: the reference path" in done.stdout
    table = (tmp_path / "demo" / "results.md").read_bytes()
    weights = weight_digests(tmp_path / "demo" / "seed-0" / "runs")
    assert len(weights) == 6  # three SFT models, three RL runs
    if os.environ.get("REFLECTRL_WRITE_GOLDEN") == "1":
        TABLE.write_bytes(table)
        WEIGHTS.write_text(json.dumps(weights, indent=1, sort_keys=True) + "\n")
    assert table == TABLE.read_bytes(), f"the smoke demo's table moved:\n{table.decode()}"
    expected = json.loads(WEIGHTS.read_text())
    moved = sorted(name for name in expected if weights.get(name) != expected[name])
    assert not moved and set(weights) == set(expected), f"these weights moved on this CPU: {moved}"


def test_the_demo_takes_the_reference_path_unless_told_otherwise():
    import demo

    assert demo.reference_path_asked([]) and demo.reference_path_asked(["--model_name", "tiny-gpt2", "--seed", "1"])
    assert not demo.reference_path_asked(["--native_numerics"])
    assert not demo.reference_path_asked(["--model_name=SmolLM2.gguf"])  # bfloat16 where native: its own path


def test_only_a_demo_started_on_the_reference_path_fixes_its_threads(monkeypatch):
    """A run started in this process (a test calling main), whose environment holds the path's variables (make test's
    portable leg), keeps this process's threads: setting them would hold every later test in it to them. Only
    ``python demo.py``, which set the path before torch started, takes the path's fixed thread count."""
    import torch

    import demo
    from utils import cpu

    for name, value in cpu.PINNED.items():
        monkeypatch.setenv(name, value)
    threads = torch.get_num_threads()
    assert demo.numerics(True) is None and torch.get_num_threads() == threads
    monkeypatch.setattr(demo, "STARTED_ON_REFERENCE_PATH", True)
    try:
        assert demo.numerics(True) == cpu.PINNED_CORES == torch.get_num_threads()
        assert demo.numerics(False) is None  # --native_numerics, or a pretrained model
    finally:
        torch.set_num_threads(threads)
