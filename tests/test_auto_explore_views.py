"""AutoExplore: what cat/head/tail show, and the tasks (targets, depth, task files)."""

import json

import pytest

from envs.auto_explore import AutoExploreEnv
from envs.auto_explore_tasks import TASK_FIELDS, load_tasks, optimal_path, target_depth, task_depth
from envs.sandbox import MAX_TOKENS, TOKEN_RE
from envs.sandbox_paths import file_kind
from tests.auto_explore_repos import TARGET, build_repo, make_env, make_task, run, write


@pytest.fixture
def repo(tmp_path):
    return build_repo(tmp_path / "demo_repo")


def last_result(obs: str) -> str:
    return obs.split("# Execution result of your last command\n")[1].split("# Choose from below")[0][:-1]


def cat(env, name: str) -> str:
    obs, *_ = env.step_command(f"cat {name}")
    return last_result(obs)


def test_cat_truncation_by_kind(repo):
    write(repo / "short.py", "a = 1\nb = 2\n")
    write(repo / "long.py", " \n" * 1200)  # blank lines: the line limit, not the token cap, applies
    write(repo / "table.tsv", "".join(f"{i}\t{i}\n" for i in range(9)))
    write(repo / "notes.md", "".join(f"n{i}\n" for i in range(150)))
    write(repo / "plain", "".join(f"p{i}\n" for i in range(12)))
    write(repo / "empty.txt", "")
    env = AutoExploreEnv(tasks=[make_task(repo)])
    env.reset(seed=0)
    assert cat(env, "short.py") == "a = 1\nb = 2"
    assert cat(env, "empty.txt") == "(empty file)"
    long = cat(env, "long.py").splitlines()
    assert len(long) == 1001 and long[-1] == "[output cut (1000-line limit for this file type): showed 1000 of 1200 lines]"
    assert cat(env, "src/data.csv").splitlines() == ["0,0", "1,1", "2,4", "3,9", "4,16",
                                                     "[output cut (5-line limit for this file type): showed 5 of 20 lines]"]
    assert cat(env, "table.tsv").splitlines()[-1].endswith("showed 5 of 9 lines]")
    notes = cat(env, "notes.md").splitlines()
    assert notes[:2] == ["n0", "n1"] and len(notes) == 101 and notes[-1].endswith("showed 100 of 150 lines]")
    plain = cat(env, "plain").splitlines()
    assert plain[-2:] == ["p9", "[output cut (10-line limit for this file type): showed 10 of 12 lines]"]
    assert cat(env, "LICENSE").splitlines()[-1].endswith("showed 10 of 30 lines]")
    assert file_kind("run.SH") == "exec" and file_kind("LICENSE") is None


def test_cat_token_cap(repo):
    write(repo / "big.py", "".join(f"value_{i} = {i}\n" for i in range(400)))  # 3 tokens a line
    write(repo / "word.txt", "w" * 10_000 + "\n")  # one huge "token": the character cap applies
    env = AutoExploreEnv(tasks=[make_task(repo)])
    env.reset(seed=0)
    *body, note = cat(env, "big.py").splitlines()
    assert len(TOKEN_RE.findall("\n".join(body))) == MAX_TOKENS
    assert body[0] == "value_0 = 0" and note.startswith(f"[output cut (~{MAX_TOKENS}-token limit)")
    assert note.endswith("of 400 lines]")
    body, note = cat(env, "word.txt").splitlines()
    assert len(body) < 5000 and "token limit" in note


def test_a_smaller_view_for_shorter_observations(repo):
    """--auto_explore_view_tokens: the recipe's shorter file views, in every view command and in the env
    that env_kwargs builds."""
    from envs import EnvSettings, env_kwargs
    from experiment_args import ScriptArguments, parse_args

    write(repo / "big.py", "".join(f"value_{i} = {i}\n" for i in range(400)))
    args = parse_args(["--env=auto_explore", "--auto_explore_view_tokens=12"])
    kwargs = env_kwargs(EnvSettings.from_args(args), evaluation=True)  # no leave-out
    env = AutoExploreEnv(tasks=[make_task(repo)], **{k: v for k, v in kwargs.items() if k != "repos_dir"})
    env.reset(seed=0)
    *body, note = cat(env, "big.py").splitlines()
    assert len(TOKEN_RE.findall("\n".join(body))) == 12 and note.startswith("[output cut (~12-token limit)")
    obs, *_ = env.step_command("head big.py")
    assert "(~12-token limit)" in obs
    with pytest.raises(ValueError, match="--auto_explore_view_tokens: must be >= 1"):
        ScriptArguments(env="auto_explore", auto_explore_view_tokens=0)


def test_head_and_tail(repo):
    write(repo / "lines.txt", "".join(f"line {i}\n" for i in range(30)))
    write(repo / "wide.py", "".join(" ".join(f"t{i}_{j}" for j in range(100)) + "\n" for i in range(12)))
    env = AutoExploreEnv(tasks=[make_task(repo)])
    env.reset(seed=0)
    obs, *_ = env.step_command("head lines.txt")
    assert last_result(obs).splitlines() == [f"line {i}" for i in range(10)]
    obs, *_ = env.step_command("tail lines.txt")
    assert last_result(obs).splitlines() == [f"line {i}" for i in range(20, 30)]
    obs, *_ = env.step_command("head wide.py")
    *body, note = last_result(obs).splitlines()
    assert body[0].startswith("t0_0 ") and len(TOKEN_RE.findall("\n".join(body))) == MAX_TOKENS
    assert note.startswith("[output cut") and "first" in note
    obs, *_ = env.step_command("tail wide.py")
    *body, note = last_result(obs).splitlines()
    assert body[-1].endswith("t11_99") and len(TOKEN_RE.findall("\n".join(body))) <= MAX_TOKENS
    assert "last" in note


def test_several_targets_oracle_takes_the_nearest(repo):
    task = make_task(repo, filename=[TARGET, "docs/guide.rst"])
    env = make_env(repo, tasks=[task])
    assert optimal_path(task) == ["cd docs", "cat guide.rst", "id guide.rst"]
    _, info = env.reset(seed=0)
    assert env.targets == ["docs/guide.rst", TARGET]
    assert info["actions"][info["labels"].index(info["oracle_label"])] == "cd docs"
    run(env, ["cd src"])  # now the other target is nearer
    assert env._oracle_command() == "cd utils"
    steps = run(env, ["cd utils", "cat helpers.py", "id helpers.py"])
    assert steps[-1][3]["success"]


def test_task_from_options_and_repos_dir(repo):
    env = AutoExploreEnv(repos_dir=repo.parent)
    task = make_task(repo)
    task["root"] = "demo_repo"
    obs, _ = env.reset(seed=0, options={"task": task})
    assert "# Current working directory\ndemo_repo\n" in obs and env.cwd == ""
    other = AutoExploreEnv()
    other.reset(seed=0, options={"task": task, "repos_dir": str(repo.parent)})
    assert other.targets == [TARGET]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"filename": "src/utils/missing.py"}, "src/utils/missing.py"),
        ({"filename": "src/image.png"}, "allowed suffix"),
        ({"filename": "../outside.py"}, "filename"),
        ({"filename": []}, "filename"),
        ({"question": None}, "question"),
        ({"root": "no_such_repo"}, "no_such_repo"),
    ],
)
def test_bad_tasks_raise_naming_the_value(repo, change, message):
    task = {**make_task(repo), **change}
    env = AutoExploreEnv(repos_dir=repo.parent)
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        env.reset(seed=0, options={"task": task})


def test_reset_without_any_task_raises():
    with pytest.raises(ValueError, match="task"):
        AutoExploreEnv().reset(seed=0)
    with pytest.raises(ValueError, match="leaveout_prob"):
        AutoExploreEnv(leaveout_prob=1.5)


def test_depth_of_a_target_and_of_a_task():
    assert target_depth("a.py") == 0 and target_depth("src/pkg/a.py") == 2
    assert task_depth({"filename": "a.py"}) == 0
    assert task_depth({"filename": ["src/pkg/a.py", "b.py"]}) == 2  # the first target's


def test_load_tasks_keeps_task_fields_and_names_bad_files(tmp_path):
    record = {"question": "Where?", "answer": "a", "filename": "a.py", "root": "r", "n_level": 0,
              "optimal_path": ["cat a.py", "id a.py"], "model": "m", "trajectories": [{"trajectory": []}]}
    file = tmp_path / "tasks.json"
    file.write_text(json.dumps([record]))
    assert load_tasks(file) == [{key: record[key] for key in TASK_FIELDS}]
    assert load_tasks(file, whole_records=True) == [record]
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    assert load_tasks(empty, whole_records=True) == []
    for text, message in (("[]", "holds no task"), ("{}", "JSON list of task objects"),
                          ("[1]", "JSON list of task objects"), ("[", "not valid JSON")):
        empty.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_tasks(empty)
    with pytest.raises(ValueError, match="--task_file: no such file"):
        load_tasks(tmp_path / "none.json")
    with pytest.raises(ValueError, match="--task_file: AutoExplore needs"):
        load_tasks(None)
