"""ScriptArguments: defaults, YAML vs CLI precedence, validation, the CPU fallback."""

import logging
import os
import subprocess
import sys

import pytest

from experiment_args import ScriptArguments, parse_args
from tests.conftest import REPO


def test_defaults_follow_the_paper():
    args = ScriptArguments()
    assert args.model_name == "gpt2-xl"
    assert (args.peft_lora_r, args.peft_lora_alpha, args.lora_dropout) == (64, 16, 0.1)
    # the paper's warmup_ratio 0.03 did nothing under its constant schedule; 0.0 says so
    assert (args.learning_rate, args.lr_scheduler_type, args.warmup_ratio) == (2e-4, "constant", 0.0)
    assert (args.max_grad_norm, args.max_seq_length, args.weight_decay) == (0.3, 1024, 0.001)
    assert (args.trainer, args.baseline, args.replay_buffer_size) == ("pg", "none", 50)
    assert (args.ppo_clip, args.ppo_epochs, args.temperature) == (0.1, 3, 1.0)
    assert args.reflect_max_new_tokens == 100 and args.merge_after_first_k == 3
    assert args.api == "openai" and args.model == "gpt-4" and args.base_url is None  # each --api has its default
    assert args.max_concurrency == 8


def test_paper_readme_flags_parse():
    args = parse_args([
        "--env=auto_explore", "--task_file=data/auto_explore/tasks_filtered/train.json",
        "--load_dir=results/123_supervised_pretrain/checkpoint-2000/",
        "--reflectload_dir=results/124_supervised_pretrain/checkpoint-2000/",
        "--save_steps=100", "--shuffle_action=True", "--shrink_head", "--depth_curriculum", "--merge_first_two",
        "--per_device_eval_batch_size=10", "--eval_reps=100", "--max_steps=2000",
    ])
    assert args.reflect_load_dir == "results/124_supervised_pretrain/checkpoint-2000/"
    assert args.shuffle_action and args.shrink_head and args.depth_curriculum and args.merge_first_two
    assert args.use_reflection
    assert (args.per_device_eval_batch_size, args.eval_reps, args.save_steps) == (10, 100, 100)


def test_yaml_config_is_overridden_by_cli(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("learning_rate: 1.0e-3\nmax_steps: 7\nshrink_head: true\nenv: taxi\n"
                      "lora_target_modules: [c_attn, c_proj]\n")
    args = parse_args([f"--config={config}", "--max_steps=9"])
    assert args.learning_rate == 1e-3 and args.shrink_head and args.env == "taxi"
    assert args.max_steps == 9
    assert args.lora_target_modules == ["c_attn", "c_proj"]
    assert parse_args(["--max_steps=3", "--config", str(config)]).max_steps == 3


def test_yaml_unknown_key_is_an_error(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("learning_rate: 0.1\nlearnin_rate: 0.2\n")
    with pytest.raises(SystemExit):
        parse_args([f"--config={config}"])
    err = capsys.readouterr().err
    assert "learnin_rate" in err and str(config) in err
    assert "has unknown keys ['learnin_rate'] ('learnin_rate': did you mean 'learning_rate'?)" in err


def test_missing_config_file_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args([f"--config={tmp_path / 'nope.yaml'}"])
    assert "nope.yaml" in capsys.readouterr().err


def _error_line(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1].partition(" error: ")[2]


@pytest.mark.parametrize("content, says", [
    ("max_steps: lots", "max_steps: 'lots' is not an integer"),
    ("learning_rate: fast", "learning_rate: 'fast' is not a number"),
    ("shrink_head: maybe", "shrink_head: 'maybe' is not true or false"),
    ("curriculum_steps: [3, x]", "curriculum_steps: 'x' is not an integer"),
    ("max_steps: [1, 2]", "max_steps: [1, 2] is a list; it takes one value"),
    ("text_layout: theirs", "text_layout: 'theirs' is not one of ('ours', 'paper')"),
    ("max_steps: 0", "max_steps: must be >= 1, got 0"),  # a settings check (__post_init__)
    ("trainer: nonsense", "trainer: 'nonsense' is not one of ("),
])
def test_a_bad_value_of_a_settings_file_names_the_file_and_the_key(content, says, tmp_path, capsys):
    """A --config or --resume_from setting.yml value that failed its check was said as the flag's (--max_steps),
    not naming the file: it names the file and the key now; an explicit flag keeps its message, and its value wins
    over a file's bad one, which is then not checked."""
    config = tmp_path / "a.yaml"
    config.write_text(content + "\n")
    assert _error_line(capsys, [f"--config={config}"]).startswith(f"--config: {config}: {says}")
    checkpoint = tmp_path / "run" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "setting.yml").write_text(content + "\n")
    assert _error_line(capsys, [f"--resume_from={checkpoint}"]).startswith(
        f"--resume_from: {checkpoint}/setting.yml: {says}")
    key = content.partition(":")[0]
    good = {"max_steps": "5", "learning_rate": "0.1", "shrink_head": "true", "text_layout": "paper",
            "trainer": "ppo"}.get(key)
    if good is not None:  # (curriculum_steps needs a curriculum too)
        assert str(getattr(parse_args([f"--config={config}", f"--{key}", good]), key)).lower() == good


def test_a_bad_value_of_a_flag_keeps_its_message(capsys):
    assert _error_line(capsys, ["--max_steps", "lots"]) == "argument --max_steps/--max-steps: invalid int value: 'lots'"
    assert _error_line(capsys, ["--max_steps=0"]) == "--max_steps: must be >= 1, got 0"


@pytest.mark.parametrize(
    "overrides, flag",
    [
        ({"env": "chess"}, "--env"),
        ({"trainer": "dqn"}, "--trainer"),
        ({"baseline": "median"}, "--baseline"),
        ({"api": "bard"}, "--api"),
        ({"load_in_8bit": True, "load_in_4bit": True}, "--load_in_4bit"),
        ({"bf16": True, "fp16": True}, "--fp16"),
        ({"peft_lora_r": 0}, "--peft_lora_r"),
        ({"lora_dropout": 1.0}, "--lora_dropout"),
        ({"max_seq_length": 4}, "--max_seq_length"),
        ({"learning_rate": 0.0}, "--learning_rate"),
        ({"weight_decay": -1.0}, "--weight_decay"),
        ({"max_grad_norm": 0.0}, "--max_grad_norm"),
        ({"warmup_ratio": 1.5}, "--warmup_ratio"),
        ({"max_steps": 0}, "--max_steps"),
        ({"per_device_eval_batch_size": 0}, "--per_device_eval_batch_size"),
        ({"per_device_train_batch_size": 0}, "--per_device_train_batch_size"),
        ({"eval_reps": 0}, "--eval_reps"),
        ({"save_steps": 0}, "--save_steps"),
        ({"ppo_epochs": 0}, "--ppo_epochs"),
        ({"reflect_max_new_tokens": 0}, "--reflect_max_new_tokens"),
        ({"horizon": 0}, "--horizon"),
        ({"leaveout_prob": 1.2}, "--leaveout_prob"),
        ({"reflect_prob": -0.1}, "--reflect_prob"),
        ({"random_prob": 1.5}, "--random_prob"),
        ({"temperature": 0.0}, "--temperature"),
        ({"top_p": 0.0}, "--top_p"),
        ({"top_p": 1.5}, "--top_p"),
        ({"top_k": -1}, "--top_k"),
        ({"replay_buffer_size": -1}, "--replay_buffer_size"),
        ({"replay_batch_size": -1}, "--replay_batch_size"),
        ({"ppo_clip": 0.0}, "--ppo_clip"),
        ({"refuel_eta": 0.0}, "--refuel_eta"),
        ({"alfworld_timeout": 0.0}, "--alfworld_timeout"),
        ({"env": "auto_explore", "taxi_curriculum": True}, "--taxi_curriculum"),
        ({"env": "taxi", "depth_curriculum": True}, "--depth_curriculum"),
        ({"merge_first_two": True}, "--merge_first_two"),
        ({"curriculum_index": 0}, "--curriculum_index"),
        ({"env": "taxi", "taxi_curriculum": True, "curriculum_index": 3}, "--curriculum_index"),
        ({"depth_curriculum": True, "curriculum_index": -1}, "--curriculum_index"),
        ({"merge_after_first_k": 0}, "--merge_after_first_k"),
        ({"env": "alfworld", "first_step": True}, "--first_step"),
        ({"trainer": "refuel", "baseline": "mean"}, "--baseline"),
        ({"base_url": "localhost:1234"}, "--base_url"),
        ({"seed": -1}, r"--seed: must be in \[0, 2\*\*32 - 1\], got -1"),  # NumPy's global generator takes no other
        ({"seed": 2**32}, "--seed"),
    ],
)
def test_validation_errors_name_the_flag(overrides, flag):
    with pytest.raises(ValueError, match=flag):
        ScriptArguments(**overrides)


def test_cli_validation_error_is_a_clean_exit(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--temperature=0"])
    assert exit_info.value.code == 2
    assert "--temperature: must be > 0" in capsys.readouterr().err


def test_gpu_defaults_fall_back_on_cpu_with_one_warning(caplog, monkeypatch):
    monkeypatch.setattr("experiment_args._cuda_available", lambda: False)
    with caplog.at_level(logging.WARNING, logger="experiment_args"):
        args = ScriptArguments()
        assert not caplog.records  # steps that only call an API never load a model: nothing to say
        args.report_cpu_fallback()  # the model loader says it
        args.report_cpu_fallback()
    assert not (args.load_in_8bit or args.load_in_4bit or args.bf16 or args.fp16)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "--load_in_8bit" in warnings[0].getMessage() and "--bf16" in warnings[0].getMessage()


def test_gpu_defaults_kept_with_cuda(monkeypatch):
    monkeypatch.setattr("experiment_args._cuda_available", lambda: True)
    args = ScriptArguments()
    assert args.load_in_8bit and args.bf16


def test_reflection_switch():
    assert not ScriptArguments().use_reflection
    assert ScriptArguments(reflect_load_dir="r").use_reflection
    assert not ScriptArguments(reflect_load_dir="r", reflect=False).use_reflection
    assert parse_args(["--reflect"]).reflect is True


@pytest.mark.parametrize("script", ["supervised_pretrain.py", "rl_finetune.py"])
def test_help_lists_flags_with_help(script):
    out = subprocess.run([sys.executable, str(REPO / script), "--help"], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    for flag in ("--model_name", "--load_dir", "--reflect_model_name", "--reflect_load_dir", "--ckpt_path",
                 "--max_steps", "--save_steps", "--task_file", "--env", "--trainer", "--shrink_head",
                 "--shuffle_action", "--depth_curriculum", "--merge_first_two", "--taxi_curriculum",
                 "--per_device_eval_batch_size", "--eval_reps", "--seed", "--config"):
        assert flag in out, flag
    assert "Adam learning rate" in out and "reinforcement learning:" in out
    assert "a .gguf file" in out


def test_a_negated_flag_says_what_it_turns_off():
    """transformers' ``--no_X`` repeats X's help with "(default: False)", as if X were off; ours names X and
    says it is on by default, and the two still set one setting."""
    import argparse

    from experiment_args import build_parser

    parser = build_parser("rl_finetune.py")
    negations = [a for a in parser._actions if isinstance(a, argparse._StoreFalseAction)]
    assert {a.dest for a in negations} >= {"use_peft", "bf16", "reflection_memo", "prefix_cache"}
    for action in negations:
        assert action.help == f"Turn --{action.dest} off (it is on by default).", action.help
        assert parser.get_default(action.dest) is True
    assert parse_args([]).use_peft is True and parse_args(["--no_use_peft"]).use_peft is False
    assert parse_args(["--no-use-peft", "--use_peft"]).use_peft is True  # the last one given wins


def test_a_script_for_one_env_takes_its_curriculum_flags(capsys):
    args = parse_args(["--taxi_curriculum", "--curriculum_index=1"], prog="data_gen.taxi.reflection", env="taxi")
    assert args.env == "taxi" and args.curriculum_index == 1
    with pytest.raises(SystemExit):
        parse_args(["--env=alfworld"], prog="data_gen.taxi.reflection", env="taxi")
    assert "--env: data_gen.taxi.reflection works on --env=taxi only, got alfworld" in capsys.readouterr().err


def test_unknown_trainer_lists_the_registered_learners():
    with pytest.raises(ValueError, match=r"--trainer: 'a2c' is not one of \('pg', 'ppo', 'refuel', 'rloo', 'grpo', "
                                         r"'gigpo'\)"):
        ScriptArguments(trainer="a2c")


def test_settings_that_cannot_apply_get_one_warning_naming_them(caplog, monkeypatch):
    monkeypatch.setattr("experiment_args._cuda_available", lambda: True)
    with caplog.at_level(logging.WARNING):
        ScriptArguments(trainer="ppo", replay_batch_size=9, refuel_eta=2.0, ppo_clip=0.3)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "--replay_batch_size (only with --trainer pg, rloo, grpo or gigpo)" in warning
    assert "--refuel_eta (only with --trainer refuel)" in warning and "ppo_clip" not in warning
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ScriptArguments(warmup_ratio=0.1)
    assert ["these settings do not apply to this run and are ignored: --warmup_ratio (only with an "
            "--lr_scheduler_type with warm-up, e.g. constant_with_warmup)"] == [
        r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_no_script_changes_a_setting_after_parsing():
    """Settings are parsed and validated once: no module assigns to ``args`` afterwards."""
    import re

    assignment = re.compile(r"\bargs\.\w+\s*(,\s*args\.\w+\s*)*=[^=]|setattr\(\s*args\b")
    offenders = [f"{path.relative_to(REPO)}:{number}" for path in REPO.rglob("*.py")
                 if not {".venv", "tests", "build", ".cache"} & set(path.relative_to(REPO).parts)
                 for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if assignment.search(line)]
    assert offenders == []


def test_a_command_that_trains_nothing_starts_without_torch():
    """Parsing the flags needs the learners' names, not the learners, and whether a GPU is seen, which the
    installed torch's build and the CUDA driver tell: ``envs.play`` and the data generators that play with an
    oracle or an API model start without importing torch (2.5 s of a 4 s start here; 3.5 s of 5 on an H200),
    with a GPU seen or hidden. SFT imports torch and transformers' Trainer once its flags are parsed, so its
    ``--help`` or a mistyped flag answers in 2.5 s, not 12.5. On a ROCm build torch is asked."""
    import torch

    code = ("import sys\n"
            "import envs.play, data_gen.taxi.reflection, data_gen.auto_explore.gen_task, supervised_pretrain\n"
            "from experiment_args import parse_args\n"
            "args = parse_args(['--trainer=grpo', '--group_size=2'], prog='rl_finetune.py')\n"
            "print('torch' in sys.modules, args.bf16)")
    for hidden in ({}, {"CUDA_VISIBLE_DEVICES": ""}):
        result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600,
                                env=os.environ | hidden)
        gpu = torch.cuda.is_available() and not hidden
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.split() == [str(bool(torch.version.hip)), str(gpu)], (hidden, result.stderr[-2000:])

    import rl_algorithms
    from rl_algorithms import LEARNERS, Learner

    assert all(issubclass(LEARNERS[name], Learner) for name in LEARNERS) and len(LEARNERS) == 6
    assert all(getattr(rl_algorithms, name) is not None for name in rl_algorithms.__all__)  # each found where it lives


def test_whether_a_gpu_is_seen_is_known_without_torch_from_its_build_and_the_driver(tmp_path, monkeypatch):
    """``cuda_available`` answers without importing torch from torch's ``version.py`` and the CUDA driver: a CPU
    build sees no GPU; a CUDA build sees none where the driver shows no device, and one where it shows a device
    and runs the build's CUDA major version or a later one. Torch is asked for a ROCm build, an older driver, or
    a ``version.py`` that cannot be read."""
    import importlib.util

    import torch

    from utils import cuda as probe

    assert probe._gpu_without_torch() in (None, torch.cuda.is_available())  # the installed torch, here
    fake = tmp_path / "torch"
    fake.mkdir()
    spec = importlib.util.spec_from_file_location("torch", fake / "__init__.py", submodule_search_locations=[str(fake)])
    monkeypatch.setattr(probe.importlib.util, "find_spec", lambda name: spec)
    cpu, cuda, rocm = "cuda = None\nhip = None\n", "cuda = '12.4'\nhip = None\n", "cuda = None\nhip = '6.2.41133'\n"
    for text, driver, known in ((cpu, (1, 12040), False), (cuda, (0, 0), False), (cuda, (0, 12040), False),
                                (cuda, (1, 12040), True), (cuda, (2, 13000), True), (cuda, (1, 12000), True),
                                (cuda, (1, 11080), None), (rocm, (0, 0), None), ("cuda = (\n", (1, 12040), None),
                                ("cuda = 'x.y'\nhip = None\n", (1, 12040), None)):
        monkeypatch.setattr(probe, "_cuda_driver", lambda driver=driver: driver)
        (fake / "version.py").write_text(text)
        assert probe._gpu_without_torch() is known, (text, driver)
    (fake / "version.py").unlink()
    assert probe._gpu_without_torch() is None


def test_the_cuda_driver_is_asked_for_its_devices_and_version_and_a_missing_one_shows_none(monkeypatch):
    """``_cuda_driver`` loads the driver's library through ctypes: missing, or failing to start, count or say
    its version, it shows no device; else its count (which honours ``CUDA_VISIBLE_DEVICES``, as torch's does)
    and its CUDA version."""
    import ctypes

    from utils import cuda as probe

    class Driver:
        def __init__(self, init=0, status=0, count=2, version=13000, version_status=0):
            self.init, self.status, self.count = init, status, count
            self.version, self.version_status = version, version_status

        @staticmethod
        def _put(pointer, value):
            ctypes.cast(pointer, ctypes.POINTER(ctypes.c_int)).contents.value = value

        def cuInit(self, flags):
            return self.init

        def cuDeviceGetCount(self, pointer):
            self._put(pointer, self.count)
            return self.status

        def cuDriverGetVersion(self, pointer):
            self._put(pointer, self.version)
            return self.version_status

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(probe.ctypes, "CDLL", missing)
    assert probe._cuda_driver() == (0, 0)
    for driver, seen in ((Driver(), (2, 13000)), (Driver(init=100), (0, 0)), (Driver(status=3), (0, 0)),
                         (Driver(count=0), (0, 13000)), (Driver(version_status=1), (0, 0))):
        monkeypatch.setattr(probe.ctypes, "CDLL", lambda name, driver=driver: driver)
        assert probe._cuda_driver() == seen
