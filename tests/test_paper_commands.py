"""The paper's README commands, as its users type them, are accepted by our scripts unchanged.

Each is parsed by the script's own flag set (with the script's environment default, as its
``__main__`` does), and :func:`test_the_papers_commands_run_in_order` runs all of them, in
order, as one pipeline, with only flags appended (offline writers and small budgets).
"""

import fnmatch
import os
import shlex

import pytest

from experiment_args import parse_args
from tests.auto_explore_repos import build_repos
from tests.conftest import REPO, copy_repository, snapshot
from tests.in_process import project_from, run_in_process
from tests.openai_server import OpenAIServer
from tests.test_readme import OVERRIDES, USES_API, _checkpoints, _latest, _target
from utils.paths import SHARED_DIR

# The script's --env default (what its __main__ passes to parse_args), by module.
ENV_OF = {"data_gen.taxi": "taxi", "data_gen.alfworld": "alfworld", "evaluation.auto_explore_gpt": "auto_explore"}

PAPER_COMMANDS = [
    "python -m data_gen.auto_explore.filter_repo --repo_dir=data/auto_explore/repos",
    "python -m data_gen.auto_explore.gen_task",
    "python -m data_gen.auto_explore.filter_task --task_file=data/auto_explore/tasks/",
    "python -m data_gen.auto_explore.reflection_negative",
    "python -m data_gen.auto_explore.split_data "
    "--task_file=data/auto_explore/tasks_filtered/data_reflection_negative.json",
    "python -m data_gen.auto_explore.gen_sft --task_file=data/auto_explore/tasks_filtered/train.json",
    "python -m data_gen.taxi.reflection",
    "python -m data_gen.taxi.gen_sft",
    "python -m data_gen.alfworld.reflection",
    "python -m data_gen.alfworld.gen_sft",
    "python supervised_pretrain.py --max_steps=2000 --task_file=data/auto_explore/tasks_filtered/sft_reflection.jsonl",
    "python supervised_pretrain.py --max_steps=2000 --task_file=data/auto_explore/tasks_filtered/sft_policy.jsonl",
    "python rl_finetune.py --env=auto_explore --task_file=data/auto_explore/tasks_filtered/train.json "
    "--load_dir=results/123_supervised_pretrain/checkpoint-2000/ "
    "--reflectload_dir=results/124_supervised_pretrain/checkpoint-2000/ --save_steps=100 --shuffle_action=True "
    "--shrink_head --depth_curriculum --merge_first_two",
    "python -m visualization.plot",
    "python -m evaluation.evaluate --env=auto_explore --task_file=data/auto_explore/tasks_filtered/test.json "
    "--per_device_eval_batch_size=10 --eval_reps=100 --shrink_head",
    "python -m evaluation.auto_explore_gpt --task_file=data/auto_explore/tasks_filtered/test.json --eval_reps=10",
    "python -m evaluation.evaluate_gpt --scenario=alfworld --runs=100",
]


def _script_env(words: list[str]) -> str | None:
    module = words[2] if words[1] == "-m" else words[1].removesuffix(".py")
    return next((env for prefix, env in ENV_OF.items() if module.startswith(prefix)), None)


@pytest.mark.parametrize("command", PAPER_COMMANDS)
def test_the_papers_command_is_accepted(command):
    words = shlex.split(command)
    flags = words[3:] if words[1] == "-m" else words[2:]
    args = parse_args(flags, prog=words[1], env=_script_env(words))
    for flag in flags:  # every value given is the value used
        name, _, value = flag.removeprefix("--").partition("=")
        name = {"reflectload_dir": "reflect_load_dir", "scenario": "env"}.get(name, name)
        got = getattr(args, name)
        assert str(got) == value if value else got is True, flag


def test_the_papers_defaults_are_one_flag_away():
    paper = parse_args(["--preset=paper", "--env=taxi"])
    assert (paper.horizon, paper.per_device_eval_batch_size, paper.per_device_train_batch_size) == (15, 4, 1)
    assert paper.replay_mode == "separate" and paper.pg_normalize == "decisions" and not paper.mask_invalid


# --- the commands, run -----------------------------------------------------------------------

# Data steps whose writer defaults to an API model (gpt-4): the offline oracle writes instead.
WRITERS = (
    "data_gen.auto_explore.gen_task",
    "data_gen.auto_explore.reflection_negative",
    "data_gen.taxi.reflection",
    "data_gen.alfworld.reflection",
)
# The file (a pattern) each command must write, not empty, by script.
OUTPUTS = {
    "data_gen.auto_explore.filter_repo": "data/auto_explore/repos_filtered/*",
    "data_gen.auto_explore.gen_task": "data/auto_explore/tasks/data.json",
    "data_gen.auto_explore.filter_task": "data/auto_explore/tasks_filtered/data.json",
    "data_gen.auto_explore.reflection_negative": "data/auto_explore/tasks_filtered/data_reflection_negative.json",
    "data_gen.auto_explore.split_data": "data/auto_explore/tasks_filtered/test.json",
    "data_gen.auto_explore.gen_sft": "data/auto_explore/tasks_filtered/sft_policy.jsonl",
    "data_gen.taxi.reflection": "data/taxi/data_reflection.json",
    "data_gen.taxi.gen_sft": "data/taxi/sft_policy.jsonl",
    "data_gen.alfworld.reflection": "data/alfworld/data_reflection.json",
    "data_gen.alfworld.gen_sft": "data/alfworld/sft_policy.jsonl",
    "supervised_pretrain.py": "results/*_supervised_pretrain/checkpoint-*/adapter_model.safetensors",
    "rl_finetune.py": "results/*_rl_finetune/checkpoint-*/adapter_model.safetensors",
    "visualization.plot": "results/curves.png",
    "evaluation.evaluate": "results/*_evaluate/results.json",
    "evaluation.auto_explore_gpt": "results/*_auto_explore_gpt/results.json",
    "evaluation.evaluate_gpt": "results/*_evaluate_gpt/results.json",
}
# The checkpoints the paper's RL command loads, by the SFT data that trains them.
PAPER_CHECKPOINTS = {
    "sft_policy.jsonl": "results/123_supervised_pretrain/checkpoint-2000/",
    "sft_reflection.jsonl": "results/124_supervised_pretrain/checkpoint-2000/",
}


@pytest.mark.slow
@pytest.mark.alfworld
@pytest.mark.skipif(not (SHARED_DIR / "alfworld").is_dir(), reason="needs ../shared/alfworld")
def test_the_papers_commands_run_in_order(tmp_path, monkeypatch):
    """Every command of :data:`PAPER_COMMANDS`, in order, exactly as written, then appended flags:
    ``--api=oracle`` for the data steps whose writer defaults to an API model (:data:`WRITERS`), and
    tests/test_readme.py's small budgets (``OVERRIDES``: ``--model_name=tiny-gpt2 --max_steps=2``,
    ``--eval_reps=1``, ``--runs=1``, a few episodes, a short ``--horizon``). The last value of a flag
    wins, so the paper's ``--max_steps=2000`` trains 2 steps. Each command must exit 0 and write its
    file of :data:`OUTPUTS`, not empty.

    * They run in a copy of the repository (``copy_repository``), one after another in this process,
      each importing the project afresh (``project_from``, ``run_in_process``): what a new
      ``python`` process per command would do, less the seconds of importing torch each time.
    * ``filter_repo`` reads ``data/auto_explore/repos``: the two small repositories of
      tests/auto_explore_repos.py are put there (the paper's users bring their own).
    * The SFT runs write ``results/<id>_supervised_pretrain/checkpoint-2/``; each is linked as the
      ``checkpoint-2000/`` the paper's RL command names (``PAPER_CHECKPOINTS``), so that command
      runs as written.
    * ``visualization.plot`` names no run (the paper's users edit its ``expdirs``): it plots the newest
      RL run, the one the command before wrote.
    * The API evaluators keep their default ``--api openai``: ``--base_url`` points it at a local
      OpenAI-compatible test server (tests/openai_server.py), the key is a dummy.
    * ``$ALFWORLD_DATA`` is ``../shared/alfworld/fixtures``, the hand-made tomato→microwave game (a
      reset in 0.2 s; tests/test_readme.py plays the real games of the family).
    """
    work = copy_repository(tmp_path)
    build_repos(work / "data" / "auto_explore" / "repos")
    results = work / "results"
    monkeypatch.chdir(work)
    monkeypatch.setenv("REFLECTRL_CACHE", os.environ.get("REFLECTRL_CACHE", str(REPO / ".cache")))
    monkeypatch.setenv("ALFWORLD_DATA", str(SHARED_DIR / "alfworld" / "fixtures"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    appended = {
        target: (["--api=oracle"] if target in WRITERS else []) + OVERRIDES.get(target, []) for target in OUTPUTS
    }
    with OpenAIServer(lambda body: (200, "Action: 0")) as server, project_from(work):
        for command in PAPER_COMMANDS:
            words = shlex.split(command)
            target = _target(words[1:])
            argv = [*words, *appended[target]]
            if target in USES_API:
                argv.append(f"--base_url={server.url}")
            before = snapshot(work)
            assert run_in_process(argv, work) == 0, command
            written = [
                name
                for name, stat in snapshot(work).items()
                if before.get(name) != stat
                and fnmatch.fnmatch(name, OUTPUTS[target])
                and (work / name).is_file()
                and stat[0] > 0
            ]
            assert written, f"{command} wrote no {OUTPUTS[target]}"
            if target == "supervised_pretrain.py":
                checkpoint = _checkpoints(_latest(results, "supervised_pretrain"))[-1]
                paper = work / next(path for data, path in PAPER_CHECKPOINTS.items() if command.endswith(data))
                paper.parent.mkdir(parents=True)
                paper.symlink_to(checkpoint, target_is_directory=True)

