"""Where the project lives: the repository root and the folders named relative to it."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent
DATA_DIR = REPO_ROOT / "data"
RESULTS_DIR = REPO_ROOT / "results"  # run directories <id>_<script>/ (the default --ckpt_path)  # generated data (git-ignored); schemas in data/README.md
# Resolved like REPO_ROOT: a shared/ that is a symbolic link names its games by their real paths.
SHARED_DIR = (REPO_ROOT.parent / "shared").resolve()  # large inputs kept beside the checkout (ALFWorld games)
