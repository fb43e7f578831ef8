"""The AutoExplore sandbox against hostile repositories and hostile commands.

The source repository holds names with shell metacharacters, quotes, newlines and
non-UTF-8 bytes, symlinks pointing out (at the top and at depth 2), symlink loops, a
FIFO and hidden files; a secret lives outside it. Whatever the agent types, nothing
raises, failures are ``Error:`` results, the secret never shows, and no file anywhere
under the test's directory changes.
"""

import logging
import os
import shlex
import signal
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs.auto_explore import ERROR_COST, STEP_COST, AutoExploreEnv
from envs.sandbox import Sandbox, link_tree, pristine_copy
from envs.sandbox_paths import is_safe_name, printable, quote_path
from tests.auto_explore_repos import UNREADABLE_SECRET

SECRET = "TOPSECRET-9f2c41d7"
HIDDEN_SECRET = "HIDDENSECRET-3b8e05aa"
TARGET = "src/pkg/mod.py"

# Safe but shell-hostile names: copied, listed and quoted in commands.
ODD_SAFE_NAMES = ["with space.py", "semi;colon.py", "$(cat secret).py", "a&&b.py", "x|y.md", "100%.txt",
                  "star*.py", "hash#.py", "-rf.py", "brace{x}.py", "lt<gt>.py", "!bang.py", "tilde~.py"]
# Names that never enter a sandbox.
UNSAFE_NAMES = [b'dq"uote.py', b"sq'uote.py", b"back`tick`.py", b"back\\slash.py", b"new\nline.py",
                b"tab\there.py", b"bad\xff\xfe.py", b"caf\xc3\xa9.py", b"~home.py"]


@pytest.fixture
def no_hang():
    """Fail instead of hanging if something opens a FIFO and waits on it."""

    def timeout(signum, frame):
        raise TimeoutError("sandbox operation blocked")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def write_bytes(path: bytes, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


@pytest.fixture
def hostile(tmp_path):
    """(tmp_path, repo path) of a repository full of traps, with a secret outside it."""
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret.txt").write_text(SECRET + "\n")
    (outside / "dir" / "secret.py").write_text(f"KEY = '{SECRET}'\n")
    repo = tmp_path / "hostile_repo"
    (repo / "src" / "pkg").mkdir(parents=True)
    (repo / "ok.py").write_text("print('ok')\n")
    (repo / TARGET).write_text("def target():\n    pass\n")
    (repo / "dir with space").mkdir()
    (repo / "dir with space" / "inner.py").write_text("inner = 1\n")
    for name in ODD_SAFE_NAMES:
        (repo / name).write_text(f"content of {name}\n")
    base = os.fsencode(repo)
    for name in UNSAFE_NAMES:
        write_bytes(base + b"/" + name, b"unsafe\n")
    os.mkdir(base + b"/bad\xffdir")
    write_bytes(base + b"/bad\xffdir/inside.py", b"x\n")
    os.symlink(outside / "secret.txt", repo / "leak.py")
    os.symlink(outside / "dir", repo / "src" / "pkg" / "outside")
    os.symlink("..", repo / "src" / "up")
    os.symlink("ok.py", repo / "inside_link.py")
    os.symlink("loop", repo / "loop")
    os.symlink("b_loop", repo / "a_loop")
    os.symlink("a_loop", repo / "b_loop")
    os.mkfifo(repo / "pipe.py")
    (repo / ".hidden.py").write_text(HIDDEN_SECRET + "\n")
    (repo / ".git").mkdir()
    (repo / ".git" / "config.yaml").write_text(HIDDEN_SECRET + "\n")
    return tmp_path, repo


def snapshot(root) -> dict:
    """Every entry under ``root`` (not following links): type, size, bytes or link target."""
    found = {}
    stack = [os.fsencode(root)]
    while stack:
        directory = stack.pop()
        for entry in os.scandir(directory):
            status = os.lstat(entry.path)
            if stat.S_ISLNK(status.st_mode):
                found[entry.path] = ("link", os.readlink(entry.path))
            elif stat.S_ISDIR(status.st_mode):
                found[entry.path] = ("dir", stat.S_IMODE(status.st_mode))
                stack.append(entry.path)
            elif stat.S_ISREG(status.st_mode):
                with open(entry.path, "rb") as f:
                    found[entry.path] = ("file", status.st_size, f.read())
            else:
                found[entry.path] = ("other", stat.S_IFMT(status.st_mode))
    return found


def sandbox_names(root) -> list[bytes]:
    return [os.path.relpath(path, os.fsencode(root)) for path in snapshot(root)]


def make_env(repo, **kwargs) -> AutoExploreEnv:
    task = {"question": "Where is target()?", "answer": "", "filename": TARGET, "root": str(repo)}
    kwargs.setdefault("cost_rule", "outcome")  # the costs that tell a failed command apart
    return AutoExploreEnv(tasks=[task], **kwargs)


# --- hostile commands ---------------------------------------------------------------------


def fragments(tmp_path) -> list[str]:
    secret = str(tmp_path / "outside" / "secret.txt")
    return [
        "..", "../..", "../../..", "/etc/passwd", "/", "~", "~/.ssh/id_rsa", secret, "../outside/secret.txt",
        "leak.py", "src/pkg/outside", "src/pkg/outside/secret.py", "outside", "outside/secret.py", "src/up",
        "src/up/ok.py", "up", "inside_link.py", "loop", "a_loop", "b_loop", "loop/loop", "pipe.py", ".hidden.py",
        ".git", ".git/config.yaml", ".", "./ok.py", "src/./pkg", "src//pkg", "src/pkg/", "ok.py", "src", "pkg",
        "mod.py", "src/pkg/mod.py", "dir with space", '"dir with space"', "'ok.py'", '"', "'", "\\", "`",
        ";", "&&", "||", "|", "&", ">", ">>", "<", "2>", "$(cat /etc/passwd)", f"$(cat {secret})", f"`cat {secret}`",
        "${HOME}", "$HOME", "*", "?", "-rf", "\n", "\r\n", "\0", "\t", "\x1b[2J", "é", "\udcff", "x" * 300,
        "a/" * 60, "y" * 5000, "semi;colon.py", '"$(cat secret).py"', "$(cat secret).py", "bad\udcff\udcfe.py",
    ]


WORDS = ["cd", "ls", "cat", "head", "tail", "id", "rm", "echo", "python", "sh", "cp", "touch", "sudo", "", "CD"]


def commands(tmp_path):
    piece = st.one_of(st.sampled_from(fragments(tmp_path)), st.text(max_size=12))
    joined = st.builds(
        lambda word, parts, sep: (word + " " + sep.join(parts)).strip(" ") if word else sep.join(parts),
        st.sampled_from(WORDS), st.lists(piece, max_size=4), st.sampled_from([" ", "", "/", " ; ", " && ", "\n"]),
    )
    climbing = st.sampled_from(["cd src", "cd pkg", "cd outside", "cd up", "cd ..", "cd ../..", "ls ..", "cat ../ok.py",
                                "cd src/up", "cd src/pkg/outside", "ls outside", "cat outside/secret.py"])
    return st.lists(st.one_of(joined, climbing, st.text(max_size=40)), min_size=1, max_size=12)


@pytest.mark.parametrize("leaveout_prob", [0.0, 0.5], ids=["the pristine view", "an episode copy"])
def test_hostile_commands_stay_inside(hostile, no_hang, leaveout_prob):
    tmp_path, repo = hostile
    before = snapshot(tmp_path)
    env = make_env(repo, leaveout_prob=leaveout_prob)
    env.reset(seed=0)
    episode_root = env.sandbox_root
    seen_commands = []

    @settings(derandomize=True, max_examples=500, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(commands(tmp_path))
    def check(sequence):
        env.reset(seed=0)
        for command in sequence:
            if env.done:
                env.reset(seed=0)
            seen_commands.append(command)
            obs, reward, terminated, truncated, info = env.step_command(command)
            assert SECRET not in obs and HIDDEN_SECRET not in obs
            result = obs.split("# Execution result of your last command\n", 1)[1]
            if info["error"]:
                assert result.startswith("Error: ")
                assert reward == -(STEP_COST + ERROR_COST) - (env.horizon if truncated else 0)
                assert not terminated
            assert ".." not in env.cwd.split("/")
            assert os.path.realpath(os.path.join(env.sandbox_root, env.cwd)).startswith(
                os.path.realpath(env.sandbox_root))

    check()
    env.close()
    assert len(seen_commands) > 500
    # an episode copy is removed at the next reset and at close; the pristine view stays for the process
    assert os.path.exists(episode_root) == os.path.exists(env.sandbox_root) == (leaveout_prob == 0)
    assert snapshot(tmp_path) == before


def test_explicit_escapes_are_errors(hostile, no_hang):
    tmp_path, repo = hostile
    env = make_env(repo)
    env.reset(seed=0)
    secret = tmp_path / "outside" / "secret.txt"
    for command in [f"cat {secret}", "cat ../outside/secret.txt", "cat leak.py", "cd src/pkg/outside",
                    "cat src/pkg/outside/secret.py", "cd src/up", "cat inside_link.py", "cat loop", "cd a_loop",
                    "cat pipe.py", "cat .hidden.py", "cd .git", "cd ..", "cd", "ls ~", "cat ok.py; cat leak.py",
                    "cat ok.py | tail", f"cat $(cat {secret})", "cat 'ok.py", "cd src && cd ..", "cat ok.py > x.py",
                    "cat ok.py\ncat leak.py", "cat ok.py\0", "rm -rf ok.py", "cat ok.py ok.py", "cat", "id src"]:
        env.reset(seed=0)
        obs, reward, terminated, _, info = env.step_command(command)
        assert info["error"], command
        assert reward == -3 and not terminated
        assert "# Execution result of your last command\nError: " in obs
        assert SECRET not in obs
    # history lines stay one line each, whatever was typed
    env.reset(seed=0)
    obs, *_ = env.step_command("cat ok.py\ncat leak.py")
    assert "# Command history\ncat ok.py\\ncat leak.py\n" in obs


def test_links_and_fifos_planted_in_an_episode_copy_are_refused(hostile, tmp_path, no_hang):
    _, repo = hostile
    env = make_env(repo)
    env.reset(seed=0)
    root = env.sandbox_root
    os.symlink(tmp_path / "outside" / "secret.txt", os.path.join(root, "planted.py"))
    os.symlink(tmp_path / "outside", os.path.join(root, "src", "planted_dir"))
    os.mkfifo(os.path.join(root, "planted_pipe.py"))
    for command in ["cat planted.py", "id planted.py", "head planted.py", "cd src/planted_dir",
                    "ls src/planted_dir", "cat src/planted_dir/secret.txt", "cat planted_pipe.py",
                    "tail planted_pipe.py"]:
        obs, reward, _, _, info = env.step_command(command)
        assert info["error"] and reward == -3, command
        assert SECRET not in obs
    assert "planted" not in env.observation.split("# Command history")[0]
    env.close()


# --- what a sandbox copy holds --------------------------------------------------------------


def test_only_safe_regular_entries_are_copied(hostile, no_hang):
    _, repo = hostile
    env = make_env(repo)
    obs, info = env.reset(seed=0)
    names = sandbox_names(env.sandbox_root)
    for name in names:
        for part in os.fsdecode(name).split("/"):
            assert is_safe_name(part), name
    expected = {b"ok.py", b"src", b"src/pkg", b"src/pkg/mod.py", b"dir with space", b"dir with space/inner.py"}
    expected |= {os.fsencode(name) for name in ODD_SAFE_NAMES}
    assert set(names) == expected
    for name, entry in snapshot(env.sandbox_root).items():
        assert entry[0] in ("file", "dir"), name
    listing = obs.split("# Files under current working directory\n")[1].split("# Command history")[0]
    assert listing.splitlines() == sorted(["ok.py", "src/", "dir with space/"] + ODD_SAFE_NAMES,
                                          key=lambda n: n.rstrip("/"))
    for word in ("leak", "loop", "pipe", "hidden", "uote", "tick", "line", "bad", "home", "outside", "caf"):
        assert word not in listing


@pytest.mark.parametrize("leaveout_prob", [0.0, 0.5], ids=["the pristine view", "an episode copy"])
def test_unreadable_entries_and_paths_too_long_are_left_out_and_counted(awkward_repo, caplog, no_hang, leaveout_prob):
    """An entry that cannot be read, or whose path passes PATH_MAX, stopped the first reset with a PermissionError
    or "File name too long" traceback: it is left out of the copy and counted in the copy's line, as a symlink is;
    the rest is copied and played, down to the deepest folder of the chain the copy holds."""
    task = {"question": "Where is run_awkward()?", "answer": "", "filename": "pkg/core.py", "root": str(awkward_repo)}
    env = AutoExploreEnv(tasks=[task], leaveout_prob=leaveout_prob, cost_rule="outcome", horizon=100)
    with caplog.at_level(logging.INFO, logger="envs.sandbox_copy"):
        env.reset(seed=0)
    assert (f"copied {os.path.realpath(awkward_repo)} into the sandbox; skipped {{'path too long': 1, "
            "'unreadable': 2}") in caplog.text
    names = {os.fsdecode(name) for name in sandbox_names(env.sandbox_root)}
    assert "pkg/core.py" in names and not {"pkg/secret.py", "locked", "locked/inner.py"} & names
    assert not any(name.endswith("far.py") for name in names)
    for command in ("cat pkg/secret.py", "cd locked", "ls locked", "cat locked/inner.py"):
        obs, _, _, _, info = env.step_command(command)
        assert info["error"] and UNREADABLE_SECRET not in obs, command
    if "chain" in names:  # (an episode copy may leave it out)
        env.step_command("cd chain")
        depth = 0
        while not env.step_command("cd " + "d" * 200)[4]["error"]:
            depth += 1
            assert "far.py" not in env.observation
        assert depth > 10
    env.reset(seed=0)
    for command in ("cd pkg", "cat core.py"):
        assert not env.step_command(command)[4]["error"], command
    _, _, terminated, _, info = env.step_command("id core.py")
    assert terminated and info["correct"]
    env.close()


def test_an_episode_copy_leaves_out_a_path_too_long_for_it(tmp_path):
    """An episode copy's folder has a longer name than the pristine copy's: an entry that fit in the one but not in
    the other stopped the reset with "File name too long"; it is left out, as the pristine copy leaves one out."""
    pristine, episode = tmp_path / "p", tmp_path / ("e" * 11)  # 10 bytes longer
    limit = os.pathconf(tmp_path, "PC_PATH_MAX")
    deep = pristine.joinpath(*["d" * 100] * ((limit - len(os.fsencode(pristine)) - 100) // 101))
    deep = deep / ("f" * (limit - 60 - len(os.fsencode(deep)) - 1))  # 60 bytes short of PATH_MAX
    deep.mkdir(parents=True)
    (deep / "a.py").write_text("x = 1\n")
    fits = "n" * 58  # its path one byte short of PATH_MAX in the pristine copy, 9 bytes past it in the episode's
    (deep / fits).write_text("y = 2\n")
    episode.mkdir()
    link_tree(str(pristine), str(episode))
    copied = episode / deep.relative_to(pristine)
    assert (copied / "a.py").read_text() == "x = 1\n" and fits not in os.listdir(copied)


def test_odd_safe_names_round_trip_through_the_enumerator(hostile, no_hang):
    _, repo = hostile
    env = make_env(repo)
    _, info = env.reset(seed=0)
    for name in ODD_SAFE_NAMES:
        assert f"cat {quote_path(name)}" in info["actions"]
    for name in ODD_SAFE_NAMES:
        obs, reward, *_, info = env.step(env.label_of(f"cat {quote_path(name)}"))
        assert not info["error"] and reward == -1
        assert f"# Execution result of your last command\ncontent of {name}\n" in obs
    env.step(env.label_of('cd "dir with space"'))
    assert env.cwd == "dir with space"
    _, _, terminated, _, info = env.step(env.label_of("id inner.py"))
    assert terminated and info["identified"] == "dir with space/inner.py" and not info["correct"]


@settings(derandomize=True, max_examples=300, database=None)
@given(st.lists(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=20),
                min_size=1, max_size=3))
def test_quoting_round_trips_every_safe_path(parts):
    if not all(is_safe_name(part) for part in parts):
        parts = [part for part in parts if is_safe_name(part)] or ["plain.py"]
    path = "/".join(parts)
    for word in ("cd", "cat", "id"):
        assert shlex.split(f"{word} {quote_path(path)}") == [word, path]


def test_unsafe_names(tmp_path):
    for name in ['a"b', "a'b", "a`b", "a\\b", "a\nb", "a\tb", "a\x00b", "\udcffx", "é.py", ".hidden", ".", "..",
                 "", "~x"]:
        assert not is_safe_name(name), name
    for name in ["a b.py", "semi;colon", "$(x)", "a|b", "-rf", "x~", "100%"]:
        assert is_safe_name(name), name
    assert printable("a\nb\x00\udcff") == "a\\nb\\x00\\udcff"


def test_sandbox_closes_once_and_cleans_up(hostile):
    """A view that leaves entries out is a copy of its own, removed on close; one that leaves nothing out
    is the process's pristine copy, which stays for the next episode."""
    _, repo = hostile
    box = Sandbox(repo, leave_out=lambda rel, is_dir: rel == "src")
    root = box.root
    assert os.path.isdir(root) and not box.closed and root != pristine_copy(repo)
    assert "src/" not in box.listing() and "src/" in Sandbox(repo).listing()
    box.close()
    box.close()
    assert box.closed and not os.path.exists(root)
    whole = Sandbox(repo)
    assert whole.root == pristine_copy(repo)
    whole.close()
    assert whole.closed and os.path.isdir(pristine_copy(repo))
