"""Issue 31, defects 3 and 4: bad inputs ended in a traceback, or in a message about something else.
Each, reproduced as the issue words it, now ends the script with one line (``UsageError`` through
``run_script``, or ``parser.error`` while parsing), exit status 2, naming the file, flag or value, and
leaves no run folder behind."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

import rl_finetune
import supervised_pretrain
from data_gen.alfworld import gen_sft as alfworld_gen_sft
from data_gen.auto_explore import gen_sft as auto_explore_gen_sft
from data_gen.taxi import gen_sft as taxi_gen_sft
from experiment_args import ScriptArguments, run_script
from prompts import ACTION_MARKER
from tests.auto_explore_repos import build_repo, make_task
from tests.conftest import REPO
from utils import checkpoints, model_paths, models

RL, SFT = "rl_finetune.py", "supervised_pretrain.py"


@pytest.fixture
def run(monkeypatch, capsys, tmp_path):
    """``run(main, prog, *argv)``: the entry point as the command line runs it; its exit status and its one
    error line. The runs write under ``tmp_path/results``, which must stay absent."""

    def call(main, prog: str, *argv: str, env: str | None = None) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", [prog, "--model_name=tiny-gpt2", f"--ckpt_path={tmp_path / 'results'}",
                                          *argv])
        try:
            code = run_script(main, prog, env=env)
        except SystemExit as stop:  # an error found while parsing
            code = stop.code
        err = capsys.readouterr().err
        assert "Traceback" not in err, err
        (line,) = [line for line in err.splitlines() if line.startswith(f"{prog}: error: ")]
        assert not (tmp_path / "results").exists()  # no run folder left behind
        return code, line

    return call


def _refuse(*args, **kwargs):
    raise AssertionError("a model was loaded before the inputs were checked")


@pytest.fixture
def no_model(monkeypatch):
    """RL may not load a model before its inputs are checked."""
    monkeypatch.setattr(rl_finetune.TwoPlayerRollout, "load", _refuse)


@pytest.fixture
def no_sft_model(monkeypatch):
    """SFT may not load a model before its data is read and checked."""
    monkeypatch.setattr(models, "load_model_and_tokenizer", _refuse)  # what SFT's main imports


# --- AutoExplore's task file and repositories -----------------------------------------------------

def test_a_missing_task_file_is_one_line(run, no_model, tmp_path):
    code, line = run(rl_finetune.main, RL, f"--task_file={tmp_path / 'none.json'}")
    assert code == 2 and line == f"{RL}: error: --task_file: no such file {str(tmp_path / 'none.json')!r}"


def test_a_task_file_that_is_a_folder_is_called_a_folder(run, no_model, tmp_path):
    code, line = run(rl_finetune.main, RL, f"--task_file={tmp_path}")
    assert code == 2 and line == f"{RL}: error: --task_file: {tmp_path} is a folder; give a file"


def test_a_binary_task_file_is_named(run, no_model, tmp_path):
    (tmp_path / "tasks.json").write_bytes(b"\xff\xfe\x00\x81binary")
    code, line = run(rl_finetune.main, RL, f"--task_file={tmp_path / 'tasks.json'}")
    assert code == 2 and f"--task_file: {tmp_path / 'tasks.json'} is not UTF-8 text" in line


@pytest.mark.parametrize("field, value, said", [
    ("question", 5, "task field 'question' must be a string, got 5"),
    ("filename", 7, "task field 'filename' must be a path or a non-empty list of paths, got 7"),
    ("root", ["a"], "task field 'root' must name the repository folder, got ['a']"),
    ("filename", "src/none.py", "target files ['src/none.py'] are not files of an allowed kind in repository"),
])
def test_a_task_field_of_the_wrong_type_stops_before_the_model_loads(run, no_model, tmp_path, field, value, said):
    repo = build_repo(tmp_path / "repo")
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([make_task(repo), dict(make_task(repo), **{field: value})]))
    code, line = run(rl_finetune.main, RL, f"--task_file={tasks}")
    assert code == 2 and line.startswith(f"{RL}: error: --task_file: task 1 of {tasks}: {said}")


def test_a_missing_repository_names_repo_dir(run, no_model, tmp_path):
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([dict(make_task(tmp_path), root="gone")]))
    code, line = run(rl_finetune.main, RL, f"--task_file={tasks}", f"--repo_dir={tmp_path / 'repos'}")
    assert code == 2 and line == (f"{RL}: error: --task_file: task 0 of {tasks}: repository folder "
                                  f"{str(tmp_path / 'repos' / 'gone')!r} not found (task field 'root' 'gone' lies "
                                  f"in --repo_dir {str(tmp_path / 'repos')!r})")


def test_the_validation_panels_task_file_is_checked_too(run, no_model, tmp_path):
    repo = build_repo(tmp_path / "repo")
    (tmp_path / "train.json").write_text(json.dumps([make_task(repo)]))
    code, line = run(rl_finetune.main, RL, f"--task_file={tmp_path / 'train.json'}", "--eval_steps=1",
                     f"--validation_task_file={tmp_path / 'none.json'}")
    assert code == 2 and "--validation_task_file: no such file" in line


# --- ALFWorld's data ----------------------------------------------------------------------------------

@pytest.mark.parametrize("where, said", [
    ("nowhere", "--alfworld_data: the ALFWorld data root {root} is not a folder"),
    ("empty", "--alfworld_data: no ALFWorld split folder 'train' in {root}"),
    ("$nowhere", "$ALFWORLD_DATA: the ALFWorld data root {root} is not a folder"),
    ("", "--alfworld_data: no ALFWorld data root"),
])
def test_no_alfworld_data_is_one_line(run, no_model, tmp_path, monkeypatch, where, said):
    root = tmp_path / where.lstrip("$")
    if where == "empty":
        root.mkdir()
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    argv = ["--env=alfworld"]
    if where.startswith("$"):
        monkeypatch.setenv("ALFWORLD_DATA", str(root))
    elif where:
        argv.append(f"--alfworld_data={root}")
    code, line = run(rl_finetune.main, RL, *argv)
    assert code == 2 and line.startswith(f"{RL}: error: " + said.format(root=root))


# --- gen_sft's records ----------------------------------------------------------------------------------

@pytest.mark.parametrize("step", [taxi_gen_sft, alfworld_gen_sft])
def test_gen_sft_on_records_without_state_names_file_and_record(run, tmp_path, step):
    data = tmp_path / "data_reflection.json"
    data.write_text(json.dumps([{"state": "s", "reflection": "r", "taken": "1"}, {"reflection": "r", "taken": "1"}]))
    prog = f"python -m {step.__name__}"
    code, line = run(step.main, prog, f"--task_file={data}", f"--output_dir={tmp_path / 'out'}")
    assert code == 2 and line == (f"{prog}: error: --task_file: record 1 of {data} has no string field 'state' "
                                  "(give the reflection step's data_reflection.json)")
    data.write_text("[]")  # no record: no SFT files of no texts, which SFT would refuse a step later
    code, line = run(step.main, prog, f"--task_file={data}", f"--output_dir={tmp_path / 'out'}")
    assert code == 2 and line.startswith(f"{prog}: error: --task_file: {data} holds no records")
    assert not (tmp_path / "out").exists()


def test_auto_explore_gen_sft_on_records_without_trajectories_names_file_and_task(run, tmp_path):
    repo = build_repo(tmp_path / "repo")
    data = tmp_path / "train.json"
    data.write_text(json.dumps([make_task(repo)]))
    prog = "python -m data_gen.auto_explore.gen_sft"
    code, line = run(auto_explore_gen_sft.main, prog, f"--task_file={data}", f"--repo_dir={tmp_path}")
    assert code == 2 and line.startswith(f"{prog}: error: --task_file: task 0 of {data}: it has no list 'trajectories'")


# --- output paths -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["output_dir", "ckpt_path", "sandbox_dir", "llm_cache"])
def test_an_output_folder_that_is_a_file_is_one_line(run, tmp_path, flag):
    (tmp_path / "file").write_text("x")
    code, line = run(rl_finetune.main, RL, f"--{flag}={tmp_path / 'file'}")
    assert code == 2 and line == f"{RL}: error: --{flag}: {tmp_path / 'file'} is a file, not a folder"
    code, line = run(rl_finetune.main, RL, f"--{flag}={tmp_path / 'file' / 'below'}")
    assert line == f"{RL}: error: --{flag}: {tmp_path / 'file' / 'below'} cannot be a folder: {tmp_path / 'file'} is a file"


# --- an unknown model id without the hub ---------------------------------------------------------------

@pytest.mark.parametrize("offline", [True, False])
def test_an_unknown_hub_id_without_the_hub_fails_in_seconds(run, tmp_path, monkeypatch, offline):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    model_paths._hub_reachable.cache_clear()
    start = time.time()
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"text": f"state{ACTION_MARKER}3"}) + "\n")
    code, line = run(supervised_pretrain.main, SFT, "--model_name=no-such/model", f"--task_file={data}")
    assert time.time() - start < 15
    why = "HF_HUB_OFFLINE is set" if offline else "http://127.0.0.1:9 cannot be reached"
    assert code == 2 and line.startswith(f"{SFT}: error: --model_name 'no-such/model': not a local folder nor in the "
                                         f"Hugging Face cache, and {why}: nothing can be downloaded")
    model_paths._hub_reachable.cache_clear()


def test_an_unknown_hub_id_fails_in_seconds_from_the_command_line(tmp_path):
    """The script as a user runs it, HF_HUB_OFFLINE unset: it used to retry for 51 s, then end in an OSError."""
    env = {key: value for key, value in os.environ.items() if key != "HF_HUB_OFFLINE"}
    start = time.time()
    done = subprocess.run([sys.executable, "rl_finetune.py", "--model_name=no-such/model", "--env=taxi",
                           f"--ckpt_path={tmp_path / 'results'}"], cwd=REPO, capture_output=True, text=True,
                          env={**env, "HF_ENDPOINT": "http://127.0.0.1:9"}, timeout=600)
    assert time.time() - start < 60  # the interpreter's start (torch) included
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        f"{RL}: error: --model_name 'no-such/model': not a local folder nor in the Hugging Face cache")
    assert not (tmp_path / "results").exists()


# --- misleading messages ----------------------------------------------------------------------------------

def _checkpoint(folder, trainer_state: str, **settings):
    """A checkpoint folder as a script leaves it, as far as resuming reads it: its settings and trainer state."""
    folder.mkdir(parents=True)
    checkpoints.save_settings(folder, ScriptArguments(model_name="tiny-gpt2", **settings))
    (folder / trainer_state).write_bytes(b"")
    return folder


def test_rl_resuming_an_sft_checkpoint_says_what_it_is(run, tmp_path):
    (tmp_path / "sft.jsonl").write_text(json.dumps({"text": "s" + ACTION_MARKER + "1"}) + "\n")
    sft = _checkpoint(tmp_path / "1_supervised_pretrain" / "checkpoint-2", "trainer_state.json",
                      task_file=str(tmp_path / "sft.jsonl"))
    code, line = run(rl_finetune.main, RL, f"--resume_from={sft}")
    assert code == 2 and line == (f"{RL}: error: --resume_from: {sft} is a checkpoint of supervised_pretrain.py; "
                                  f"{RL} continues its own runs only (to start RL from it, give --load_dir {sft})")


def test_sft_resuming_an_rl_checkpoint_says_what_it_is(run, tmp_path):
    rl = _checkpoint(tmp_path / "2_rl_finetune" / "checkpoint-1", checkpoints.TRAINER_STATE_FILE, env="taxi")
    code, line = run(supervised_pretrain.main, SFT, f"--resume_from={rl}")
    assert code == 2 and line == (f"{SFT}: error: --resume_from: {rl} is a checkpoint of rl_finetune.py; {SFT} "
                                  "continues its own runs only")
    code, line = run(supervised_pretrain.main, SFT, f"--resume_from={tmp_path / 'none'}")
    assert line == f"{SFT}: error: --resume_from: no such checkpoint folder {str(tmp_path / 'none')!r}"


def test_a_binary_config_is_named(run, tmp_path):
    (tmp_path / "config.yaml").write_bytes(b"seed: \xff\xfe\n")
    code, line = run(rl_finetune.main, RL, f"--config={tmp_path / 'config.yaml'}")
    assert code == 2 and f"--config: {tmp_path / 'config.yaml'} is not UTF-8 text" in line
    code, line = run(rl_finetune.main, RL, f"--config={tmp_path}")
    assert line == f"{RL}: error: --config: {tmp_path} is a folder; give a file"


@pytest.mark.parametrize("content", [None, b"\x80\x81 not text"])
def test_sfts_task_file_that_is_a_folder_or_binary_is_named(run, no_sft_model, tmp_path, content):
    path = tmp_path / "data"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    code, line = run(supervised_pretrain.main, SFT, f"--task_file={path}")
    assert code == 2
    assert line == (f"{SFT}: error: --task_file: {path} is a folder; give a file" if content is None else
                    f"{SFT}: error: --task_file: {path} is not UTF-8 text (byte 0: a binary file?)")


@pytest.mark.parametrize("case", ["none given", "missing", "empty"])
def test_sfts_missing_or_empty_task_file_is_said_before_a_model_loads(run, no_sft_model, tmp_path, case):
    """No data, no such file, or a file of blank lines: one line, before the model (minutes for GPT-2 XL) loads."""
    path = tmp_path / "sft.jsonl"
    if case == "empty":
        path.write_text("\n\n")
    code, line = run(supervised_pretrain.main, SFT, *([] if case == "none given" else [f"--task_file={path}"]))
    said = {"none given": "--task_file: give the SFT .jsonl file (lines of {\"text\": ...})",
            "missing": f"--task_file: no such file {str(path)!r}", "empty": f"--task_file: {path} holds no texts"}
    assert code == 2 and line == f"{SFT}: error: {said[case]}"


def test_an_sft_text_without_a_marker_is_named_by_its_line(run, no_sft_model, tmp_path):
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"text": f"state{ACTION_MARKER}3"}) + "\n" + json.dumps({"text": "no marker"}) + "\n")
    code, line = run(supervised_pretrain.main, SFT, f"--task_file={data}")
    assert code == 2 and line.startswith(f"{SFT}: error: --task_file: {data}:2: its text holds neither "
                                         f"{ACTION_MARKER!r} nor ")


def test_an_unexpected_exception_keeps_its_traceback(monkeypatch, tmp_path):
    """Only bad input is one line: a bug still shows where it happened."""
    monkeypatch.setattr(sys, "argv", [RL, "--model_name=tiny-gpt2", "--env=taxi", f"--ckpt_path={tmp_path}"])
    monkeypatch.setattr(torch, "manual_seed", lambda seed: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        run_script(rl_finetune.main, RL)


def test_the_memory_benchmark_refuses_an_empty_batch(capsys):
    from benchmarks import rl_memory

    with pytest.raises(SystemExit) as stop:
        rl_memory.main(["--batches", "8", "0"])
    assert stop.value.code == 2 and "--batches: each at least 1, got [8, 0]" in capsys.readouterr().err


def test_the_enumeration_benchmark_refuses_a_list_it_cannot_build(capsys):
    """Each row's state lists a cat and an id command per file, so an odd number of actions cannot be made."""
    from benchmarks import enumeration

    for sizes in (["6", "7"], ["0"]):
        with pytest.raises(SystemExit) as stop:
            enumeration.command_line(["--actions", *sizes])
        assert stop.value.code == 2 and "--actions: each an even number of at least 2" in capsys.readouterr().err


def test_a_plot_of_a_folder_that_holds_no_run_log_is_one_line(run, tmp_path):
    from visualization import plot

    empty, garbled = tmp_path / "empty", tmp_path / "garbled"
    empty.mkdir()
    garbled.mkdir()
    (garbled / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')  # a broken record inside
    for entry, said in ((f"curve={empty}", f"--expdirs curve={empty}: {empty}: no metrics.jsonl in it"),
                        ("curve=", "--expdirs: 'curve=' names no run directory"),
                        (str(tmp_path / "gone"), f"--expdirs {tmp_path / 'gone'}: {tmp_path / 'gone'}: no such folder"),
                        (str(garbled / "metrics.jsonl"), f"{garbled / 'metrics.jsonl'}: a file, not a folder (give the run folder"),
                        (str(garbled), f"{garbled / 'metrics.jsonl'}:2: not a JSON record")):
        code, line = run(plot.main, "python -m visualization.plot", f"--expdirs={entry}",
                         f"--output_file={tmp_path / 'curves.png'}")
        assert code == 2 and said in line, line
    assert not (tmp_path / "curves.png").exists()


def test_a_benchmarks_out_file_is_checked_before_the_benchmark_runs(tmp_path, capsys):
    """``--out`` of rl_iteration and sft_step: its folder is made at once, and a name that cannot be written ends
    the program before a run of up to an hour, not after it. ``--out=FILE`` works as every other flag does."""
    from benchmarks.rows import own_flags, save

    for form in (["--out", str(tmp_path / "new" / "rows.json")], [f"--out={tmp_path / 'new' / 'rows.json'}"]):
        own, rest = own_flags(["--max_steps", "2", *form, "--model_name=x"], "prog", "doc")
        assert rest == ["--max_steps", "2", "--model_name=x"] and own.out == tmp_path / "new" / "rows.json"
    assert own.out.parent.is_dir() and own_flags(["--max_steps", "2"], "prog", "doc")[0].out is None
    save(own.out, [{"row": "everything off", "seconds": [1.5]}])
    assert json.loads(own.out.read_text()) == [{"row": "everything off", "seconds": [1.5]}]
    (tmp_path / "a_file").write_text("")
    for argv, said in ((["--out"], "argument --out: expected one argument"),
                       (["--out", str(tmp_path)], f"--out: {tmp_path} is a folder"),
                       (["--out", str(tmp_path / "a_file" / "rows.json")], "--out: cannot make the folder of")):
        with pytest.raises(SystemExit) as stop:
            own_flags(argv, "prog", "doc")
        assert stop.value.code == 2 and f"prog: error: {said}" in capsys.readouterr().err, argv


@pytest.mark.parametrize("module, own", [("benchmarks.rl_iteration", ["--out", "--emulated_bf16"]),
                                         ("benchmarks.sft_step", ["--out"]), ("benchmarks.rl_memory", ["--batches"]),
                                         ("benchmarks.enumeration", ["--actions"])])
def test_a_benchmarks_help_lists_its_own_flags_then_the_shared_ones(module, own):
    """``--help`` of a benchmark with flags of its own: what it measures (its docstring), its own flags, and the
    flags every script shares; nothing runs."""
    result = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    head, _, shared = result.stdout.partition("Reflect-RL: every script shares these flags.")
    assert "this benchmark's own flags" in head and all(flag in head for flag in own)
    assert "python -m " + module in head and "--model_name" in shared


def test_an_unknown_flag_is_named_with_the_closest_known_one(capsys):
    """A typo in a flag gets one line naming it and the flag it was probably meant to be, not transformers'
    "Some specified arguments are not used"; a stray word is named too; values of unknown flags are not."""
    from experiment_args import parse_args

    for argv, said in ((["--max_step", "3"], "unknown flag --max_step (did you mean --max_steps?)"),
                       (["--max-step", "3"], "unknown flag --max-step (did you mean --max_steps?)"),
                       (["--sed", "3"], "unknown flag --sed (did you mean --seed?)"),
                       (["--per_device_eval_batchsize=4"],
                        "unknown flag --per_device_eval_batchsize (did you mean --per_device_eval_batch_size?)"),
                       (["--reflect-load-dri", "x"], "unknown flag --reflect-load-dri (did you mean --reflect_load_dir?)"),
                       (["--bogus", "1", "stray"], "unknown flag --bogus; 'stray' follows no flag that takes it"),
                       (["--bogus", "-1"], "unknown flag --bogus")):  # a negative number is a value, not a flag
        with pytest.raises(SystemExit) as stop:
            parse_args(argv, prog="rl_finetune.py")
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert stop.value.code == 2 and err == f"rl_finetune.py: error: {said} (all flags: --help)", err


def test_every_entry_point_ends_bad_input_in_one_line():
    """A ``UsageError`` raised anywhere in a command's work (a model that is not there, found where it loads) ends
    every entry point in one line, status 2: each runs its ``main`` through ``run_script`` or
    ``one_line_usage_errors``. (The benchmarks and the GPT evaluations once called ``main`` bare: a traceback.)"""
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    opening = '\nif __name__ == "__main__":'
    blocks = {name: (REPO / name).read_text().split(opening, 1)[1] for name in tracked.stdout.split()
              if not name.startswith("tests/") and opening in (REPO / name).read_text()}
    # own small parsers (exit_probe.py: none), no ScriptArguments (gpu/column.py runs before the project's packages
    # are installed there)
    no_model = {"lock/check.py", "benchmarks/llm_concurrency.py", "utils/cpu.py", "gpu/bundle.py", "gpu/column.py",
                "gpu/profile.py", "utils/complete.py", "benchmarks/two_process_exit.py", "benchmarks/exit_probe.py"}
    assert len(blocks) > 25 and no_model <= set(blocks)
    bare = [name for name, block in blocks.items()
            if name not in no_model and "run_script(" not in block and "one_line_usage_errors(" not in block]
    assert bare == []


def test_a_benchmark_whose_worker_finds_bad_input_says_it_in_one_line(capsys):
    """rl_memory measures each batch in a worker process of its own: the worker hands a ``UsageError`` back."""
    from benchmarks import rl_memory
    from experiment_args import one_line_usage_errors

    code = one_line_usage_errors("prog", rl_memory.main, ["--batches", "1", "--model_name=/models/none"])
    error = capsys.readouterr().err
    assert code == 2 and "prog: error: --model_name '/models/none': no such model folder" in error, error


@pytest.mark.parametrize("argv, said", [(["--episodes", "0"], "--episodes: at least 1, got 0"),
                                        (["--concurrency", "1", "0"], "--concurrency: each at least 1, got [1, 0]"),
                                        (["--latency", "-1"], "--latency: at least 0, got -1.0")])
def test_the_llm_concurrency_benchmark_names_its_own_flags(capsys, argv, said):
    from benchmarks import llm_concurrency

    with pytest.raises(SystemExit) as stop:
        llm_concurrency.main(argv)
    assert stop.value.code == 2 and f"error: {said}" in capsys.readouterr().err
