"""The paper's README commands, as its users type them, are accepted by our scripts unchanged.

Each is parsed by the script's own flag set (with the script's environment default, as its
``__main__`` does); the pipeline they form is run end to end by tests/test_readme.py through
our README, whose commands are these with `--api=oracle` (offline) and our placeholders.
"""

import shlex

import pytest

from experiment_args import parse_args

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
