"""python -m data_gen.auto_explore.filter_repo --repo_dir=DIR: keep the files a task can be about.

Every immediate subfolder of ``--repo_dir`` is a repository; its filtered copy goes to
``data/auto_explore/repos_filtered/<repo>/`` (or ``--output_dir``). A file is kept when

* its suffix is one AutoExplore works with (``envs.sandbox.ALLOWED_SUFFIXES``);
* no component of its path is hidden, ``_``-prefixed (except ``__init__.py``, which
  often holds a package's public API), unsafe for the sandbox (non-ASCII, quotes ...)
  or in :data:`UNINFORMATIVE_NAMES` (matched as a whole component or its stem, case
  insensitive: ``tests/`` and ``LICENSE.md`` go, ``contest.py`` stays);
* it has at least :data:`MIN_CHARS` characters, at least :data:`MIN_ASCII_FRACTION` of
  its bytes are ASCII, and it is small enough to enter a sandbox.

Folders left empty are dropped and symlinks are never followed; an entry that cannot be listed or
read, or whose path is longer than the system takes, is dropped too (``envs.sandbox_copy.skip_reason``).
Each drop is counted by reason in the summary. Re-running replaces a repository's filtered copy as a whole
(built in a temporary folder, then renamed).
"""

import logging
import os
import shutil
import sys
from collections import Counter
from pathlib import Path

from data_gen.common import print_counts
from envs.auto_explore_tasks import DEFAULT_REPOS_DIR, target_depth
from envs.sandbox import MAX_COPY_BYTES, file_kind, is_safe_name
from envs.sandbox_copy import read_regular, skip_reason
from experiment_args import run_script
from prompts import LABELS
from utils.errors import UsageError

logger = logging.getLogger(__name__)

# Names that say nothing about what a repository does; edit here to change the filter.
UNINFORMATIVE_NAMES = frozenset({
    "license", "makefile", "conf.py", "artwork", "requirements", "ci", "tests", "examples",
})
KEPT_UNDERSCORE_NAMES = frozenset({"__init__.py"})
MIN_CHARS = 10
MIN_ASCII_FRACTION = 0.9
_ASCII_BYTES = bytes(range(128))


def name_reason(name: str) -> str | None:
    """Why a path component is dropped by its name alone (None: kept)."""
    if name.startswith("."):
        return "hidden"
    if name.startswith("_") and name not in KEPT_UNDERSCORE_NAMES:
        return "underscore"
    if not is_safe_name(name):
        return "unsafe or non-ASCII name"
    lower = name.lower()
    if lower in UNINFORMATIVE_NAMES or lower.split(".")[0] in UNINFORMATIVE_NAMES:
        return "uninformative name"
    return None


def content_reason(data: bytes) -> str | None:
    """Why a file is dropped by its bytes (None: kept)."""
    if len(data.decode("utf-8", errors="replace")) < MIN_CHARS:
        return "too short"
    non_ascii = len(data.translate(None, _ASCII_BYTES))
    if len(data) - non_ascii < MIN_ASCII_FRACTION * len(data):
        return "under 90% ASCII"
    return None


def filter_tree(source: Path, target: Path, counts: Counter, rel_dir: str = "") -> int:
    """Copy the kept files under ``source/rel_dir`` into ``target``; the number kept.

    Folders are made only for a kept file, so a folder left empty never appears. Raises OSError if
    ``source/rel_dir`` cannot be listed (its parent's call counts it).
    """
    kept = 0
    with os.scandir(source / rel_dir) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
        is_dir = False
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
            kept += filter_entry(source, target, counts, rel, entry, is_dir)
        except OSError as error:
            reason = skip_reason(error)
            if reason is None:
                raise
            counts[f"dropped{' dir' if is_dir else ''}: {reason}"] += 1
    return kept


def filter_entry(source: Path, target: Path, counts: Counter, rel: str, entry: os.DirEntry, is_dir: bool) -> int:
    """Keep the file ``rel`` (1) or the kept files below the folder ``rel`` (their number), or drop it (0)."""
    if entry.is_symlink():
        counts["dropped: symlink"] += 1
        return 0
    reason = name_reason(entry.name)
    if reason is None and not is_dir:
        if not entry.is_file(follow_symlinks=False):
            reason = "not a regular file"
        elif file_kind(entry.name) is None:
            reason = "suffix not allowed"
        elif entry.stat(follow_symlinks=False).st_size > MAX_COPY_BYTES:
            reason = "too large"
    if reason is not None:
        counts[f"dropped{' dir' if is_dir else ''}: {reason}"] += 1
        return 0
    if is_dir:
        below = filter_tree(source, target, counts, rel)
        if not below:
            counts["dropped dir: empty"] += 1
        return below
    data = read_regular(str(source / rel))
    if data is None:  # no longer a regular file, or grown past the bound, since it was listed
        counts["dropped: changed while reading"] += 1
        return 0
    reason = content_reason(data)
    if reason is not None:
        counts[f"dropped: {reason}"] += 1
        return 0
    path = target / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.write_bytes(data)
    except OSError:
        # a path too long here (the output folder's is longer than the source's): no folder left empty by it
        for folder in path.relative_to(target).parents[:-1]:
            if any((target / folder).iterdir()):
                break
            (target / folder).rmdir()
        raise
    counts[f"kept at depth {target_depth(rel)}"] += 1
    return 1


def crowded_dirs(root: Path) -> list[str]:
    """Folders whose action list (cd .. + subfolders + cat and id per file) would exceed the labels."""
    crowded = []
    for dirpath, dirnames, filenames in os.walk(root):
        if 1 + len(dirnames) + 2 * len(filenames) > len(LABELS):
            crowded.append(os.path.relpath(dirpath, root))
    return crowded


def filter_repo(source: Path, out_dir: Path, counts: Counter) -> int:
    """Replace ``out_dir/<repo>`` by the filtered copy of ``source``; the number of files kept."""
    final = out_dir / source.name
    staging = out_dir / f".{source.name}.tmp{os.getpid()}"
    retired = out_dir / f".{source.name}.old{os.getpid()}"
    for leftover in (staging, retired):
        shutil.rmtree(leftover, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        kept = filter_tree(source, staging, counts)
    except OSError as error:
        reason = skip_reason(error)
        if reason is None:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        counts[f"dropped repo: {reason}"] += 1  # its folder cannot be listed
        kept = 0
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for folder in crowded_dirs(staging):
        logger.warning("%s/%s has more actions than the %d choice labels; AutoExplore cannot show it",
                       source.name, folder, len(LABELS))
    if final.exists():
        final.rename(retired)
    staging.rename(final)
    shutil.rmtree(retired, ignore_errors=True)
    return kept


def main(args) -> int:
    if not args.repo_dir:
        raise UsageError("--repo_dir: give the folder whose subfolders are the repositories to filter")
    repo_dir = Path(args.repo_dir)
    if not repo_dir.is_dir():
        raise UsageError(f"--repo_dir: {str(repo_dir)!r} is not a folder")
    out_dir = Path(args.output_dir) if args.output_dir else DEFAULT_REPOS_DIR
    if out_dir.resolve() == repo_dir.resolve() or repo_dir.resolve() in out_dir.resolve().parents:
        raise UsageError(f"--output_dir: {str(out_dir)!r} must not be inside --repo_dir={str(repo_dir)!r} "
                         "(it would be read as a repository next time)")
    repos = sorted(entry for entry in repo_dir.iterdir()
                   if entry.is_dir() and not entry.is_symlink() and not entry.name.startswith("."))
    bad = [entry.name for entry in repos if not is_safe_name(entry.name)]
    if bad:
        raise UsageError(f"--repo_dir: repository folder names must be plain ASCII, got {bad}")
    out_dir.mkdir(parents=True, exist_ok=True)
    counts: Counter = Counter()
    per_repo = {}
    for source in repos:
        per_repo[source.name] = filter_repo(source, out_dir, counts)
        if not per_repo[source.name]:
            logger.warning("repository %s kept no file", source.name)
    summary = {"repos": len(repos), "files kept": sum(per_repo.values())}
    summary.update(sorted(counts.items()))
    summary["output"] = str(out_dir)
    print_counts("auto_explore.filter_repo", summary)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m data_gen.auto_explore.filter_repo"))
