"""python -m envs.play: the oracle wins on each environment; random and human policies run."""

import logging
import os
import subprocess
import sys
from importlib.util import find_spec

import pytest

from tests.conftest import REPO
from utils.paths import SHARED_DIR


def _play(*flags, stdin=None, env=None):
    return subprocess.run([sys.executable, "-m", "envs.play", *flags], cwd=REPO, capture_output=True, text=True,
                          input=stdin, env={**os.environ, **(env or {})}, timeout=300)


def test_taxi_oracle_wins():
    result = _play("--env", "taxi", "--policy", "oracle", "--runs", "3")
    assert result.returncode == 0, result.stderr
    assert "[play] taxi / oracle: 3 of 3 episodes succeeded" in result.stdout
    assert "--- Current State ---" in result.stdout


def test_auto_explore_oracle_wins_on_a_small_repo(tmp_path):
    repo = tmp_path / "tiny_repo"
    (repo / "pkg" / "sub").mkdir(parents=True)
    (repo / "README.md").write_text("# Tiny\nA small repository used by the play test.\n")
    (repo / "pkg" / "core.py").write_text("def answer():\n    return 42\n")
    (repo / "pkg" / "sub" / "deep.py").write_text("VALUE = 'deep file content'\n")
    result = _play("--env", "auto_explore", "--policy", "oracle", "--runs", "4", "--repo_dir", str(repo))
    assert result.returncode == 0, result.stderr
    assert "[play] auto_explore / oracle: 4 of 4 episodes succeeded" in result.stdout
    assert "# Choose from below your command" in result.stdout


def test_auto_explore_over_a_repo_with_unreadable_entries_and_a_path_too_long(awkward_repo, caplog, capsys):
    """A file or folder that cannot be read, or a path past PATH_MAX, stopped envs.play with a PermissionError or
    "File name too long" traceback (in process: the fixture's refusals, for root, are this process's own)."""
    from envs import play
    from experiment_args import parse_args

    args = parse_args(["--env", "auto_explore", "--policy", "oracle", "--runs", "4", "--repo_dir", str(awkward_repo)])
    with caplog.at_level(logging.INFO, logger="envs.sandbox_copy"):
        assert play.main(args) == 0
    assert "[play] auto_explore / oracle: 4 of 4 episodes succeeded" in capsys.readouterr().out
    assert "into the sandbox; skipped {'path too long': 1, 'unreadable': 2}" in caplog.text


def test_random_and_human_policies():
    result = _play("--env", "taxi", "--policy", "random", "--runs", "2", "--seed", "3")
    assert result.returncode == 0 and "episodes succeeded" in result.stdout
    human = _play("--env", "taxi", "--policy", "human", stdin="9\n")
    assert "not a listed label" in human.stdout and "input closed" in human.stdout


@pytest.mark.alfworld
@pytest.mark.skipif(find_spec("alfworld") is None or not (SHARED_DIR / "alfworld").is_dir(),
                    reason="needs the alfworld extra and ../shared/alfworld")
def test_alfworld_oracle_wins_on_the_fixture():
    result = _play("--env", "alfworld", "--policy", "oracle",
                   env={"ALFWORLD_DATA": str(SHARED_DIR / "alfworld" / "fixtures")})
    assert result.returncode == 0, result.stderr
    assert "[play] alfworld / oracle: 1 of 1 episodes succeeded" in result.stdout
