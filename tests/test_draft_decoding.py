"""Drafted greedy decoding (``utils/draft_decoding.py``, ``--draft_tokens``): the lookup of guesses, and the
same tokens as transformers' greedy ``generate`` whether every guess is right, some are, or none is given,
on a llama (rotary positions) and a GPT-2 (learned positions), in float32; then in the rollout."""

import json

import numpy as np
import pytest
import torch
from transformers import DynamicCache, GenerationConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from envs import make_env
from rollout import EpisodeStart, TwoPlayerRollout, pad_left
from utils import models
from utils.draft_decoding import MAX_NGRAM, DraftStats, draft_after, draft_source, greedy_with_drafts
from utils.kv_cache import PrefixKV

VOCAB, PAD = 96, 0


def test_a_draft_follows_the_first_occurrence_of_the_longest_match():
    #          0  1  2  3  4  5  6  7  8  9
    source = [5, 6, 7, 8, 9, 1, 7, 2, 3, 6, 7]
    assert draft_after(source, 3) == [8, 9, 1]  # "6 7" first occurs at 1; longer runs do not occur before
    assert draft_after(source, 1) == [8]
    assert draft_after([1, 2, 3, 9, 2, 3], 4) == [9, 2, 3]  # the run "2 3" rather than "3" alone
    assert draft_after([4, 5, 6], 2) == []  # the last token occurs nowhere earlier
    assert draft_after([4, 4], 5) == [4]  # never past the source's end
    assert draft_after([1, 2, 1, 2], 0) == []
    assert draft_after([], 3) == [] and draft_after([7], 3) == []


def test_the_source_puts_the_prompt_end_before_the_hint_and_again_after_it():
    prompt = [10, 11, 12, 13, 14]
    source = draft_source(prompt, [20, 21, 22])
    assert source == [12, 13, 14, 20, 21, 22, 12, 13, 14]
    # the first generated token, if the hint's first, drafts the rest of the hint
    assert draft_after(source + [20], 5) == [21, 22, 12, 13, 14]
    assert draft_source(prompt, None) == prompt[-MAX_NGRAM:] and draft_source([3], []) == [3]


def _llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=PAD, initializer_range=0.3)
    return LlamaForCausalLM(config).eval()


def _gpt2():
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=256, pad_token_id=PAD,
                        initializer_range=0.3)
    return GPT2LMHeadModel(config).eval()


class _Tokenizer:
    """What ``pad_left`` reads of a tokenizer."""
    pad_token_id = PAD


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(3)
    return [list(rng.integers(1, VOCAB, size=n)) for n in (9, 4, 13, 7, 11)]


def _generated(model, prompts, max_new, stops) -> list[list[int]]:
    """Greedy ``generate``: each row's new tokens up to and with its first stop."""
    encoded = pad_left(_Tokenizer, prompts, 0, torch.device("cpu"))
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new, eos_token_id=stops, pad_token_id=PAD)
    with torch.no_grad():
        out = model.generate(input_ids=encoded.inputs["input_ids"], attention_mask=encoded.inputs["attention_mask"],
                             generation_config=config)
    rows = []
    for row in out[:, encoded.inputs["input_ids"].shape[1]:].tolist():
        ends = [i for i, token in enumerate(row) if token in stops]
        rows.append(row[:ends[0] + 1] if ends else row)
    return rows


def _drafted(model, prompts, hints, max_new, stops, draft_tokens, stats=None, prefix=None):
    if prefix is not None:  # the rollout's shared-prefix layout: the prefix's keys and values already cached
        prepared = prefix.prepare(prompts, PAD, torch.device("cpu"))
        inputs = dict(input_ids=prepared.input_ids[:, prepared.prefix:], attention_mask=prepared.attention_mask,
                      position_ids=prepared.position_ids, cache=prepared.cache)
    else:
        encoded = pad_left(_Tokenizer, prompts, 0, torch.device("cpu"))
        inputs = dict(encoded.inputs, cache=DynamicCache(config=model.config))
    return greedy_with_drafts(model, **inputs, sources=[draft_source(p, h) for p, h in zip(prompts, hints)],
                              max_new_tokens=max_new, stop_ids=stops, draft_tokens=draft_tokens, pad_id=PAD,
                              stats=stats)


@pytest.mark.parametrize("build", [_llama, _gpt2])
@pytest.mark.parametrize("draft_tokens", [1, 3, 8])
def test_drafted_decoding_gives_generates_tokens_whatever_the_guesses(build, draft_tokens):
    model, prompts, max_new = build(), _prompts(), 24
    plain = _generated(model, prompts, max_new, stops=[VOCAB + 5])  # no stop: every row runs to the cap
    # a stop token some rows write early and others late or never, so rows leave the batch one by one
    stops = [plain[0][5]]
    reference = _generated(model, prompts, max_new, stops)
    assert len({len(row) for row in reference}) > 1
    right = DraftStats()
    # every guess right: each row's own text as its hint
    assert _drafted(model, prompts, reference, max_new, stops, draft_tokens, right) == reference
    assert right.accepted > 0 and right.passes < max(map(len, reference)) - 1
    # some guesses wrong: the hint's tokens changed every fifth place
    wrong = [[t if i % 5 else (t + 1) % VOCAB for i, t in enumerate(row)] for row in reference]
    partly = DraftStats()
    assert _drafted(model, prompts, wrong, max_new, stops, draft_tokens, partly) == reference
    assert partly.accepted < partly.drafted
    # no hint: guesses from the text so far only
    assert _drafted(model, prompts, [None] * len(prompts), max_new, stops, draft_tokens) == reference
    assert _drafted(model, prompts, reference, 1, stops, draft_tokens) == [row[:1] for row in reference]


def test_drafted_decoding_after_a_shared_prefix():
    model = _llama()
    head = [7, 8, 9, 10, 11, 12, 13, 14, 15]
    prompts = [head + tail for tail in ([20, 21], [30], [40, 41, 42])]
    reference = _generated(model, prompts, 16, stops=[VOCAB + 5])
    prefix = PrefixKV(model)
    stats = DraftStats()
    assert _drafted(model, prompts, reference, 16, [VOCAB + 5], 4, stats, prefix=prefix) == reference
    assert prefix.saved_tokens > 0 and stats.accepted > 0


# --- in the rollout: a GPT-2 reflector with random weights (tiny-gpt2 writes an empty line at once)

@pytest.fixture(scope="module")
def players():
    from experiment_args import ScriptArguments

    args = ScriptArguments(model_name="tiny-gpt2", load_in_8bit=False, bf16=False)
    policy, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args), shrink_head=True)
    policy.eval()
    torch.manual_seed(1)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=1024,
                        initializer_range=0.5, pad_token_id=tokenizer.pad_token_id)
    reflector = GPT2LMHeadModel(config).eval().requires_grad_(False)
    return policy, tokenizer, reflector


def _play(players, **switches):
    policy, tokenizer, reflector = players
    rollout = TwoPlayerRollout(policy, tokenizer, reflector=reflector, reflect_tokenizer=tokenizer, top_k=1,
                               reflect_max_new_tokens=12, reflection_memo=False, **switches)
    envs = [make_env("taxi", horizon=4, labels=rollout.labels) for _ in range(6)]
    rng, episodes = np.random.default_rng(0), []
    for round_ in range(2):
        starts = [EpisodeStart(seed=round_ * 6 + i, options={"curriculum": "pickup"}) for i in range(6)]
        episodes += [json.dumps(e.to_dict(), sort_keys=True) for e in rollout.run(envs, starts, rng)]
    return rollout, episodes


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_drafted_reflections_keep_the_episodes(players, prefix_cache):
    plain, reference = _play(players, prefix_cache=prefix_cache)
    drafted, episodes = _play(players, prefix_cache=prefix_cache, draft_tokens=4)
    assert plain.draft_tokens == 0 and plain.stats.drafts.passes == 0
    assert drafted.stats.drafts.drafted > 0 and drafted.stats.drafts.passes > 0
    reflections = [d["reflection"] for e in episodes for d in json.loads(e)["decisions"]]
    assert len(set(reflections)) > 3 and all(r.strip() for r in reflections)  # real texts, not empty lines
    if prefix_cache:  # the prefix's keys and values, then rounding: the same choices, log-probs to rounding
        for ours, theirs in zip(episodes, reference, strict=True):
            ours, theirs = json.loads(ours)["decisions"], json.loads(theirs)["decisions"]
            assert [(d["action"], d["reflection"]) for d in ours] == [(d["action"], d["reflection"]) for d in theirs]
    else:
        assert episodes == reference  # byte for byte


def test_the_flag_reaches_the_rollout_and_needs_greedy_reflections(players):
    from experiment_args import parse_args
    from utils.errors import UsageError

    policy, tokenizer, reflector = players

    def rollout(*flags):
        args = parse_args(["--model_name=tiny-gpt2", "--env=taxi", *flags])
        return TwoPlayerRollout.from_args(args, policy, tokenizer, reflector, tokenizer)

    assert rollout("--top_k=1").draft_tokens == 4  # the default
    assert rollout("--top_k=1", "--draft_tokens=7").draft_tokens == 7
    assert rollout("--top_k=1", "--draft_tokens=0").draft_tokens == 0
    assert rollout("--top_k=0").draft_tokens == 0  # sampled reflections: generate draws them
    assert rollout("--top_k=1", "--no_argmax_top1").draft_tokens == 0
    assert rollout("--top_k=1", "--static_cache").draft_tokens == 0
    with pytest.raises((UsageError, SystemExit)):
        rollout("--draft_tokens=-1")
