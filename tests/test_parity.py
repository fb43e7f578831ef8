"""Parity with the paper's code: its flag names, `--preset paper` (value by value in setting.yml, for
each environment), checkpoint clean-up, and the table of docs/parity.md, generated from utils/parity.py."""

import json
import re
import shutil

import pytest
import torch
import yaml

import rl_finetune
import supervised_pretrain as sft
from experiment_args import ScriptArguments, parse_args
from prompts import policy_sft_text
from tests.auto_explore_repos import build_repo, make_task
from tests.conftest import HANDMADE_GAME, REPO
from tests.test_sft import HEAD, OBS, _write
from utils import checkpoints, complete, parity

PAPER = parity.PRESETS["paper"]
FIXTURE = HANDMADE_GAME


def test_the_papers_flag_names_are_accepted():
    args = parse_args(["--lora_r=8", "--lora_alpha=32", "--use_8bit=False", "--use_4bit=False", "--max_new_tokens=7",
                       "--trainer=ppo", "--ppo_clip_coef=0.2", "--ppo_update_iter=5", "--scenario=taxi"])
    assert (args.peft_lora_r, args.peft_lora_alpha, args.load_in_8bit, args.load_in_4bit) == (8, 32, False, False)
    assert (args.reflect_max_new_tokens, args.ppo_clip, args.ppo_epochs, args.env) == (7, 0.2, 5, "taxi")


def test_every_preset_key_is_a_setting_with_a_row():
    fields = {f for f in ScriptArguments.__dataclass_fields__}
    rows = {d.setting: d for d in parity.DEVIATIONS if d.setting}
    assert set(PAPER) == set(rows) and set(PAPER) <= fields
    for key, value in PAPER.items():
        assert rows[key].paper_value == value and rows[key].why and rows[key].paper and rows[key].ours


def test_each_rows_status_matches_the_defaults():
    """'the paper's by default' rows with a setting default to the paper's value; 'one flag away' rows do not."""
    fields = ScriptArguments.__dataclass_fields__
    for row in parity.DEVIATIONS:
        assert row.status in (parity.PAPER, parity.FLAG, parity.KEPT) and row.why, row.behaviour
        if row.setting:
            assert (fields[row.setting].default == row.paper_value) == (row.status == parity.PAPER), row.behaviour


def test_every_difference_found_by_playing_has_a_row():
    """PARITY.md's "Checked by playing" section: each behaviour and text difference is named by a row."""
    behaviours = {row.behaviour for row in parity.DEVIATIONS}
    found = ["`--first_step` (Taxi, AutoExplore)", "AutoExplore step costs", "Taxi without `--taxi_curriculum`",
             "Taxi: the dangerous rule on the first step", "AutoExplore depth curriculum", "AutoExplore `--easy`",
             "AutoExplore `--leaveout_prob`", "ALFWorld history", "ALFWorld oracle", "`--shuffle_action` on ALFWorld",
             "Taxi map: depot letters", "prompt layout", "action lines", "the paper's SFT texts",
             "AutoExplore observation", "AutoExplore invalid label", "ALFWorld observation",
             "episode ends (done / truncated)"]
    assert set(found) <= behaviours, set(found) - behaviours


def test_the_parity_pages_table_is_the_generated_one():
    page = (REPO / "docs" / "parity.md").read_text()
    table = "\n".join(line for line in page.splitlines() if line.startswith("|")) + "\n"
    assert table == parity.markdown_table(), "docs/parity.md's table differs from parity.markdown_table()"


def _expected(key):
    """The paper's value, as this machine can run it (without CUDA bitsandbytes optimisers fall back)."""
    import torch

    if key == "optim" and not torch.cuda.is_available():
        return "adamw_torch"
    return PAPER[key]


def test_preset_paper_sets_every_value_and_explicit_flags_win(tmp_path):
    args = parse_args(["--preset=paper", "--env=taxi"])
    assert {key: getattr(args, key) for key in PAPER} == {key: _expected(key) for key in PAPER}
    assert parse_args(["--preset", "paper", "--horizon=7"]).horizon == 7  # the command line wins
    config = tmp_path / "run.yaml"
    config.write_text("per_device_eval_batch_size: 6\n")
    assert parse_args(["--preset=paper", f"--config={config}"]).per_device_eval_batch_size == 6
    assert parse_args([]).horizon is None  # no preset: our defaults


def _rl_argv(tmp_path, env_argv):
    return ["--preset=paper", "--model_name=tiny-gpt2", f"--ckpt_path={tmp_path / 'results'}", "--max_steps=1",
            "--save_steps=1", "--reflect_max_new_tokens=4", *env_argv]


def _auto_explore_argv(tmp_path):
    repo = build_repo(tmp_path / "repos" / "repo")
    task_file = tmp_path / "tasks.json"
    # as the paper's train.json: with the writer's trajectories (--auto_explore_targets writer reads them)
    trajectory = {"model_name": "gpt-4", "trajectory": [], "filename": "main.py", "info": "positive0"}
    task_file.write_text(json.dumps([dict(make_task(repo), root="repo", trajectories=[trajectory])]))
    return ["--env=auto_explore", f"--task_file={task_file}", f"--repo_dir={tmp_path / 'repos'}"]


def _alfworld_argv(tmp_path):
    root = tmp_path / "alfworld"
    shutil.copytree(FIXTURE, root / "train" / FIXTURE.parent.name / FIXTURE.name)
    return ["--env=alfworld", f"--alfworld_data={root}"]


@pytest.mark.slow
@pytest.mark.parametrize("env_name", ["taxi", "auto_explore", "alfworld"])
def test_preset_paper_runs_and_records_the_papers_values(tmp_path, env_name):
    if env_name == "alfworld":
        pytest.importorskip("alfworld")
        if not FIXTURE.is_dir():
            pytest.skip("no ALFWorld fixture in ../shared/alfworld")
    env_argv = {"taxi": lambda: ["--env=taxi"], "auto_explore": lambda: _auto_explore_argv(tmp_path),
                "alfworld": lambda: _alfworld_argv(tmp_path)}[env_name]()
    assert rl_finetune.main(parse_args(_rl_argv(tmp_path, env_argv))) == 0
    (run,) = checkpoints.run_dirs(tmp_path / "results", "rl_finetune")
    settings = yaml.safe_load((run / checkpoints.SETTINGS_FILE).read_text())
    assert settings["preset"] == "paper"
    for key in PAPER:
        assert settings[key] == _expected(key), key
    episodes = (run / "checkpoint-1" / "episodes.jsonl").read_text().splitlines()
    assert len(episodes) == PAPER["per_device_eval_batch_size"]
    assert all(len(json.loads(e)["steps"]) <= PAPER["horizon"] for e in episodes)


def test_save_total_limit_keeps_the_newest_checkpoints(make_args, tmp_path):
    args = make_args(env="taxi", taxi_curriculum=True, curriculum_index=0, first_step=True,
                     per_device_eval_batch_size=2, max_steps=4, save_steps=1, save_total_limit=2)
    assert rl_finetune.main(args) == 0
    (run,) = checkpoints.run_dirs(tmp_path / "results", "rl_finetune")
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-4"]

    task_file = _write(tmp_path / "sft.jsonl", [policy_sft_text(OBS, HEAD, "0")] * 8)
    assert sft.main(make_args(task_file=task_file, max_steps=3, save_steps=1, save_total_limit=1)) == 0
    (sft_run,) = checkpoints.run_dirs(tmp_path / "results", "supervised_pretrain")
    assert [p.name for p in sft_run.glob("checkpoint-*")] == ["checkpoint-3"]


def test_prune_checkpoints_orders_by_number(tmp_path):
    for step in (2, 10, 9, 100):
        (tmp_path / f"checkpoint-{step}").mkdir()
        complete.mark(tmp_path / f"checkpoint-{step}")  # whole (utils/complete.py): prune counts only those
    (tmp_path / "checkpoint-notes").mkdir()
    removed = checkpoints.prune_checkpoints(tmp_path, 2)
    assert sorted(p.name for p in removed) == ["checkpoint-2", "checkpoint-9"]
    assert checkpoints.prune_checkpoints(tmp_path, None) == []


def test_cuda_optimisers_fall_back_on_a_cpu(monkeypatch, caplog):
    monkeypatch.setattr("experiment_args._cuda_available", lambda: False)
    args = ScriptArguments(optim="paged_adamw_32bit")
    assert args.optim == "adamw_torch"
    args.report_cpu_fallback()
    assert re.search(r"--optim=paged_adamw_32bit \(now adamw_torch\)", caplog.text)
    monkeypatch.setattr("experiment_args._cuda_available", lambda: True)
    assert ScriptArguments(optim="paged_adamw_32bit").optim == "paged_adamw_32bit"


def test_reflections_kept_whole_as_the_paper_does(tiny_path):
    from prompts import clean_reflection, policy_prompt
    from rollout import TwoPlayerRollout
    from tests.test_sft import HEAD, OBS

    text = "The taxi is at row 2.  \n\nThe passenger waits at R. # Action:\n3"
    assert clean_reflection(text) == "The taxi is at row 2. The passenger waits at R.\n"
    assert clean_reflection(text, one_line=False) == "The taxi is at row 2.\nThe passenger waits at R.\n"
    assert "row 2.\nThe passenger" in policy_prompt(OBS, HEAD, text, one_line=False)

    from experiment_args import ScriptArguments
    from utils import models

    tiny = models.ModelSettings.from_args(ScriptArguments(model_name="tiny-gpt2"))
    policy, tokenizer = models.load_model_and_tokenizer(tiny, trainable=False)
    newline = tokenizer.encode("\n")
    one_line = TwoPlayerRollout(policy, tokenizer, reflector=policy)
    whole = TwoPlayerRollout.from_args(parse_args(["--model_name=tiny-gpt2", "--no_reflect_one_line"]), policy,
                                       tokenizer, reflector=policy)
    assert one_line._stop_ids == [tokenizer.eos_token_id, *newline] and whole._stop_ids == [tokenizer.eos_token_id]
    reflections = whole.reflect([OBS + " # Analyze:\n"] * 2, seed=0)
    assert all(r.endswith("\n") for r in reflections)


def test_pg_normalised_per_decision_as_the_paper(make_args, tmp_path):
    losses, sizes = {}, {}
    for norm in ("episodes", "decisions"):
        args = make_args(env="taxi", taxi_curriculum=True, curriculum_index=0, per_device_eval_batch_size=4,
                         horizon=5, max_steps=1, save_steps=1, replay_buffer_size=0, pg_normalize=norm,
                         ckpt_path=str(tmp_path / norm))
        assert rl_finetune.main(args) == 0
        (run,) = checkpoints.run_dirs(tmp_path / norm, "rl_finetune")
        losses[norm] = next(json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
                            if "loss" in json.loads(line))
        episodes = [json.loads(e) for e in (run / "checkpoint-1" / "episodes.jsonl").read_text().splitlines()]
        sizes[norm] = (len(episodes), sum(len(e["steps"]) for e in episodes))
    assert sizes["episodes"] == sizes["decisions"]  # the same episodes, seeded
    episodes, decisions = sizes["episodes"]
    assert decisions > episodes
    assert losses["decisions"] * decisions == pytest.approx(losses["episodes"] * episodes, rel=1e-5)


def test_disable_dropout_turns_off_every_dropout(make_args):
    from utils import models

    model, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args(disable_dropout=True)))
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(m.p == 0.0 for m in dropouts)  # the base model's and LoRA's
    model, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args()))
    assert any(m.p > 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))


@pytest.mark.gpu
def test_four_bit_options_reach_bitsandbytes(make_args):
    if not torch.cuda.is_available():
        pytest.skip("bitsandbytes 4-bit needs CUDA")
    from utils import models

    model, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args(
        load_in_8bit=False, load_in_4bit=True, use_nested_quant=True, bnb_4bit_quant_type="fp4",
        bnb_4bit_compute_dtype="float16")))
    config = model.base_model.model.config.quantization_config
    assert config.bnb_4bit_quant_type == "fp4" and config.bnb_4bit_use_double_quant
    assert config.bnb_4bit_compute_dtype == torch.float16


def test_sft_epochs_and_length_grouping(make_args, tmp_path):
    with pytest.raises(ValueError, match="--num_train_epochs"):
        make_args(num_train_epochs=0)
    texts = [policy_sft_text(OBS, HEAD, str(i % 3)) for i in range(12)]
    task_file = _write(tmp_path / "sft.jsonl", texts)
    args = make_args(task_file=task_file, num_train_epochs=2, per_device_train_batch_size=4, group_by_length=True,
                     save_steps=100)
    assert sft.main(args) == 0
    (run,) = checkpoints.run_dirs(tmp_path / "results", "supervised_pretrain")
    assert [p.name for p in run.glob("checkpoint-*")] == ["checkpoint-6"]  # 2 epochs of 3 batches, not --max_steps


def test_separate_replay_steps_on_one_drawn_success_and_empties_at_each_level(make_args, tmp_path):
    args = make_args(env="taxi", taxi_curriculum=True, oracle_completion=True, per_device_eval_batch_size=4,
                     learning_rate=1e-3, max_steps=6, save_steps=6, replay_mode="separate", replay_buffer_size=50)
    assert rl_finetune.main(args) == 0
    (run,) = checkpoints.run_dirs(tmp_path / "results", "rl_finetune")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "replay_size" in r]
    assert len({r["level"] for r in records}) == 3
    size = 0
    for previous, record in zip([None, *records], records):
        successes = round(record["success"] * 4)
        if previous is None or previous["level"] != record["level"]:
            size = 0  # a new level: the buffer was emptied before this iteration's successes went in
        assert record["replayed"] == (1 if size else 0)  # one success, drawn from what was there
        assert ("replay_loss" in record) == bool(size)
        size += successes
        assert record["replay_size"] == size
    assert any(r["replayed"] for r in records)
    # A level change met a non-empty buffer (the loop above checked that it started again from empty).
    assert any(a["level"] != b["level"] and a["replay_size"] > 0 for a, b in zip(records, records[1:]))


def test_unmasked_policy_may_choose_a_label_not_shown_and_pays_a_step(make_args, tmp_path):
    args = make_args(env="taxi", taxi_curriculum=True, curriculum_index=0, per_device_eval_batch_size=8, horizon=6,
                     max_steps=1, save_steps=1, mask_invalid=False)
    assert rl_finetune.main(args) == 0
    (run,) = checkpoints.run_dirs(tmp_path / "results", "rl_finetune")
    episodes = [json.loads(e) for e in (run / "checkpoint-1" / "episodes.jsonl").read_text().splitlines()]
    steps = [step for episode in episodes for step in episode["steps"]]
    wasted = [step for step in steps if step["label"] >= 6]  # indices into the alphabet; Taxi shows 0-5
    assert wasted  # an untrained policy over 252 labels picks ones that are not shown
    assert all(step["reward"] == pytest.approx(-0.05) for step in wasted)  # a wasted move's cost
