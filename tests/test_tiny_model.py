"""tiny-gpt2: deterministic offline build, labels and markers tokenise as required."""

import filecmp

import pytest
import torch

from prompts import ACTION_MARKER, ANALYZE_MARKER, LABELS, label_alphabet, label_token_ids
from utils import tiny_gpt2


def test_build_is_deterministic(tmp_path, tiny_path):
    tiny_gpt2.build(tmp_path / "again")
    names = sorted(p.name for p in tiny_path.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "again").iterdir())
    for name in names:
        assert filecmp.cmp(tiny_path / name, tmp_path / "again" / name, shallow=False), name


def test_a_build_replaces_a_folder_cut_short(tmp_path, tiny_path):
    broken = tmp_path / "cut"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{}")  # a copy cut short: no config.json, no weights
    tiny_gpt2.build(broken)
    assert sorted(p.name for p in broken.iterdir()) == sorted(p.name for p in tiny_path.iterdir())
    assert filecmp.cmp(broken / "tokenizer.json", tiny_path / "tokenizer.json", shallow=False)


def test_cached_build_is_reused(tiny_path):
    assert tiny_gpt2.tiny_gpt2_path() == tiny_path


def test_every_label_is_one_token(tiny_tokenizer):
    ids = label_token_ids(tiny_tokenizer)
    assert len(ids) == len(set(ids)) == len(LABELS)
    for label, token in zip(LABELS, ids):
        assert tiny_tokenizer.decode([token]) == label


@pytest.mark.parametrize("marker", [ANALYZE_MARKER, ACTION_MARKER])
def test_markers_end_at_a_token_boundary(tiny_tokenizer, marker):
    state = "--- Current State ---\n+---------+\n"
    prompt = tiny_tokenizer.encode(state + marker)
    for completion in ("3", "The taxi should move north.", "Z"):
        assert tiny_tokenizer.encode(state + marker + completion)[: len(prompt)] == prompt


def test_tokenizer_pads_left_with_eos(tiny_tokenizer):
    assert tiny_tokenizer.padding_side == "left"
    assert tiny_tokenizer.pad_token == tiny_tokenizer.eos_token


def test_bad_tokenizer_lists_offending_labels(tiny_tokenizer):
    from transformers import GPT2Tokenizer

    vocab = {chr(c): i for i, c in enumerate(range(33, 127))}
    vocab.update({"Ġ": len(vocab), "Ċ": len(vocab) + 1, "<|endoftext|>": len(vocab) + 2})
    poor = GPT2Tokenizer(vocab=vocab, merges=[], eos_token="<|endoftext|>")
    with pytest.raises(ValueError) as error:
        label_token_ids(poor, LABELS)
    message = str(error.value)
    assert "'10'" in message and "'199'" in message and "'a'" not in message
    with pytest.raises(ValueError, match=r"supplies only 62 choice labels .* 252 are needed") as error:
        label_alphabet(poor)
    assert "\n" not in str(error.value)


def test_round_trip_through_save_and_load(tmp_path, tiny_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    model.save_pretrained(tmp_path / "copy")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "copy")
    x = torch.arange(20).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(model(x).logits, again(x).logits)
