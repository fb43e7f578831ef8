"""AutoExplore as the registry sees it (``envs.ENVS``): how the flags become :class:`envs.auto_explore.AutoExploreEnv`'s
settings, its curriculum, the tasks of its held-out and validation panels and of ``envs.play``, its input checks,
its data steps and the instructions of an API model playing it."""

import logging
from pathlib import Path

from envs.auto_explore import AutoExploreEnv
from envs.auto_explore_tasks import (
    DEFAULT_PLAY_REPO,
    check_tasks,
    depth_curriculum,
    load_tasks,
    repo_task,
    run_tasks,
    task_depth,
)
from envs.curriculum import Curriculum, single_level
from envs.spec import EnvSettings, EnvSpec

logger = logging.getLogger(__name__)


def _settings(settings: EnvSettings, *, evaluation: bool, run_dir, split) -> dict:
    # Tasks name their repository relative to --repo_dir (the filtered repositories; None: the default).
    return {"leaveout_prob": 0.0 if evaluation else settings.leaveout_prob, "easy": settings.easy,
            "first_step": settings.first_step, "oracle_completion": settings.oracle_completion,
            "repos_dir": settings.repo_dir, "cost_rule": settings.auto_explore_costs,
            "sandbox_dir": settings.sandbox_dir, "view_tokens": settings.auto_explore_view_tokens}


def _curriculum(settings: EnvSettings, max_steps: int) -> Curriculum:
    tasks = run_tasks(settings)
    tasks = tasks[:settings.few_data] if settings.few_data else tasks
    if settings.depth_curriculum:
        return depth_curriculum(tasks, max_steps, settings.merge_first_two, settings.merge_after_first_k,
                                settings.curriculum_index)
    return single_level("all depths", [{"task": t} for t in tasks], max_steps)


def _inputs(settings: EnvSettings, *, evaluation: bool) -> None:
    """Training's or evaluation's task file, and the validation panel's (RL with --eval_steps): the tasks they
    leave to play, and every task's repository folder and files (by its index in the file)."""
    panel = not evaluation and settings.eval_steps and settings.validation_task_file
    for flag in ("task_file", "validation_task_file") if panel else ("task_file",):
        path = getattr(settings, flag)
        check_tasks(load_tasks(path, whole_records=True, flag=f"--{flag}"), settings.repo_dir, f"--{flag}", path)
        run_tasks(settings, flag)


def _held_out(settings: EnvSettings, env) -> list[tuple[dict, str]]:
    """Every task of ``--task_file``, each at its depth."""
    return _at_depths(run_tasks(settings))


def _validation(settings: EnvSettings, env) -> list[tuple[dict, str]]:
    """Every task of ``--validation_task_file``; without it, those of ``--task_file`` (in RL, the training
    tasks, at validation seeds), with a warning."""
    if not settings.validation_task_file:
        logger.warning("the validation panel plays the tasks of --task_file %s (give --validation_task_file, "
                       "e.g. the split's validate.json, for tasks apart from training's)", settings.task_file)
        return _held_out(settings, env)
    return _at_depths(run_tasks(settings, "validation_task_file"))


def _at_depths(tasks: list[dict]) -> list[tuple[dict, str]]:
    """Each task's reset options and level: its depth."""
    return [({"task": task}, f"depth {task_depth(task)}") for task in tasks]


def _play_options(settings: EnvSettings, rng) -> dict:
    """A task of ``--task_file``, or else a 'Find <file>' task in ``--repo_dir`` (default: data_gen/)."""
    if settings.task_file:
        tasks = load_tasks(settings.task_file)
        return {"task": tasks[int(rng.integers(len(tasks)))]}
    return {"task": repo_task(Path(settings.repo_dir) if settings.repo_dir else DEFAULT_PLAY_REPO, rng)}


# The system message of an API model playing it (evaluation.gpt_agent).
API_INSTRUCTIONS = (
    "You explore a software repository to find the one file that answers a user's question. 'cd DIR' "
    "enters a folder, 'cd ..' goes to the parent folder, 'cat FILE' shows a file, 'id FILE' identifies "
    "FILE as the answer and ends the search (a wrong file fails). Every command costs a step: move "
    "towards the answer directly, read a file before identifying it."
)


SPEC = EnvSpec(
    name="auto_explore", make=AutoExploreEnv, settings=_settings, curriculum=_curriculum, held_out=_held_out,
    validation=_validation, play_options=_play_options, inputs=_inputs,
    data_steps=("data_gen.auto_explore.collect_repos", "data_gen.auto_explore.filter_repo",
                "data_gen.auto_explore.gen_task", "data_gen.auto_explore.filter_task",
                "data_gen.auto_explore.reflection_negative", "data_gen.auto_explore.split_data",
                "data_gen.auto_explore.gen_sft"),
    own_flags=("easy", "sandbox_dir", "validation_task_file", "auto_explore_view_tokens", "auto_explore_costs",
               "auto_explore_targets", "leaveout_prob", "repo_dir", "negatives_at", "sft_positives", "holdout_repo"),
    exclusive_flags=("depth_curriculum", "first_step", "oracle_completion", "few_data"),
    api_instructions=API_INSTRUCTIONS, api_evaluator="evaluation.auto_explore_gpt",
)
