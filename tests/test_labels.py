"""Choice labels that fit the tokenizer: the paper's where they are one token, else an alphabet
chosen from the tokenizer, carried through SFT data, checkpoints, RL and evaluation."""

import json
from pathlib import Path

import pytest
import torch

from envs import make_env
from prompts import (
    ACTION_MARKER,
    LABEL_FILE,
    LABELS,
    check_label_file,
    label_alphabet,
    label_token_ids,
    relabel,
    write_label_file,
)
from utils import models


@pytest.fixture(scope="module")
def digit_tokenizer(digit_model):
    return models.load_tokenizer(digit_model)


def test_gpt2_family_keeps_the_papers_labels(tiny_tokenizer):
    assert label_alphabet(tiny_tokenizer) is label_alphabet(tiny_tokenizer)  # computed once per tokenizer
    assert label_alphabet(tiny_tokenizer) == LABELS


def test_digit_splitting_tokenizer_gets_its_own_alphabet(digit_tokenizer):
    assert digit_tokenizer.tokenize(ACTION_MARKER + "12")[-2:] == ["1", "2"]
    alphabet = label_alphabet(digit_tokenizer)
    assert len(alphabet) == len(set(alphabet)) == len(LABELS)
    # the paper's labels that are one token come first, in the paper's order; then two letters
    assert alphabet[:62] == LABELS[:10] + LABELS[200:]
    assert all(len(label) == 2 and label.isalpha() for label in alphabet[62:])
    assert alphabet[62:65] == ("aa", "ab", "ac")
    ids = label_token_ids(digit_tokenizer)
    assert len(set(ids)) == len(LABELS)
    context = digit_tokenizer.encode("5. move north\n" + ACTION_MARKER, add_special_tokens=False)
    for label, token in zip(alphabet, ids):
        assert digit_tokenizer.encode("5. move north\n" + ACTION_MARKER + label, add_special_tokens=False) == [
            *context, token]
    with pytest.raises(ValueError, match="choice labels are not one token"):
        label_token_ids(digit_tokenizer, LABELS)


def test_the_alphabet_is_deterministic(digit_model, digit_tokenizer):
    assert label_alphabet(models.load_tokenizer(digit_model)) == label_alphabet(digit_tokenizer)


def test_a_tokenizer_without_enough_labels_stops_with_one_line(tmp_path):
    from transformers import GPT2Config, GPT2Tokenizer

    vocab = {chr(c): i for i, c in enumerate(range(33, 127))}
    vocab.update({"Ġ": len(vocab), "Ċ": len(vocab) + 1, "<|endoftext|>": len(vocab) + 2})
    GPT2Tokenizer(vocab=vocab, merges=[], eos_token="<|endoftext|>").save_pretrained(tmp_path)
    GPT2Config(vocab_size=len(vocab)).save_pretrained(tmp_path)
    with pytest.raises(ValueError) as error:
        models.load_tokenizer(str(tmp_path))
    message = str(error.value)
    assert "\n" not in message and str(tmp_path) in message and "only 62 choice labels" in message


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("env_name", ["taxi", "auto_explore"])
def test_relabel_gives_what_the_env_shows_with_the_alphabet(digit_tokenizer, env_name, shuffle, tmp_path):
    alphabet = label_alphabet(digit_tokenizer)
    kwargs, options = {"shuffle_action": shuffle}, {}
    if env_name == "auto_explore":
        repo = tmp_path / "repo"
        for i in range(40):  # more actions than the paper's one-digit labels
            (repo / f"dir{i:02d}").mkdir(parents=True)
            (repo / f"file{i:02d}.txt").write_text(f"{i}\n")
        options = {"task": {"question": "Which file says 7?", "filename": "file07.txt", "root": str(repo)}}
    paper, ours = make_env(env_name, **kwargs), make_env(env_name, labels=alphabet, **kwargs)
    obs, info = paper.reset(seed=4, options=options)
    relabelled, their_info = ours.reset(seed=4, options=options)
    if env_name == "auto_explore":
        assert len(info["labels"]) > 62
    for _ in range(3):
        assert relabel(obs, paper.action_head, alphabet) == relabelled
        assert [alphabet[LABELS.index(label)] for label in info["labels"]] == their_info["labels"]
        action = info["actions"][0]
        obs, *_, info = paper.step(paper.label_of(action))
        relabelled, *_, their_info = ours.step(ours.label_of(action))
    assert relabel(obs, paper.action_head, LABELS) is obs


def test_label_file_mismatch_names_both_sides(tmp_path, digit_tokenizer):
    alphabet = label_alphabet(digit_tokenizer)
    write_label_file(tmp_path, alphabet, "digits-model")
    assert json.loads((tmp_path / LABEL_FILE).read_text())["labels"] == list(alphabet)
    check_label_file(tmp_path, alphabet, "digits-model", "checkpoint")
    with pytest.raises(ValueError) as error:
        check_label_file(tmp_path, LABELS, "tiny-gpt2", "checkpoint")
    message = str(error.value)
    assert "\n" not in message
    assert "'digits-model'" in message and "'tiny-gpt2'" in message and "label 10: 'a' there, '10' here" in message
    with pytest.raises(ValueError, match="the paper's labels"):
        check_label_file(tmp_path / "nothing", alphabet, "digits-model", "--task_file's folder")


def test_rollout_refuses_envs_with_other_labels(digit_model, make_args):
    from rollout import EpisodeStart, TwoPlayerRollout

    args = make_args(model_name=digit_model)
    policy, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args), trainable=False)
    rollout = TwoPlayerRollout.from_args(args, policy, tokenizer)
    import numpy as np

    with pytest.raises(ValueError, match="labels=rollout.labels"):
        rollout.run([make_env("taxi")], [EpisodeStart(seed=0, options={})], np.random.default_rng(0))
    episode, = rollout.run([make_env("taxi", labels=rollout.labels)], [EpisodeStart(seed=0, options={})],
                           np.random.default_rng(0))
    assert episode.decisions


def test_pipeline_with_a_digit_splitting_model(digit_model, make_args, tmp_path):
    """gen_sft writes the model's labels and labels.json; SFT checks them and saves them; RL
    and evaluation read them; a checkpoint or data of another alphabet stops with one line."""
    import rl_finetune
    import supervised_pretrain
    from data_gen.taxi import gen_sft, reflection
    from evaluation import evaluate

    data = tmp_path / "data"
    assert reflection.main(make_args(env="taxi", api="oracle", num_episodes=4, output_dir=str(data))) == 0
    assert gen_sft.main(make_args(env="taxi", model_name=digit_model, task_file=str(data / "data_reflection.json"))) == 0
    saved = json.loads((data / LABEL_FILE).read_text())
    assert saved == {"model": digit_model, "labels": list(label_alphabet(models.load_tokenizer(digit_model)))}
    policy_text = json.loads((data / "sft_policy.jsonl").read_text().splitlines()[0])["text"]
    assert "\na. " in policy_text or "\n0. " in policy_text

    # SFT on data of another alphabet stops before training
    with pytest.raises(ValueError, match=r"uses the choice labels of model .* but model 'tiny-gpt2' uses other"):
        supervised_pretrain.main(make_args(model_name="tiny-gpt2", task_file=str(data / "sft_policy.jsonl"),
                                           max_steps=1))
    sft = dict(model_name=digit_model, max_steps=2, save_steps=2, per_device_train_batch_size=2,
               max_seq_length=512)
    assert supervised_pretrain.main(make_args(task_file=str(data / "sft_policy.jsonl"), **sft)) == 0
    assert supervised_pretrain.main(make_args(task_file=str(data / "sft_reflection.jsonl"), **sft)) == 0
    policy_ckpt, reflect_ckpt = sorted(Path(make_args().ckpt_path).glob("*_supervised_pretrain/checkpoint-2"))
    assert json.loads((policy_ckpt / LABEL_FILE).read_text())["labels"] == saved["labels"]

    rl = dict(model_name=digit_model, env="taxi", load_dir=str(policy_ckpt), reflect_load_dir=str(reflect_ckpt),
              max_steps=1, save_steps=1, per_device_eval_batch_size=2, horizon=3, reflect_max_new_tokens=4,
              max_seq_length=512, eval_steps=0)
    assert rl_finetune.main(make_args(**rl)) == 0
    rl_ckpt = next(Path(make_args().ckpt_path).glob("*_rl_finetune/checkpoint-1"))
    assert json.loads((rl_ckpt / LABEL_FILE).read_text())["labels"] == saved["labels"]
    episodes = [json.loads(line) for line in (rl_ckpt / "episodes.jsonl").read_text().splitlines()]
    assert all(step["label"] < 6 for e in episodes for step in e["steps"])

    result = evaluate.run(make_args(model_name=digit_model, env="taxi", eval_reps=1, horizon=3, max_seq_length=512,
                                    per_device_eval_batch_size=2, taxi_curriculum=True, curriculum_index=0,
                                    reflect_max_new_tokens=4),
                          [{"load_dir": str(rl_ckpt), "reflect_load_dir": str(reflect_ckpt), "name": "ours"}])
    assert result.results[0]["levels"]["all"]["episodes"] == 1

    # the same checkpoint under a model with other labels: one line naming both
    with pytest.raises(ValueError) as error:
        rl_finetune.main(make_args(**{**rl, "model_name": "tiny-gpt2"}))
    assert "\n" not in str(error.value) and "checkpoint" in str(error.value) and digit_model in str(error.value)


@pytest.mark.slow
def test_enumeration_benchmark_on_a_model_with_its_own_alphabet(digit_model, capsys):
    """Two list sizes, two decisions each (--runs=1 means the default 7)."""
    from benchmarks import enumeration

    assert enumeration.command_line([f"--model_name={digit_model}", "--runs=2", "--actions", "6", "20"]) == 0
    assert torch.is_grad_enabled()  # the benchmark leaves the caller's grad mode as it was
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [int(row.split("|")[1]) for row in rows] == [6, 20]


def _poor_model(folder) -> str:
    """A character-level tokenizer: 62 single-token labels at most, 252 needed."""
    from transformers import GPT2Config, GPT2Tokenizer

    vocab = {chr(c): i for i, c in enumerate(range(33, 127))}
    vocab.update({"Ġ": len(vocab), "Ċ": len(vocab) + 1, "<|endoftext|>": len(vocab) + 2})
    GPT2Tokenizer(vocab=vocab, merges=[], eos_token="<|endoftext|>").save_pretrained(folder)
    GPT2Config(vocab_size=len(vocab)).save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("case", ["too few labels", "data of another alphabet", "checkpoint of another alphabet"])
def test_entry_points_stop_with_one_line(case, digit_model, tmp_path, monkeypatch, capsys):
    import supervised_pretrain
    from experiment_args import run_script

    data = tmp_path / "sft_policy.jsonl"  # no labels.json beside it: the paper's labels
    text = "state\nThe actions you can take now is:\n0. go\n1. stay\n" + ACTION_MARKER + "1"
    data.write_text(json.dumps({"text": text}) + "\n")
    flags = [f"--task_file={data}", "--max_steps=1", f"--ckpt_path={tmp_path / 'results'}"]
    if case == "too few labels":
        flags.append(f"--model_name={_poor_model(tmp_path / 'poor')}")
    elif case == "data of another alphabet":
        flags.append(f"--model_name={digit_model}")
    else:
        write_label_file(tmp_path, label_alphabet(models.load_tokenizer(digit_model)), digit_model)
        flags += ["--model_name=tiny-gpt2", f"--load_dir={tmp_path}"]
    monkeypatch.setattr("sys.argv", ["supervised_pretrain.py", *flags])
    assert run_script(supervised_pretrain.main, "supervised_pretrain.py") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    line = err[-1]
    assert line.startswith("supervised_pretrain.py: error: ")
    expected = {"too few labels": "supplies only 62 choice labels", "data of another alphabet": "the paper's labels",
                "checkpoint of another alphabet": "uses the choice labels of model"}[case]
    assert expected in line


@pytest.mark.parametrize("name", ["gpt2-xl", "openai-community/gpt2", "distilgpt2"])
def test_gpt2_hub_models_use_the_papers_labels_without_a_download(name, monkeypatch):
    def no_hub(*args, **kwargs):
        raise AssertionError("the tokenizer should not be loaded")

    monkeypatch.setattr(models, "load_tokenizer", no_hub)
    assert models.policy_labels(name) == LABELS


def test_a_models_labels_are_read_once_while_its_tokenizer_files_stay(digit_model, monkeypatch, tmp_path):
    """A run asks for its model's labels for every checkpoint it checks: the tokenizer is read the first time
    only, and again once its files change (another tokenizer saved in the folder)."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(digit_model, folder)
    loads = []
    real = models.load_tokenizer
    monkeypatch.setattr(models, "load_tokenizer", lambda name: loads.append(name) or real(name))
    first = models.policy_labels(str(folder))
    assert models.policy_labels(str(folder)) == first and len(loads) == 1
    assert first == label_alphabet(models.load_tokenizer(digit_model)) != LABELS
    gpt2 = models.load_tokenizer("tiny-gpt2")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    gpt2.save_pretrained(folder)  # the folder now holds a GPT-2 tokenizer: the paper's labels
    loads.clear()
    assert models.policy_labels(str(folder)) == LABELS and len(loads) == 1
