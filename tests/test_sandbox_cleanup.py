"""Issue 31, defect 6: a kill -9 of an AutoExplore run left its sandbox copies (``reflect_rl_repos_*``,
``auto_explore_episode_*``) in the temporary folder, and no later run removed them. Each run's copies now
live in one scratch folder of its process (``envs/scratch.py``), which the next start removes once its
process is dead: the temporary folder does not grow across killed runs."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from envs import scratch
from tests.auto_explore_repos import build_repo
from tests.conftest import REPO

# A process that plays one AutoExplore reset (a pristine copy and an episode sandbox) in the system's
# temporary folder ($TMPDIR), says where, then waits to be killed (or, told to exit, closes once it reads a line:
# the sandbox is still there to be checked).
PLAYER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {repo!r})
    from envs.auto_explore import AutoExploreEnv
    from tests.auto_explore_repos import make_task
    env = AutoExploreEnv(tasks=[make_task({source!r})])
    env.reset(seed=0)
    print(env.sandbox_root, flush=True)
    if sys.argv[1] == "wait":
        time.sleep(600)
    sys.stdin.readline()
    env.close()
""")


def _start(source: Path, tmp: Path, mode: str) -> tuple[subprocess.Popen, Path]:
    code = PLAYER.format(repo=str(REPO), source=str(source))
    process = subprocess.Popen([sys.executable, "-c", code, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "TMPDIR": str(tmp)}, cwd=REPO)
    sandbox = Path(process.stdout.readline().strip())
    assert sandbox.is_dir() and sandbox.is_relative_to(tmp), sandbox
    return process, sandbox


def _scratch_folders(tmp: Path) -> list[Path]:
    return sorted(path for path in tmp.iterdir() if path.name.startswith(scratch.PREFIX))


def test_a_killed_runs_sandboxes_are_removed_by_the_next_start(tmp_path):
    source, tmp = build_repo(tmp_path / "repo"), tmp_path / "tmp"
    tmp.mkdir()
    killed, sandbox = _start(source, tmp, "wait")
    folder = sandbox.parent  # the episode's copy sits in its process's scratch folder, beside the pristine copy
    assert folder.parent == tmp and _scratch_folders(tmp) == [folder]
    assert not [path for path in tmp.iterdir() if path.name.startswith(("reflect_rl_repos_", "auto_explore_episode_"))]
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert folder.is_dir()  # nothing could remove it: the leftover the issue reports

    alive, alive_sandbox = _start(source, tmp, "wait")  # the next start removes the dead run's folder
    try:
        assert not folder.exists()
        assert _scratch_folders(tmp) == [alive_sandbox.parent]
        finished, _ = _start(source, tmp, "exit")  # ... but never a live run's
        finished.communicate("\n", timeout=60)
        assert finished.returncode == 0
        assert alive_sandbox.is_dir() and _scratch_folders(tmp) == [alive_sandbox.parent]
    finally:
        alive.send_signal(signal.SIGKILL)
        alive.wait()

    for _ in range(3):  # killed runs, again and again: the folder holds at most the last one's
        process, _ = _start(source, tmp, "wait")
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert len(_scratch_folders(tmp)) == 1


def test_a_folder_held_by_this_process_is_not_an_orphan(tmp_path):
    mine = scratch.process_folder(tmp_path)
    assert scratch.remove_orphans(str(tmp_path)) == [] and os.path.isdir(mine)
    stale = tmp_path / f"{scratch.PREFIX}stale"
    stale.mkdir()  # no lock file: no live process made it
    assert scratch.remove_orphans(str(tmp_path)) == [str(stale)] and os.path.isdir(mine)
