"""Faults a real run meets (issue 72): a kill while a checkpoint is written, damaged checkpoint files, a full disk.
Whatever happens, every checkpoint is whole or refused in one line naming the folder and the file, a full disk is
said as such (exit 2) and the same command, or ``--resume_from``, goes on once there is space."""

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest

import rl_finetune
import supervised_pretrain as sft
from data_gen.taxi import reflection
from evaluation import evaluate
from experiment_args import parse_args
from prompts import policy_sft_text
from tests.test_checkpoint_roles import EVAL_FLAGS, RL_FLAGS, one_line_exit
from utils import checkpoints, complete, io, metrics

HEAD = "The actions you can take now is:"
OBS = f"--- Current State ---\n+---+\n|T P|\n+---+\n{HEAD}\n0. Move south\n1. Move north\n"
SFT_PROG, RL_PROG = "supervised_pretrain.py", "rl_finetune.py"
RL_RUN = [*RL_FLAGS[:4], "--per_device_eval_batch_size=2", "--reflect_max_new_tokens=4", "--oracle_completion"]


def _rl(tmp_path, *flags: str) -> list[str]:
    return [*RL_RUN, f"--ckpt_path={tmp_path / 'results'}", *flags]


@pytest.fixture(scope="module")
def rl_run(tmp_path_factory):
    """An RL run of two iterations with a checkpoint after each; tests copy it before they damage it."""
    root = tmp_path_factory.mktemp("rl_run")
    assert rl_finetune.main(parse_args(_rl(root, "--max_steps=2", "--save_steps=1"), prog=RL_PROG)) == 0
    (run,) = checkpoints.run_dirs(root / "results")
    return run


@pytest.fixture
def run_copy(rl_run, tmp_path):
    copy = tmp_path / "old" / rl_run.name
    shutil.copytree(rl_run, copy)
    return copy


def refused(monkeypatch, capsys, main, prog: str, argv: list[str]) -> str:
    """The one line with which an entry point refuses ``argv``, when its flags are parsed or later (exit 2)."""
    try:
        return one_line_exit(monkeypatch, capsys, main, prog, argv)
    except SystemExit as stop:  # argparse's: its usage line, then the error
        assert stop.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 2 and err[0].startswith("usage: ") and err[1].startswith(f"{prog}: error: "), err
        return err[1]


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


# --- every checkpoint whole, or refused -----------------------------------------------------------------

def test_rl_checkpoints_are_marked_whole_with_every_file(rl_run):
    for checkpoint in complete.numbered_checkpoints(rl_run):
        listed = json.loads((checkpoint / complete.MARKER).read_text())["files"]
        assert set(listed) == {p.name for p in checkpoint.iterdir()} - {complete.MARKER}
        assert complete.is_whole(checkpoint)
    assert not [p for p in rl_run.iterdir() if p.name.startswith(".")]  # no scratch left


@pytest.mark.parametrize("where", ["--resume_from", "--load_dir", "evaluate"])
def test_a_torn_checkpoint_is_refused_in_one_line(where, run_copy, tmp_path, monkeypatch, capsys):
    torn = run_copy / "checkpoint-2"
    (torn / complete.MARKER).unlink()  # as a kill, or a full disk, leaves it
    if where == "evaluate":
        line = refused(monkeypatch, capsys, evaluate.main, evaluate.PROG,
                             [*EVAL_FLAGS, f"--ckpt_path={tmp_path / 'results'}", f"--load_dir={torn}"])
    else:
        flags = [f"--resume_from={torn}"] if where == "--resume_from" else _rl(tmp_path, f"--load_dir={torn}",
                                                                               "--max_steps=1")
        line = refused(monkeypatch, capsys, rl_finetune.main, RL_PROG, flags)
    assert f"{torn}" in line and "is torn: it has no complete.json" in line
    if where == "--resume_from":
        assert line.endswith(f"its run's newest whole one is {run_copy / 'checkpoint-1'}")
    assert not checkpoints.run_dirs(tmp_path / "results")


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _overwrite(path):
    path.write_bytes(b"\x00garbage" * (path.stat().st_size // 8) + b"\x00" * (path.stat().st_size % 8))


@pytest.mark.parametrize("file, damage, says", [
    ("adapter_model.safetensors", _truncate, "is damaged: its adapter_model.safetensors holds"),
    ("adapter_model.safetensors", os.unlink, "is damaged: its adapter_model.safetensors is missing"),
    ("trainer_state.pt", _truncate, "is damaged: its trainer_state.pt holds"),
    ("adapter_model.safetensors", _overwrite, "its adapter_model.safetensors cannot be read, it is damaged"),
    ("trainer_state.pt", _overwrite, "its trainer_state.pt is damaged and cannot be read"),
])
def test_a_damaged_checkpoint_file_is_named_in_one_line(file, damage, says, run_copy, tmp_path, monkeypatch, capsys):
    checkpoint = run_copy / "checkpoint-2"
    damage(checkpoint / file)
    if damage is _overwrite:  # the same size: only reading it finds the damage
        assert complete.is_whole(checkpoint)
    line = refused(monkeypatch, capsys, rl_finetune.main, RL_PROG, [f"--resume_from={checkpoint}"])
    assert says in line and str(checkpoint) in line


def test_a_foreign_adapter_without_its_weights_never_reaches_the_hub(tmp_path, monkeypatch, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": "x"}))
    monkeypatch.delenv("HF_HUB_OFFLINE")  # a hub lookup would be tried, and fail otherwise than in one line
    line = refused(monkeypatch, capsys, rl_finetune.main, RL_PROG,
                         _rl(tmp_path, f"--load_dir={bare}", "--max_steps=1"))
    assert line.endswith(f"{str(bare)!r} is incomplete: it has adapter_config.json but no adapter_model.safetensors "
                         "or adapter_model.bin")


def test_a_scratch_folder_left_by_a_kill_is_cleaned_at_the_next_start(run_copy, caplog):
    dead = _dead_pid()
    scratch = run_copy / f".checkpoint-3.tmp{dead}"
    shutil.copytree(run_copy / "checkpoint-2", scratch)
    (scratch / complete.MARKER).unlink()  # killed while writing it
    aside = run_copy / f".checkpoint-9.old{dead}"
    shutil.copytree(run_copy / "checkpoint-2", aside)  # killed between moving checkpoint-9 aside and the new one in
    theirs = run_copy / f".notes.tmp{dead}"  # a folder of the same shape that is not RL's: left alone
    theirs.mkdir()
    with caplog.at_level(logging.WARNING):
        parse_args([f"--resume_from={run_copy / 'checkpoint-2'}"], prog=RL_PROG)
    assert not scratch.exists() and complete.is_whole(run_copy / "checkpoint-9") and theirs.is_dir()
    said = [r.getMessage() for r in caplog.records if "killed run" in r.getMessage()]
    assert said == [f"removed {scratch}, a scratch folder left by a killed run",
                    f"{aside} was a checkpoint a killed run had moved aside: back at {run_copy / 'checkpoint-9'}"]


def test_prune_keeps_the_newest_whole_checkpoint(run_copy):
    shutil.copytree(run_copy / "checkpoint-2", run_copy / "checkpoint-3")
    (run_copy / "checkpoint-3" / complete.MARKER).unlink()  # the save in progress, or cut short
    assert checkpoints.prune_checkpoints(run_copy, 1) == [run_copy / "checkpoint-1"]
    assert [p.name for p in complete.numbered_checkpoints(run_copy)] == ["checkpoint-2", "checkpoint-3"]


def _sft_data(tmp_path):
    data = tmp_path / "sft_policy.jsonl"
    data.write_text("".join(json.dumps({"text": policy_sft_text(OBS, HEAD, str(i % 2))}) + "\n" for i in range(8)))
    return data


def _sft(tmp_path, *flags, results=None):
    return ["--model_name=tiny-gpt2", f"--task_file={_sft_data(tmp_path)}", "--per_device_train_batch_size=4",
            f"--ckpt_path={results or tmp_path / 'results'}", *flags]


def test_sft_save_total_limit_never_leaves_no_whole_checkpoint(tmp_path, monkeypatch, capsys):
    """A kill right after the Trainer wrote checkpoint-2 (and, before, deleted checkpoint-1 for
    --save_total_limit=1), before the project's files: checkpoint-1 must still be there to resume from."""
    real = checkpoints.save_settings

    def killed_at_the_second(directory, args):
        if directory.name == "checkpoint-2":
            raise KeyboardInterrupt  # the kill
        real(directory, args)

    monkeypatch.setattr(checkpoints, "save_settings", killed_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        sft.main(parse_args(_sft(tmp_path, "--max_steps=3", "--save_steps=1", "--save_total_limit=1"), prog=SFT_PROG))
    monkeypatch.setattr(checkpoints, "save_settings", real)
    capsys.readouterr()
    (run,) = checkpoints.run_dirs(tmp_path / "results")
    assert complete.is_whole(run / "checkpoint-1") and not complete.is_whole(run / "checkpoint-2")
    line = refused(monkeypatch, capsys, sft.main, SFT_PROG,
                         [f"--resume_from={run / 'checkpoint-2'}"])
    assert line.endswith(f"its run's newest whole one is {run / 'checkpoint-1'}") and "is torn" in line
    assert sft.main(parse_args([f"--resume_from={run / 'checkpoint-1'}"], prog=SFT_PROG)) == 0
    resumed = checkpoints.run_dirs(tmp_path / "results")[-1]
    assert [p.name for p in complete.numbered_checkpoints(resumed)] == ["checkpoint-3"]
    assert complete.is_whole(resumed / "checkpoint-3")


# --- a full disk --------------------------------------------------------------------------------------

def test_writers_say_a_full_disk_and_leave_nothing_behind(tmp_path, monkeypatch):
    target = tmp_path / "out.json"

    def full(fd):
        raise OSError(28, "No space left on device")  # as the disk says it when the data reaches it

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(io.DiskFull, match=rf"^no space left on the disk of {target} \(.* MiB free\) while writing "
                                          "it; free some space, then run the same command again"):
        io.write_text_atomic(target, "x" * 100_000)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    # torch.save's own words name no cause: a full disk when the disk is nearly full, else the error itself
    torch_words = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")
    monkeypatch.setattr(io, "free_bytes", lambda path: 1 << 20)
    assert io.out_of_space(torch_words, tmp_path)
    monkeypatch.setattr(io, "free_bytes", lambda path: 1 << 40)
    assert not io.out_of_space(torch_words, tmp_path)
    assert io.out_of_space(RuntimeError('IoError(Os { code: 28, kind: StorageFull, message: "No space left on '
                                        'device" })'))


class SmallDisk:
    """A tmpfs of a given size, mounted for one test (root only)."""

    def __init__(self, path):
        self.path = path

    def resize(self, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True)


@pytest.fixture
def small_disk(tmp_path):
    path = tmp_path / "disk"
    path.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root (the full-disk logic is tested without one above)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(path)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield SmallDisk(path)
    subprocess.run(["umount", "-l", str(path)], check=False)


def _full_disk_line(line: str, disk) -> None:
    assert line.split(": error: ", 1)[1].startswith(f"no space left on the disk of {disk.path}")


@pytest.mark.slow
def test_rl_on_a_full_disk_says_so_and_resumes_once_there_is_space(small_disk, monkeypatch, capsys):
    line = refused(monkeypatch, capsys, rl_finetune.main, RL_PROG,
                         _rl(small_disk.path, "--max_steps=4", "--save_steps=1"))
    _full_disk_line(line, small_disk)
    (run,) = checkpoints.run_dirs(small_disk.path / "results")
    newest = complete.newest_whole(run)
    assert newest is not None and line.endswith(f"then add --resume_from={newest}")
    assert all(complete.is_whole(p) for p in complete.numbered_checkpoints(run))  # nothing torn, no scratch
    assert not [p for p in run.iterdir() if p.name.startswith(".checkpoint")]
    small_disk.resize("64m")
    assert rl_finetune.main(parse_args([f"--resume_from={newest}"], prog=RL_PROG)) == 0
    assert [r["step"] for r in metrics.read_metrics(checkpoints.run_dirs(small_disk.path / "results")[-1])] == [1, 2, 3,
                                                                                                              4]


@pytest.mark.slow
def test_sft_on_a_full_disk_says_so_and_resumes_once_there_is_space(small_disk, tmp_path, monkeypatch, capsys):
    flags = _sft(tmp_path, "--max_steps=4", "--save_steps=1", results=small_disk.path / "results")
    line = refused(monkeypatch, capsys, sft.main, SFT_PROG, flags)
    _full_disk_line(line, small_disk)
    (run,) = checkpoints.run_dirs(small_disk.path / "results")
    newest = complete.newest_whole(run)
    if newest is None:  # the disk filled before the first checkpoint was whole
        assert line.endswith("free some space, then run the same command again")
    else:
        assert line.endswith(f"then add --resume_from={newest}")
    small_disk.resize("64m")
    again = [*flags, f"--resume_from={newest}"] if newest else flags
    assert sft.main(parse_args(again, prog=SFT_PROG)) == 0
    assert complete.is_whole(checkpoints.run_dirs(small_disk.path / "results")[-1] / "checkpoint-4")


def test_a_data_step_on_a_full_disk_says_so_and_the_same_command_resumes(small_disk, tmp_path, monkeypatch, capsys):
    small_disk.resize("48k")
    argv = ["--env=taxi", "--api=oracle", "--num_episodes=40", f"--output_dir={small_disk.path}"]
    line = refused(monkeypatch, capsys, reflection.main, "python -m data_gen.taxi.reflection", argv)
    _full_disk_line(line, small_disk)
    assert line.endswith("free some space, then run the same command again: what was finished is kept and the rest "
                         "is done")
    small_disk.resize("16m")
    monkeypatch.setattr("sys.argv", ["reflection", *argv])
    from experiment_args import run_script

    assert run_script(reflection.main, "reflection", env="taxi") == 0
    whole = tmp_path / "whole"
    monkeypatch.setattr("sys.argv", ["reflection", *argv[:3], f"--output_dir={whole}"])
    assert run_script(reflection.main, "reflection", env="taxi") == 0
    name = "data_reflection.json"
    assert (small_disk.path / name).read_text() == (whole / name).read_text()
