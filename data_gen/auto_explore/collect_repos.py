"""python -m data_gen.auto_explore.collect_repos: real repositories, offline, from installed packages.

Each package of :data:`PACKAGES` (all installed with this project) becomes a repository
``data/auto_explore/repos/<distribution>/`` (or ``--output_dir``) laid out like its
source repository: the package folder, a README made from the distribution's long
description and its license files. Their trees give target depths 0 (README), 1 and 2
after filtering. Caches, compiled and binary files and symlinks are not copied, and a
repository holds at most :data:`MAX_FILES_PER_REPO` files (shallowest first).

Re-running rebuilds each repository the same way (a temporary folder, then a rename).
"""

import importlib.metadata
import importlib.util
import logging
import os
import shutil
import sys
from pathlib import Path

from data_gen.auto_explore import RAW_REPOS_DIR
from data_gen.common import print_counts
from experiment_args import run_script

logger = logging.getLogger(__name__)

# Import names; small trees of varied depth (yaml: flat, tqdm: one level, gymnasium and
# datasets: two levels and more).
PACKAGES = ("yaml", "tqdm", "gymnasium", "datasets")
MAX_FILES_PER_REPO = 400
MAX_FILE_BYTES = 1024 * 1024
SKIPPED_DIRS = frozenset({"__pycache__"})
SKIPPED_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd", ".dll", ".dylib", ".a", ".o", ".lib", ".exe", ".whl",
                    ".zip", ".gz", ".bz2", ".xz", ".png", ".jpg", ".gif", ".ico", ".ttf")
README_NAMES = {"text/markdown": "README.md", "text/x-rst": "README.rst"}


def package_files(package_dir: Path) -> list[str]:
    """Files of the package worth copying, relative to it, shallowest first then by name."""
    found = []
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in SKIPPED_DIRS and not os.path.islink(os.path.join(dirpath, d)))
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file() or name.lower().endswith(SKIPPED_SUFFIXES):
                continue
            if path.stat().st_size <= MAX_FILE_BYTES:
                found.append(path.relative_to(package_dir).as_posix())
    return sorted(found, key=lambda rel: (rel.count("/"), rel))


def readme(distribution) -> tuple[str, str] | None:
    """(file name, text) of the distribution's long description, if it has one."""
    metadata = distribution.metadata
    text = metadata.get_payload() or metadata.get("Description") or ""
    if not text.strip():
        return None
    kind = (metadata.get("Description-Content-Type") or "").split(";")[0].strip().lower()
    return README_NAMES.get(kind, "README.txt"), text


def license_files(distribution) -> list[Path]:
    return [Path(distribution.locate_file(f)) for f in distribution.files or []
            if ".dist-info" in str(f) and Path(str(f)).name.upper().startswith(("LICEN", "COPYING"))]


def collect(import_name: str, out_dir: Path) -> tuple[str, int] | None:
    """Build ``out_dir/<repo>`` from an installed package; (repo name, files) or None if not installed."""
    spec = importlib.util.find_spec(import_name)
    if spec is None or not spec.submodule_search_locations:
        logger.warning("package %s is not installed (or not a package); skipped", import_name)
        return None
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    dist_names = importlib.metadata.packages_distributions().get(import_name) or [import_name]
    distribution = importlib.metadata.distribution(dist_names[0])
    repo = distribution.metadata["Name"].lower()
    staging = out_dir / f".{repo}.tmp{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    files = package_files(package_dir)
    if len(files) > MAX_FILES_PER_REPO:
        logger.info("%s: keeping %d of %d files (the shallowest)", repo, MAX_FILES_PER_REPO, len(files))
        files = files[:MAX_FILES_PER_REPO]
    for rel in files:
        target = staging / import_name / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(package_dir / rel, target, follow_symlinks=False)
    written = len(files)
    description = readme(distribution)
    if description is not None:
        (staging / description[0]).write_text(description[1], encoding="utf-8")
        written += 1
    for path in license_files(distribution):
        if path.is_file() and not path.is_symlink():
            shutil.copyfile(path, staging / path.name)
            written += 1
    final, retired = out_dir / repo, out_dir / f".{repo}.old{os.getpid()}"
    if final.exists():
        final.rename(retired)
    staging.rename(final)
    shutil.rmtree(retired, ignore_errors=True)
    return repo, written


def main(args) -> int:
    out_dir = Path(args.output_dir) if args.output_dir else RAW_REPOS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for import_name in PACKAGES:
        result = collect(import_name, out_dir)
        if result is None:
            counts[f"{import_name} (missing)"] = 0
        else:
            counts[result[0]] = result[1]
    print_counts("auto_explore.collect_repos", {"repos": sum(1 for v in counts.values() if v), **counts,
                                                "output": str(out_dir)})
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m data_gen.auto_explore.collect_repos"))
