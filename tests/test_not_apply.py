"""Issue 31, defect 5: flags that do not apply were ignored without the promised warning. The warning now
covers every flag that can be given without effect, from one table (``utils.arg_fields.applicability``:
each field's ``only_with``, each environment's ``own_flags``), and says nothing of a flag that applies."""

import dataclasses
import logging

import pytest

from envs import ENVS
from experiment_args import ScriptArguments, parse_args
from utils.arg_fields import ONLY_WITH, applicability

RL, SFT, EVAL = "rl_finetune.py", "supervised_pretrain.py", "python -m evaluation.evaluate"
WARNING = "these settings do not apply to this run and are ignored"


@pytest.fixture(autouse=True)
def _cuda(monkeypatch):
    monkeypatch.setattr("experiment_args._cuda_available", lambda: True)  # no CPU-fallback warning beside


def warned(caplog, argv: list[str], prog: str | None = RL, env: str | None = None) -> str:
    """The "does not apply" warning of parsing ``argv`` for ``prog`` ('' if none)."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="experiment_args"):
        parse_args(argv, prog=prog, env=env)
    found = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert len(found) <= 1  # one warning, naming them all
    return found[0] if found else ""


@pytest.mark.parametrize("flag, name", [("--lora_r=8", "peft_lora_r"), ("--lora_alpha=8", "peft_lora_alpha"),
                                        ("--lora_dropout=0.2", "lora_dropout"),
                                        ("--lora_target_modules=c_attn", "lora_target_modules")])
def test_lora_flags_without_peft_are_reported(caplog, flag, name):
    assert f"--{name} (only with --use_peft and without --load_dir" in warned(caplog, [flag, "--no_use_peft"])
    assert f"--{name} (only with --use_peft" in warned(caplog, [flag, "--load_dir=x"])  # the adapter's own shape
    assert warned(caplog, [flag]) == ""


@pytest.mark.parametrize("flag", ["--eval_panel=5", "--validation_task_file=v.json"])
def test_panel_flags_without_eval_steps_are_reported(caplog, flag):
    assert f"{flag.split('=')[0]} (only with --eval_steps" in warned(caplog, [flag])
    assert warned(caplog, [flag, "--eval_steps=5"]) == ""


@pytest.mark.parametrize("flag", ["--reflect_max_new_tokens=5", "--top_k=3", "--top_p=0.5", "--reflect_prob=0.5",
                                  "--no_reflect_one_line", "--reflect_model_name=tiny-gpt2"])
def test_reflection_flags_without_a_reflector_are_reported(caplog, flag):
    name = flag.split("=")[0].replace("--no_", "--")
    assert f"{name} (only with a reflector" in warned(caplog, [flag])
    assert warned(caplog, [flag, "--reflect_load_dir=r"]) == ""
    assert warned(caplog, [flag, "--reflect"]) == ""
    assert "a reflector" in warned(caplog, [flag], prog=EVAL)
    assert warned(caplog, [flag, "--eval_load_list=l.yaml"], prog=EVAL) == ""  # the list's entries may reflect
    assert warned(caplog, [flag], prog=None) == ""  # a caller that does not say which script: not judged


def test_eval_levels_in_rl_without_eval_steps_is_reported(caplog):
    argv = ["--eval_levels", "depth 1"]
    assert "--eval_levels (only with --eval_steps" in warned(caplog, argv)
    assert warned(caplog, [*argv, "--eval_steps=5"]) == ""
    assert warned(caplog, argv, prog=EVAL) == ""  # evaluation plays only those levels


def test_load_dir_with_an_evaluation_list_is_reported(caplog):
    assert "--load_dir (only with an evaluation without --eval_load_list" in warned(
        caplog, ["--load_dir=x", "--eval_load_list=l.yaml"], prog=EVAL)
    assert warned(caplog, ["--load_dir=x"], prog=EVAL) == ""


def test_flags_of_another_script_are_reported(caplog):
    assert "--logging_steps (only with SFT" in warned(caplog, ["--logging_steps=3"])
    assert warned(caplog, ["--logging_steps=3"], prog=SFT) == ""
    assert "--eval_steps (only with RL" in warned(caplog, ["--eval_steps=3"], prog=SFT)
    assert "--eval_reps (only with evaluation" in warned(caplog, ["--eval_reps=3"])
    assert "--max_steps (only with no --num_train_epochs)" in warned(caplog, ["--max_steps=5", "--num_train_epochs=1"],
                                                                     prog=SFT)


def test_settings_of_other_environments_and_writers_are_reported(caplog):
    message = warned(caplog, ["--env=taxi", "--alfworld_split=valid", "--leaveout_prob=0.1", "--pickup_reward=add"])
    assert "--alfworld_split (only with --env alfworld)" in message
    assert "--leaveout_prob (only with --env auto_explore)" in message and "pickup_reward" not in message
    assert "--llm_cache (only with --api openai, azure or local)" in warned(caplog, ["--api=oracle", "--llm_cache=c"],
                                                                            prog="python -m data_gen.taxi.reflection",
                                                                            env="taxi")
    assert "--critic_update_freq (only with --baseline critic)" in warned(caplog, ["--critic_update_freq=5"])
    assert warned(caplog, ["--critic_update_freq=5", "--use_critic"]) == ""


def test_defaults_and_a_presets_own_values_say_nothing(caplog):
    for prog in (RL, SFT, EVAL, None):
        assert warned(caplog, [], prog=prog) == ""
        assert warned(caplog, ["--preset=paper"], prog=prog) == ""


def test_every_condition_is_declared_once_and_can_be_asked(caplog):
    fields = dataclasses.fields(ScriptArguments)
    table = applicability(fields, ENVS)
    args = ScriptArguments()
    for flag, conditions in table.items():
        for condition in conditions:
            assert isinstance(condition.holds(args), bool), flag
    declared = {f.name for f in fields if ONLY_WITH in f.metadata}
    owned = {flag for spec in ENVS.values() for flag in spec.own_flags}
    assert set(table) == declared | owned  # nothing else feeds the warning
    assert {"peft_lora_r", "eval_panel", "reflect_max_new_tokens", "eval_levels", "load_dir", "warmup_ratio"} <= set(table)


@pytest.mark.parametrize("flag", ["--alfworld_data=games", "--repo_dir=repos"])
def test_a_script_playing_every_environment_reads_their_flags_without_env(caplog, flag):
    """``benchmarks.env_speed`` plays Taxi, AutoExplore and ALFWorld whatever --env says, and reads
    --alfworld_data and --repo_dir: it used to warn that the one it was given was ignored."""
    name = flag.split("=")[0]
    assert warned(caplog, [flag], prog="python -m benchmarks.env_speed") == ""
    assert warned(caplog, [flag, "--env=taxi"], prog="python -m benchmarks.env_speed") == ""
    assert f"{name} (only with --env" in warned(caplog, [flag, "--env=taxi"])  # RL on Taxi does not read them
    assert f"{name} (only with --env" in warned(caplog, [flag, "--env=taxi"], prog="python -m benchmarks.enumeration")


def test_the_step_that_writes_the_repositories_reports_repo_dir(caplog):
    """collect_repos writes to --output_dir: a --repo_dir given to it was ignored without a word."""
    collect = "python -m data_gen.auto_explore.collect_repos"
    assert "--repo_dir (only with a step that reads repositories; collect_repos writes them to --output_dir)" in \
        warned(caplog, ["--repo_dir=repos"], prog=collect)
    assert warned(caplog, ["--output_dir=repos"], prog=collect) == ""
    assert warned(caplog, ["--repo_dir=repos"], prog="python -m data_gen.auto_explore.filter_repo") == ""
