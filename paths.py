"""Where the project lives: the repository root and the folders named relative to it."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent
DATA_DIR = REPO_ROOT / "data"
RESULTS_DIR = REPO_ROOT / "results"  # run directories <id>_<script>/ (the default --ckpt_path)  # generated data (git-ignored); schemas in data/README.md
SHARED_DIR = REPO_ROOT.parent / "shared"  # large inputs kept beside the checkout (ALFWorld games)
