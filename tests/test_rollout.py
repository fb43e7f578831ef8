"""The two-player rollout with tiny-gpt2 on Taxi: valid episodes, exact log-probs, batching, replay, the
reflection memo, the key/value caches."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from envs import make_env
from prompts import ACTION_MARKER, ANALYZE_MARKER, LABELS, clean_reflection, policy_prompt, reflection_prompt
from rollout import Episode, EpisodeStart, PolicyScorer, TwoPlayerRollout
from utils import lm_head, models
from utils.kv_cache import PrefixKV, WeightsMemo, shared_length
from utils.packed_weights import available as packed_weights_available

# Exactness is claimed in float32 without quantisation, on any device: a CUDA machine's defaults (8-bit
# bitsandbytes, bf16) make a row's numbers depend on the rest of its batch (LLM.int8's outlier columns).
EXACT = dict(model_name="tiny-gpt2", load_in_8bit=False, bf16=False)


@pytest.fixture(scope="module")
def players():
    from experiment_args import ScriptArguments

    args = ScriptArguments(**EXACT)
    torch.manual_seed(0)
    policy, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args), shrink_head=True)
    with torch.no_grad():  # a non-trivial adapter, so the policy is not uniform
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.2)
    policy.eval()
    reflector, reflect_tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args),
                                                                   trainable=False)
    return policy, tokenizer, reflector, reflect_tokenizer


def _run(players, count=6, reflect=True, shuffle=True, seed=0, **kw):
    policy, tokenizer, reflector, reflect_tokenizer = players
    rollout = TwoPlayerRollout(policy, tokenizer, reflector=reflector if reflect else None,
                               reflect_tokenizer=reflect_tokenizer, reflect_max_new_tokens=12, **kw)
    envs = [make_env("taxi", shuffle_action=shuffle, horizon=6) for _ in range(count)]
    starts = [EpisodeStart(seed=100 + i, options={"curriculum": "full"}) for i in range(count)]
    return rollout, envs, rollout.run(envs, starts, np.random.default_rng(seed))


def test_episodes_are_valid_and_reproducible(players):
    rollout, envs, episodes = _run(players)
    assert len(episodes) == 6 and rollout.stats.decisions == sum(len(e.decisions) for e in episodes)
    for episode in episodes:
        assert 1 <= len(episode.decisions) <= 6
        assert episode.cost == pytest.approx(sum(episode.costs()))
        for decision in episode.decisions:
            assert decision.action in decision.valid and len(decision.valid) == 6
            assert decision.prompt == policy_prompt(decision.obs, envs[0].action_head, decision.reflection)
            assert decision.reflection.endswith("\n") and ACTION_MARKER.strip() not in decision.reflection
            assert decision.prompt.endswith(ACTION_MARKER) and ANALYZE_MARKER in decision.prompt
    again = _run(players)[2]
    assert [e.to_dict() for e in again] == [e.to_dict() for e in episodes]
    other = _run(players, seed=1)[2]
    assert [e.to_dict() for e in other] != [e.to_dict() for e in episodes]


def test_the_rollout_clocks_each_players_calls(players, monkeypatch):
    """``reflect_seconds`` holds the time of the reflector's calls, ``policy_seconds`` the policy's: on a fake
    clock that each reflector forward pass moves by 1 s and each policy pass by 1000 s."""
    import types

    from rollout import records as rollout_records

    policy, _, reflector, _ = players
    clock = {"now": 0.0}
    calls = {"reflector": 0, "policy": 0}
    monkeypatch.setattr(rollout_records, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"]))
    for name, model, seconds in (("reflector", reflector, 1.0), ("policy", policy, 1000.0)):
        def ticking(*args, _forward=model.forward, _name=name, _seconds=seconds, **kwargs):
            calls[_name] += 1
            clock["now"] += _seconds
            return _forward(*args, **kwargs)
        monkeypatch.setattr(model, "forward", ticking)
    rollout, _, episodes = _run(players, count=3)
    assert calls["reflector"] > len(episodes[0].decisions) and calls["policy"] > 0
    assert rollout.stats.reflect_seconds == calls["reflector"] * 1.0
    assert rollout.stats.policy_seconds == calls["policy"] * 1000.0


def test_invalid_labels_are_never_chosen(players):
    _, _, episodes = _run(players, count=8, reflect=False, shuffle=True)
    chosen = [LABELS[d.action] for e in episodes for d in e.decisions]
    assert chosen and all(d.action in d.valid for e in episodes for d in e.decisions)
    assert not set(chosen) <= set("012345")  # shuffled labels really were used


def test_stored_logprobs_equal_a_fresh_recomputation(players):
    policy, tokenizer, *_ = players
    _, _, episodes = _run(players)
    decisions = [d for e in episodes for d in e.decisions]
    scorer = PolicyScorer(policy, tokenizer, max_seq_length=1024, temperature=1.0)
    with torch.no_grad():
        logp = scorer.logprobs([d.prompt for d in decisions], [d.valid for d in decisions]).logprobs
    logp = logp.cpu()
    fresh = logp[torch.arange(len(decisions)), torch.tensor([d.action for d in decisions])]
    torch.testing.assert_close(fresh, torch.tensor([d.logprob for d in decisions]), atol=1e-5, rtol=1e-5)
    entropy = -(logp.exp() * logp.masked_fill(logp.isinf(), 0)).sum(-1)
    torch.testing.assert_close(entropy, torch.tensor([d.entropy for d in decisions]), atol=1e-5, rtol=1e-5)
    assert all(torch.isinf(logp[i, j]) for i, d in enumerate(decisions) for j in range(len(LABELS))
               if j not in d.valid)


def test_prompt_in_a_padded_batch_scores_as_alone(players):
    policy, tokenizer, *_ = players
    scorer = PolicyScorer(policy, tokenizer, max_seq_length=1024, temperature=0.7)
    env = make_env("taxi", with_history=True)
    obs, info = env.reset(seed=3)
    short = policy_prompt(obs, env.action_head)
    for _ in range(3):
        obs, _, _, _, info = env.step(info["oracle_label"])
    long = policy_prompt(obs, env.action_head, "Head south now.")
    valid = [scorer.label_index[label] for label in info["labels"]]
    with torch.no_grad():
        batch = scorer.logprobs([short, long], [valid, valid]).logprobs
        alone_short = scorer.logprobs([short], [valid]).logprobs
        alone_long = scorer.logprobs([long], [valid]).logprobs
    assert len(tokenizer(long)["input_ids"]) > len(tokenizer(short)["input_ids"]) + 50
    torch.testing.assert_close(batch[0, valid], alone_short[0, valid], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batch[1, valid], alone_long[0, valid], atol=1e-5, rtol=1e-5)


def test_full_head_gives_the_same_label_distribution(players):
    policy, tokenizer, *_ = players
    scorer = PolicyScorer(policy, tokenizer, max_seq_length=1024, temperature=1.0)
    env = make_env("taxi")
    obs, info = env.reset(seed=5)
    valid = [scorer.label_index[label] for label in info["labels"]]
    prompt = policy_prompt(obs, env.action_head)
    with torch.no_grad():
        shrunk = scorer.logprobs([prompt], [valid]).logprobs
        with lm_head.full_head(policy):
            full = scorer.logprobs([prompt], [valid]).logprobs
    torch.testing.assert_close(shrunk, full)


def test_left_truncation_is_counted(players):
    policy, tokenizer, *_ = players
    rollout = TwoPlayerRollout(policy, tokenizer, max_seq_length=40)
    env = make_env("taxi")
    episodes = rollout.run([env], [EpisodeStart(seed=1, options={})], np.random.default_rng(0))
    assert rollout.stats.truncated == len(episodes[0].decisions) > 0


def test_without_reflection_prompts_have_no_analysis(players):
    _, envs, episodes = _run(players, reflect=False)
    for decision in (d for e in episodes for d in e.decisions):
        assert decision.reflection is None and decision.prompt == decision.obs + ACTION_MARKER


def test_reflect_prob_mixes_prompts(players):
    _, _, episodes = _run(players, count=8, reflect_prob=0.5)
    kinds = {d.reflection is None for e in episodes for d in e.decisions}
    assert kinds == {True, False}


def test_replay_recreates_the_branch_state_with_the_same_reflection(players):
    rollout, envs, episodes = _run(players, count=4)
    longest = max(episodes, key=lambda e: len(e.decisions))
    h = len(longest.decisions) - 1
    start = EpisodeStart(seed=longest.seed, options=longest.options, replay=longest.decisions[:h + 1])
    branch = rollout.run([envs[0]], [start], np.random.default_rng(7))[0]
    for t in range(h):
        assert branch.decisions[t] == longest.decisions[t]
    assert branch.decisions[h].obs == longest.decisions[h].obs
    assert branch.decisions[h].reflection == longest.decisions[h].reflection
    assert branch.decisions[h].prompt == longest.decisions[h].prompt


def test_replay_divergence_is_detected(players):
    rollout, envs, episodes = _run(players, count=2)
    episode = max(episodes, key=lambda e: len(e.decisions))
    tampered = [dataclasses.replace(d) for d in episode.decisions]
    tampered[0] = dataclasses.replace(tampered[0], obs=tampered[0].obs + "x")
    with pytest.raises(RuntimeError, match="diverged"):
        rollout.run([envs[0]], [EpisodeStart(seed=episode.seed, options=episode.options, replay=tampered)],
                    np.random.default_rng(0))


def test_episode_round_trips_through_json(players):
    _, _, episodes = _run(players, count=2)
    for episode in episodes:
        assert Episode.from_dict(json.loads(json.dumps(episode.to_dict()))) == episode


def test_greedy_rollout_picks_the_argmax(players):
    policy, tokenizer, *_ = players
    rollout = TwoPlayerRollout(policy, tokenizer, greedy=True)
    env = make_env("taxi")
    episode = rollout.run([env], [EpisodeStart(seed=2, options={})], np.random.default_rng(0))[0]
    scorer = PolicyScorer(policy, tokenizer, 1024, 1.0)
    with torch.no_grad():
        logp = scorer.logprobs([episode.decisions[0].prompt], [episode.decisions[0].valid]).logprobs
    assert episode.decisions[0].action == int(logp.argmax())


def test_top_k_one_gives_greedy_reflections(players):
    """--top_k 1 reflects greedily whatever the seed; without it the seed changes the text."""
    policy, tokenizer, reflector, reflect_tokenizer = players
    env = make_env("taxi")
    obs, _ = env.reset(seed=3)
    prompt = [reflection_prompt(obs, env.action_head, env.analyze_instruction)]

    def reflect(seed, **kw):
        rollout = TwoPlayerRollout(policy, tokenizer, reflector=reflector, reflect_tokenizer=reflect_tokenizer,
                                   reflect_max_new_tokens=12, **kw)
        return rollout.reflect(prompt, seed)[0]

    greedy = TwoPlayerRollout(policy, tokenizer, reflector=reflector, reflect_tokenizer=reflect_tokenizer,
                              reflect_max_new_tokens=12, greedy=True).reflect(prompt, 0)[0]
    assert reflect(0, top_k=1) == reflect(1, top_k=1) == greedy
    assert len({reflect(seed) for seed in range(4)}) > 1
    assert len({reflect(seed, top_p=1e-6) for seed in range(4)}) == 1  # a tiny nucleus is greedy too


def test_saycan_scores_with_and_without_the_cache_agree(players):
    from benchmarks.saycan import SayCanScorer

    policy, tokenizer, *_ = players
    env = make_env("taxi")
    obs, info = env.reset(seed=4)
    state = obs.split(env.action_head)[0] + ACTION_MARKER
    with lm_head.full_head(policy):
        plain, cached = SayCanScorer(policy, tokenizer, cache=False), SayCanScorer(policy, tokenizer, cache=True)
        uncached_scores = plain.scores(state, info["actions"])
        cached_scores = cached.scores(state, info["actions"])
        # by hand, for the first action
        ids = tokenizer(state + info["actions"][0], add_special_tokens=False)["input_ids"]
        n_state = len(tokenizer(state, add_special_tokens=False)["input_ids"])
        with torch.no_grad():
            logp = torch.log_softmax(policy(torch.tensor([ids], device=policy.device)).logits[0], -1)
        by_hand = sum(float(logp[t - 1, ids[t]]) for t in range(n_state, len(ids)))
    torch.testing.assert_close(cached_scores, uncached_scores, atol=1e-4, rtol=1e-4)
    assert float(uncached_scores[0]) == pytest.approx(by_hand, abs=1e-4)
    action_tokens = [len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in info["actions"]]
    assert plain.tokens == sum(n_state + n for n in action_tokens)
    assert cached.tokens == n_state + sum(action_tokens)


# --- the reflection memo (--reflection_memo): exact under greedy reflections, off by its flag, never used
# where a reflection is sampled, emptied when the reflector's weights change

def _play_memo(players, rounds=3, batch=8, **kw):
    """``rounds`` batches of Taxi pickup episodes (short: their states repeat across episodes), as RL
    plays its iterations, on one rollout object."""
    policy, tokenizer, reflector, reflect_tokenizer = players
    rollout = TwoPlayerRollout(policy, tokenizer, reflector=reflector, reflect_tokenizer=reflect_tokenizer,
                               reflect_max_new_tokens=10, **kw)
    envs = [make_env("taxi", horizon=4, labels=rollout.labels) for _ in range(batch)]
    rng = np.random.default_rng(0)
    episodes = []
    for round_ in range(rounds):
        starts = [EpisodeStart(seed=7 * round_ + i % 5, options={"curriculum": "pickup"}) for i in range(batch)]
        episodes += rollout.run(envs, starts, rng)
    return rollout, [json.dumps(e.to_dict(), sort_keys=True) for e in episodes]


def test_the_memo_gives_the_same_episodes_as_generating_every_reflection(players):
    remembered, with_memo = _play_memo(players, top_k=1)
    generated, without = _play_memo(players, top_k=1, reflection_memo=False)
    assert remembered.memo is not None and generated.memo is None
    assert with_memo == without  # byte for byte: every decision, reflection, log-prob
    assert remembered.stats.reflections == generated.stats.reflections > 0
    assert remembered.stats.reflection_hits > 0 and generated.stats.reflection_hits == 0
    assert 0 < remembered.stats.reflection_hit_rate < 1
    # the work saved shows in the tokens the reflector read
    assert remembered.stats.reflection_prompt_tokens < generated.stats.reflection_prompt_tokens


def test_no_memo_where_reflections_are_sampled(players):
    rollout, _ = _play_memo(players, rounds=1)  # temperature 1, no top-k: each seed its own text
    assert rollout.memo is None and rollout.stats.reflection_hits == 0


def test_the_flag_reaches_the_rollout(players):
    policy, tokenizer, reflector, reflect_tokenizer = players
    for flag, on in (("--reflection_memo", True), ("--no_reflection_memo", False)):
        from experiment_args import parse_args

        args = parse_args(["--model_name=tiny-gpt2", "--env=taxi", "--top_k=1", flag])
        rollout = TwoPlayerRollout.from_args(args, policy, tokenizer, reflector, reflect_tokenizer)
        assert (rollout.memo is not None) is on


def test_a_weights_memo_keeps_its_entries_until_an_in_place_change():
    """The base of the three memos (reflections, the policy's rows, PrefixKV's prefixes)."""
    layer = torch.nn.Linear(2, 2)
    memo = WeightsMemo(layer)
    memo.fresh()["prompt"] = 1
    assert memo.fresh() == {"prompt": 1} and memo.fresh() is memo  # no change: kept, however often it looks
    with torch.no_grad():
        layer.bias.add_(1.0)  # as an optimiser step
    assert memo.fresh() == {}
    memo["again"] = 2
    layer.load_state_dict(layer.state_dict())  # weights loaded in place (the same values) bump the counters too
    assert memo.fresh() == {}


def test_a_change_of_the_reflector_weights_empties_the_memo(players):
    from experiment_args import ScriptArguments

    policy, tokenizer, _, reflect_tokenizer = players
    reflector, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(ScriptArguments(**EXACT)),
                                                   trainable=False)
    rollout = TwoPlayerRollout(policy, tokenizer, reflector=reflector, reflect_tokenizer=reflect_tokenizer,
                               reflect_max_new_tokens=10, top_k=1)
    env = make_env("taxi", labels=rollout.labels)
    obs, _ = env.reset(seed=0)
    prompt = [obs + "\n"]
    first = rollout.reflect(prompt, 0)
    assert rollout.reflect(prompt, 1) == first and rollout.stats.reflection_hits == 1
    with torch.no_grad():
        next(reflector.parameters()).add_(1.0)  # an in-place change, as an optimiser step makes
    rollout.reflect(prompt, 2)
    assert rollout.stats.reflection_hits == 1  # generated again, not answered from the old weights' memo


# --- the key/value caches (--prefix_cache, --static_cache; utils/kv_cache.py): the same choices and
# reflections as without them, the static cache byte for byte; each off by its flag

def test_shared_length_leaves_each_row_a_token_of_its_own():
    assert shared_length([[1, 2, 3], [1, 2, 4, 5]]) == 2
    assert shared_length([[1, 2, 3], [1, 2, 3]]) == 2
    assert shared_length([[1, 2, 3, 4]]) == 3
    assert shared_length([[1, 2], [3, 4]]) == 0
    assert shared_length([[5], [5]]) == 0
    assert shared_length([]) == 0


def _prefixed_prompts(tokenizer, count=5):
    head = "You drive a taxi in a small town. Find the passenger, pick them up and drive on. " * 2
    prompts = [head + " ".join(["north"] * (i + 1)) + ANALYZE_MARKER for i in range(count)]
    return prompts, len(tokenizer(head, add_special_tokens=False)["input_ids"])


def test_a_shared_prefix_scores_as_the_whole_prompts():
    from experiment_args import ScriptArguments

    torch.manual_seed(0)
    policy, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(ScriptArguments(**EXACT)),
                                                        shrink_head=True)
    policy.eval()
    scorer = PolicyScorer(policy, tokenizer, 1024, 1.0)
    prompts, head = _prefixed_prompts(tokenizer)
    valid = [[0, 1, 2, 3]] * len(prompts)
    with torch.no_grad():
        whole = scorer.logprobs(prompts, valid, with_hidden=True)
        prefix = PrefixKV(policy)
        shared = scorer.logprobs(prompts, valid, with_hidden=True, prefix=prefix)
        assert torch.allclose(whole.logprobs, shared.logprobs, atol=1e-5)
        assert torch.allclose(whole.hidden, shared.hidden, atol=1e-4)
        assert shared.tokens == whole.tokens  # counted as read, though the prefix was read once
        assert head <= prefix.saved_tokens // (len(prompts) - 1) <= head + 1 and len(prefix.kept) == 1
        kept = prefix.kept[next(iter(prefix.kept))]
        scorer.logprobs(prompts, valid, prefix=prefix)
        assert prefix.kept[next(iter(prefix.kept))] is kept  # the same prefix is not read again
        next(p for n, p in policy.named_parameters() if "lora_B" in n).add_(0.5)  # an optimiser step
        moved = scorer.logprobs(prompts, valid, prefix=prefix)
    assert prefix.kept[next(iter(prefix.kept))] is not kept  # read again under the new weights
    assert not torch.allclose(moved.logprobs, whole.logprobs, atol=1e-5)


def test_rows_without_a_long_enough_prefix_are_read_whole(players):
    policy, tokenizer, *_ = players
    prefix = PrefixKV(policy)
    ids = [[1, 2, 3, 4], [1, 2, 9, 9, 9]]
    assert prefix.prepare(ids, tokenizer.pad_token_id, torch.device("cpu")) is None and prefix.saved_tokens == 0


def _episodes(played):
    return [json.loads(e)["decisions"] for e in played]


@pytest.mark.parametrize("top_k", [1, 0])  # greedy and sampled reflections
def test_the_caches_keep_the_episodes(players, top_k):
    off = dict(top_k=top_k, reflection_memo=False, prefix_cache=False, static_cache=False)
    plain, reference = _play_memo(players, **off)
    static, with_static = _play_memo(players, **{**off, "static_cache": True})
    assert with_static == reference  # byte for byte
    shared, with_prefix = _play_memo(players, **{**off, "prefix_cache": True})
    assert shared.reflect_prefix.saved_tokens > 0 and plain.reflect_prefix is None and plain.policy_prefix is None
    for ours, theirs in zip(_episodes(with_prefix), _episodes(reference), strict=True):
        assert [(d["action"], d["reflection"]) for d in ours] == [(d["action"], d["reflection"]) for d in theirs]
        assert np.allclose([d["logprob"] for d in ours], [d["logprob"] for d in theirs], atol=1e-5)


@pytest.mark.skipif(not packed_weights_available(), reason="this torch build has no oneDNN packed product")
def test_packed_reflector_weights_keep_the_episodes(players):
    """--packed_weights (utils/packed_weights.py): the same choices and reflections, log-probs equal to rounding
    (float32: another kernel), and the reflector's layers compute as before once a reflection is written."""
    off = dict(top_k=1, reflection_memo=False)
    plain, reference = _play_memo(players, **off)
    packed, with_packed = _play_memo(players, **off, packed_weights=True)
    assert plain.reflect_packed is None and len(packed.reflect_packed.packed) > 0
    for ours, theirs in zip(_episodes(with_packed), _episodes(reference), strict=True):
        assert [(d["action"], d["reflection"]) for d in ours] == [(d["action"], d["reflection"]) for d in theirs]
        assert np.allclose([d["logprob"] for d in ours], [d["logprob"] for d in theirs], atol=1e-5)
    assert not any("forward" in vars(m) for m in players[2].modules())


@pytest.mark.parametrize("top_k", [1, 0])  # greedy and sampled reflections
def test_the_policy_memo_keeps_the_episodes_and_reads_fewer_prompts(players, top_k):
    """--policy_memo: a prompt seen again (Taxi's states recur across a batch's episodes) is answered from memory;
    the same choices and reflections, log-probs equal to rounding (the row is not read again in another batch)."""
    plain, reference = _play_memo(players, top_k=top_k)
    memo, with_memo = _play_memo(players, top_k=top_k, policy_memo=True)
    assert plain.policy_memo is None and plain.stats.policy_hits == 0
    for ours, theirs in zip(_episodes(with_memo), _episodes(reference), strict=True):
        assert [(d["action"], d["reflection"]) for d in ours] == [(d["action"], d["reflection"]) for d in theirs]
        assert np.allclose([d["logprob"] for d in ours], [d["logprob"] for d in theirs], atol=1e-5)
    assert memo.stats.decisions == plain.stats.decisions > memo.stats.policy_hits
    if top_k == 1:  # greedy reflections: a recurring state's prompt recurs (sampled ones seldom write it again)
        assert memo.stats.policy_hits > 0
        assert memo.stats.policy_tokens < plain.stats.policy_tokens  # the prompts answered from memory were not read


def test_a_change_of_the_policy_weights_empties_its_memo(players):
    policy, tokenizer, _, _ = players
    rollout = TwoPlayerRollout(policy, tokenizer, policy_memo=True)
    env = make_env("taxi", labels=rollout.labels)
    obs, info = env.reset(seed=0)
    prompts, valid = [obs + "\n"] * 2, [[rollout.scorer.label_index[label] for label in info["labels"]]] * 2
    first = rollout.act(prompts, valid, torch.Generator().manual_seed(0))
    assert rollout.stats.policy_hits == 1  # the same prompt twice in one batch: read once
    weight = next(p for p in policy.parameters() if p.requires_grad)
    with torch.no_grad():
        weight.add_(1.0)  # an in-place change, as an optimiser step makes
    try:
        moved = rollout.act(prompts[:1], valid[:1], torch.Generator().manual_seed(0))
    finally:
        with torch.no_grad():
            weight.sub_(1.0)
    assert rollout.stats.policy_hits == 1  # read again under the new weights, not answered from the old ones
    assert moved[0].logprob != first[0].logprob
    # a pass kept for the update (with gradient) never comes from the memo
    rollout.act(prompts[:1], valid[:1], torch.Generator().manual_seed(0), keep=True)
    assert rollout.stats.policy_hits == 1


def test_the_policy_memo_is_off_unless_asked_for(players):
    from experiment_args import parse_args

    policy, tokenizer, reflector, reflect_tokenizer = players
    for flags, on in (([], False), (["--policy_memo"], True)):
        args = parse_args(["--model_name=tiny-gpt2", "--env=taxi", *flags])
        assert (TwoPlayerRollout.from_args(args, policy, tokenizer, reflector, reflect_tokenizer).policy_memo
                is not None) is on


def test_the_cache_flags_reach_the_rollout(players):
    from experiment_args import parse_args

    policy, tokenizer, reflector, reflect_tokenizer = players
    for flags, on in ((["--static_cache"], True), (["--no_prefix_cache"], False)):
        args = parse_args(["--model_name=tiny-gpt2", "--env=taxi", *flags])
        rollout = TwoPlayerRollout.from_args(args, policy, tokenizer, reflector, reflect_tokenizer)
        assert (rollout.policy_prefix is not None) is on and (rollout.reflect_prefix is not None) is on
        assert rollout.static_cache is on


# --- --contiguous_head and --argmax_top1: the same reflections and choices, each off by its flag

@pytest.mark.parametrize("shrink", [False, True])
def test_the_lm_head_reads_a_contiguous_copy_and_computes_the_same_logits(shrink):
    """transformers hands the head a strided ``hidden[:, -1:, :]`` under ``logits_to_keep``, on which torch's
    matmul copies the head's weight once per row (seconds for SmolLM2 in bfloat16); the hook gives it a
    contiguous copy: the same logits, and --no_contiguous_head leaves transformers' call as it is."""
    from experiment_args import ScriptArguments

    seen, logits = {}, {}
    for on in (True, False):
        torch.manual_seed(0)
        loader = models.ModelSettings.from_args(ScriptArguments(**EXACT, contiguous_head=on))
        model, tokenizer = models.load_model_and_tokenizer(loader, trainable=False, shrink_head=shrink)
        head = lm_head.base_model(model).get_output_embeddings()
        heads = [head, head.full_head] if shrink else [head]
        for module in heads:
            module.register_forward_hook(lambda m, args, out, on=on: seen.setdefault(on, []).append(args[0].is_contiguous()))
        ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12], [1, 2, 3, 4]], device=model.device)
        with torch.no_grad():
            logits[on] = model(input_ids=ids, logits_to_keep=1).logits
            with lm_head.full_head(model):
                model(input_ids=ids, logits_to_keep=1)
    assert seen[True] == [True, True] and seen[False] == [False, False]  # the label head, then the full one
    assert torch.allclose(logits[True], logits[False], atol=1e-6)


def test_top1_reflections_by_argmax_are_the_sampled_ones_and_break_ties_by_the_lower_id(players):
    policy, tokenizer, _, reflect_tokenizer = players
    episodes = {on: [e.to_dict() for e in _run(players, top_k=1, argmax_top1=on)[2]] for on in (True, False)}
    assert episodes[True] == episodes[False]  # float32: no tie, the same reflections byte for byte

    from experiment_args import ScriptArguments, parse_args

    reflector, _ = models.load_model_and_tokenizer(models.ModelSettings.from_args(ScriptArguments(**EXACT)),
                                                   trainable=False)
    prompt = [reflection_prompt(make_env("taxi").reset(seed=3)[0], make_env("taxi").action_head)]
    ids = torch.tensor([reflect_tokenizer(prompt[0], add_special_tokens=False)["input_ids"]], device=reflector.device)
    with torch.no_grad():
        first = int(reflector(input_ids=ids).logits[0, -1].argmax())
        twin = first - 1 if first > 0 else first + 1
        # a second token whose logit equals the top one exactly (the head's rows are the embedding's)
        reflector.get_output_embeddings().weight[twin] = reflector.get_output_embeddings().weight[first]
        logits = reflector(input_ids=ids).logits[0, -1]
    assert logits[twin] == logits[first] == logits.max()
    texts = {}
    for flag in ("--argmax_top1", "--no_argmax_top1"):
        args = parse_args(["--model_name=tiny-gpt2", "--env=taxi", "--top_k=1", "--reflect_max_new_tokens=1",
                           "--no_reflection_memo", "--no_reflect_one_line", "--no_prefix_cache", flag])
        rollout = TwoPlayerRollout.from_args(args, policy, tokenizer, reflector, reflect_tokenizer)
        assert rollout.greedy_reflections is (flag == "--argmax_top1")
        texts[flag] = {rollout.reflect(prompt, seed)[0] for seed in range(12)}
    said = {token: clean_reflection(reflect_tokenizer.decode([token]), False) for token in (first, twin)}
    assert texts["--argmax_top1"] == {said[min(first, twin)]}  # every seed: the lower id
    assert texts["--no_argmax_top1"] == set(said.values())  # sampling draws either
