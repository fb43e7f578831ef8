"""The reflection memo (``--reflection_memo``): exact under greedy reflections, off by its flag, never
used where a reflection is sampled, and emptied when the reflector's weights change."""

import json

import numpy as np
import pytest
import torch

from envs import make_env
from experiment_args import ScriptArguments
from rollout import EpisodeStart, TwoPlayerRollout
from utils import models


@pytest.fixture(scope="module")
def players():
    args = ScriptArguments(model_name="tiny-gpt2")
    torch.manual_seed(0)
    policy, tokenizer = models.load_model_and_tokenizer(args, shrink_head=True)
    with torch.no_grad():  # a non-uniform policy, so episodes differ
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.2)
    policy.eval()
    reflector, reflect_tokenizer = models.load_model_and_tokenizer(args, trainable=False)
    return policy, tokenizer, reflector, reflect_tokenizer


def _play(players, rounds=3, batch=8, **kw):
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
    remembered, with_memo = _play(players, top_k=1)
    generated, without = _play(players, top_k=1, reflection_memo=False)
    assert remembered.memo is not None and generated.memo is None
    assert with_memo == without  # byte for byte: every decision, reflection, log-prob
    assert remembered.stats.reflections == generated.stats.reflections > 0
    assert remembered.stats.reflection_hits > 0 and generated.stats.reflection_hits == 0
    assert 0 < remembered.stats.reflection_hit_rate < 1
    # the work saved shows in the tokens the reflector read
    assert remembered.stats.reflection_prompt_tokens < generated.stats.reflection_prompt_tokens


def test_no_memo_where_reflections_are_sampled(players):
    rollout, _ = _play(players, rounds=1)  # temperature 1, no top-k: each seed its own text
    assert rollout.memo is None and rollout.stats.reflection_hits == 0


def test_the_flag_reaches_the_rollout(players):
    policy, tokenizer, reflector, reflect_tokenizer = players
    for flag, on in (("--reflection_memo", True), ("--no_reflection_memo", False)):
        from experiment_args import parse_args

        args = parse_args(["--model_name=tiny-gpt2", "--env=taxi", "--top_k=1", flag])
        rollout = TwoPlayerRollout.from_args(args, policy, tokenizer, reflector, reflect_tokenizer)
        assert (rollout.memo is not None) is on


def test_a_change_of_the_reflector_weights_empties_the_memo(players):
    policy, tokenizer, _, reflect_tokenizer = players
    reflector, _ = models.load_model_and_tokenizer(ScriptArguments(model_name="tiny-gpt2"), trainable=False)
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
