"""Checkpoints know what they are (role.json: policy or reflector, made by SFT or RL), and every loader checks
it, with the settings of what the policy reads, before a run folder is made (issue 31, defects 2 and 3)."""

import json
import logging

import pytest

import rl_finetune
import supervised_pretrain as sft
from evaluation import evaluate
from experiment_args import ScriptArguments, run_script
from prompts import policy_sft_text, reflection_sft_text
from utils import checkpoints, models
from utils.checkpoint_checks import CheckSettings, check_checkpoint, checkpoint_problems
from utils.checkpoints import POLICY, REFLECTOR, RL_POLICY, SFT, CheckpointRole

HEAD = "The actions you can take now is:"
OBS = f"--- Current State ---\n+---+\n|T P|\n+---+\n{HEAD}\n0. Move south\n1. Move north\n"
SFT_POLICY, SFT_REFLECTOR = CheckpointRole(POLICY, SFT), CheckpointRole(REFLECTOR, SFT)


def _checks(**flags) -> CheckSettings:
    """What a run of the tiny model with ``flags`` checks a checkpoint against."""
    return CheckSettings.from_args(ScriptArguments(model_name="tiny-gpt2", **flags))


def role_checkpoint(folder, role: CheckpointRole | None, **settings) -> str:
    """A tiny-gpt2 checkpoint saved as ``role`` (None: without role.json, as before they were written) by a
    run of ``settings`` (Taxi by default)."""
    args = ScriptArguments(**{"model_name": "tiny-gpt2", "env": "taxi", **settings})
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args))
    checkpoints.save_checkpoint(folder, model=model, tokenizer=tokenizer, args=args, step=1, role=role)
    if role is None:
        (folder / checkpoints.ROLE_FILE).unlink()
    return str(folder)


def one_line_exit(monkeypatch, capsys, main, prog: str, argv: list[str]) -> str:
    """Run an entry point as its command line does; it must stop with status 2 and one line: returned."""
    monkeypatch.setattr("sys.argv", [prog, *argv])
    assert run_script(main, prog) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"{prog}: error: ")
    return line


def _runs(root) -> list:
    return checkpoints.run_dirs(root)


# --- what a checkpoint is ------------------------------------------------------------------------

def test_sft_records_what_its_data_trains(tmp_path):
    reflections = [reflection_sft_text(OBS, HEAD, "The passenger is east.")] * 4
    policies = [policy_sft_text(OBS, HEAD, "1")] * 4
    for texts, role in ((reflections, SFT_REFLECTOR), (policies, SFT_POLICY)):
        data = tmp_path / f"{role.role}.jsonl"
        data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        args = ScriptArguments(model_name="tiny-gpt2", task_file=str(data), max_steps=1, save_steps=1,
                               ckpt_path=str(tmp_path / role.role))
        assert sft.main(args) == 0
        (run,) = _runs(tmp_path / role.role)
        assert json.loads((run / "checkpoint-1" / checkpoints.ROLE_FILE).read_text()) == {"role": role.role,
                                                                                           "stage": SFT}
        assert checkpoints.read_role(run / "checkpoint-1") == role
    assert checkpoints.sft_role(reflections + policies).role == "policy+reflector"


def test_rl_checkpoints_are_rl_policies(tmp_path):
    args = ScriptArguments(model_name="tiny-gpt2")
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args))
    checkpoints.save_checkpoint(tmp_path / "c", model=model, tokenizer=tokenizer, args=args, step=1)  # RL's call
    assert checkpoints.read_role(tmp_path / "c") == RL_POLICY
    (tmp_path / "c" / checkpoints.ROLE_FILE).unlink()  # as before role.json: our trainer state says RL
    assert checkpoints.read_role(tmp_path / "c") == RL_POLICY


def test_old_checkpoints_roles_are_inferred_from_their_run(tmp_path, caplog):
    data = tmp_path / "sft_custom_name.jsonl"
    data.write_text(json.dumps({"text": reflection_sft_text(OBS, HEAD, "Go east.")}) + "\n")
    by_data = role_checkpoint(tmp_path / "3_supervised_pretrain" / "checkpoint-5", None, task_file=str(data))
    by_flag = role_checkpoint(tmp_path / "4_supervised_pretrain" / "checkpoint-5", None, reflect=False)
    by_folder = role_checkpoint(tmp_path / "5_rl_finetune" / "checkpoint-5", None)
    assert checkpoints.read_role(by_data) == SFT_REFLECTOR
    assert checkpoints.read_role(by_flag) == SFT_POLICY
    assert checkpoints.read_role(by_folder) == RL_POLICY
    # a bare adapter (no role.json, no run): not checked, said once however often it is checked
    bare = tmp_path / "bare"
    tiny = models.ModelSettings.from_args(ScriptArguments(model_name="tiny-gpt2"))
    models.load_model_and_tokenizer(tiny)[0].save_pretrained(bare)
    assert checkpoints.read_role(bare) is None
    checks = _checks(env="taxi")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            check_checkpoint(checks, bare, POLICY, "--load_dir")
    said = [r.getMessage() for r in caplog.records if "role.json" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"--load_dir {str(bare)!r} has no role.json")


# --- swapped roles, missing and empty folders: one line, exit 2, no run folder ----------------------

@pytest.fixture(scope="module")
def players(tmp_path_factory):
    base = tmp_path_factory.mktemp("players")
    return {"policy": role_checkpoint(base / "policy", SFT_POLICY),
            "reflector": role_checkpoint(base / "reflector", SFT_REFLECTOR)}


RL_FLAGS = ["--model_name=tiny-gpt2", "--env=taxi", "--taxi_curriculum", "--curriculum_index=0", "--max_steps=1",
            "--per_device_eval_batch_size=2", "--reflect_max_new_tokens=4"]
EVAL_FLAGS = ["--model_name=tiny-gpt2", "--env=taxi", "--taxi_curriculum", "--curriculum_index=0", "--eval_reps=1",
              "--per_device_eval_batch_size=2", "--reflect_max_new_tokens=4"]
SCRIPTS = {"rl": (rl_finetune.main, "rl_finetune.py", RL_FLAGS),
           "evaluate": (evaluate.main, evaluate.PROG, EVAL_FLAGS)}


@pytest.mark.parametrize("script", ["rl", "evaluate"])
@pytest.mark.parametrize("flag, given, actual", [("--load_dir", "reflector", "an SFT reflector checkpoint, not a policy"),
                                                 ("--reflect_load_dir", "policy", "an SFT policy checkpoint, not a reflector")])
def test_swapped_roles_are_refused(script, flag, given, actual, players, tmp_path, monkeypatch, capsys):
    main, prog, flags = SCRIPTS[script]
    other = {"--load_dir": "--reflect_load_dir", "--reflect_load_dir": "--load_dir"}[flag]
    argv = [*flags, f"--ckpt_path={tmp_path / 'results'}", f"{flag}={players[given]}", f"{other}={players[given]}"]
    line = one_line_exit(monkeypatch, capsys, main, prog, argv)
    assert f"{flag} {players[given]!r} is {actual}" in line
    assert not _runs(tmp_path / "results")


@pytest.mark.parametrize("script", ["rl", "evaluate"])
@pytest.mark.parametrize("flag", ["--load_dir", "--reflect_load_dir"])
@pytest.mark.parametrize("case, says", [("missing", "does not exist"), ("empty", "is an empty folder"),
                                        ("a file", "is a file, not a checkpoint folder")])
def test_missing_or_empty_checkpoint_folders_are_one_line(script, flag, case, says, players, tmp_path, monkeypatch,
                                                          capsys):
    main, prog, flags = SCRIPTS[script]
    folder = tmp_path / "there"
    if case == "empty":
        folder.mkdir()
    elif case == "a file":
        folder.write_text("not a checkpoint\n")
    good = {"--load_dir": f"--reflect_load_dir={players['reflector']}", "--reflect_load_dir":
            f"--load_dir={players['policy']}"}[flag]
    line = one_line_exit(monkeypatch, capsys, main, prog,
                         [*flags, f"--ckpt_path={tmp_path / 'results'}", good, f"{flag}={folder}"])
    assert line.endswith(f"{flag} {str(folder)!r} {says}")
    assert not _runs(tmp_path / "results") and not (tmp_path / "results" / ".progress").exists()


def test_a_run_folder_given_as_a_checkpoint_names_its_newest(players, tmp_path):
    run = tmp_path / "7_supervised_pretrain"
    for step in (5, 10):
        role_checkpoint(run / f"checkpoint-{step}", SFT_POLICY)
    errors, _ = checkpoint_problems(_checks(env="taxi"), run, POLICY)
    assert errors == [f"is a run folder, not a checkpoint: give one of its checkpoints, e.g. the newest whole one, "
                      f"{run / 'checkpoint-10'}"]


# --- the settings of what the policy reads -------------------------------------------------------

def test_taxi_checkpoint_of_other_reading_settings_warns_naming_both_values(players, tmp_path, monkeypatch,
                                                                             capsys, caplog):
    """The issue's case: trained with --with_history --with_prompt --horizon 10, evaluated without them."""
    trained = role_checkpoint(tmp_path / "12_rl_finetune" / "checkpoint-3", RL_POLICY, with_history=True,
                              with_prompt=True, horizon=10)
    monkeypatch.setattr("sys.argv", [evaluate.PROG, *EVAL_FLAGS, f"--ckpt_path={tmp_path / 'results'}",
                                     f"--load_dir={trained}"])
    with caplog.at_level(logging.WARNING):
        assert run_script(evaluate.main, evaluate.PROG) == 0
    (warning,) = [r.getMessage() for r in caplog.records if "there" in r.getMessage()]
    assert warning.startswith(f"--load_dir {trained!r} was trained with other settings of what it reads")
    for both in ("--horizon=10 there, None here", "--with_prompt=True there, False here",
                 "--with_history=True there, False here"):
        assert both in warning
    capsys.readouterr()


def test_another_env_or_text_layout_is_an_error_and_sft_settings_are_not_compared(players, tmp_path):
    trained = role_checkpoint(tmp_path / "c", RL_POLICY, text_layout="paper")
    errors, warnings = checkpoint_problems(_checks(env="alfworld"), trained, POLICY)
    assert errors == ["was trained reading another environment or text layout: --env='taxi' there, 'alfworld' "
                      "here; --text_layout='paper' there, 'ours' here"] and warnings == []
    # SFT reads a data file: the environment flags in its setting.yml are not those of its data
    sft_policy = role_checkpoint(tmp_path / "s", SFT_POLICY, with_history=True, env="auto_explore")
    assert checkpoint_problems(_checks(env="taxi"), sft_policy, POLICY) == ([], [])


def test_a_reflector_is_compared_with_its_own_base_model(players):
    checks = _checks(env="taxi", reflect_model_name="gpt2")
    errors, warnings = checkpoint_problems(checks, players["reflector"], REFLECTOR)
    assert errors == [] and warnings == ["was trained on --model_name='tiny-gpt2', and is loaded here on 'gpt2'"]
    assert checkpoint_problems(checks, players["policy"], POLICY) == ([], [])
