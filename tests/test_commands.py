"""The policy answering with a command's words (``--policy_answer=command``, rollout/commands.py): each command
scored as if read alone after its prompt, a distribution over the labels shown, gradients through it, SFT texts
rewritten to the command, episodes played with it, and the checks that keep the two kinds of policy apart."""

import json

import numpy as np
import pytest
import torch

from envs import make_env
from prompts import ACTION_MARKER, label_alphabet, policy_prompt, policy_sft_text, shown_menu
from rollout import EpisodeStart, PolicyScorer, TwoPlayerRollout
from rollout.commands import ANSWER_END, command_answer_text, command_scores
from utils import complete, models
from utils.checkpoint_checks import CheckSettings, checkpoint_problems
from utils.errors import UsageError

EXACT = dict(model_name="tiny-gpt2", load_in_8bit=False, bf16=False)


@pytest.fixture(scope="module")
def policy():
    from experiment_args import ScriptArguments

    args = ScriptArguments(**EXACT)
    torch.manual_seed(0)
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args))
    with torch.no_grad():  # a non-trivial adapter, so that the scores are not those of the base model
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.2)
    model.eval()
    return model, tokenizer


def _alone(model, prompt: list[int], command: list[int]) -> float:
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + command])).logits[0].float(), -1)
    return sum(float(logp[len(prompt) - 1 + k, token]) for k, token in enumerate(command))


def test_each_command_scores_as_if_read_alone_after_its_prompt(policy):
    model, tokenizer = policy
    prompts = ["Which file defines load? load.py looks right, so I will read it.\n # Action:\n", "Short.\n # Action:\n"]
    commands = [["cat load.py\n", "cd ..\n", "id setup.py\n"], ["cd src\n", "cat a_much_longer_name.py\n"]]
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    cands = [[tokenizer(c, add_special_tokens=False)["input_ids"] for c in row] for row in commands]
    assert len(ids[0]) > len(ids[1]) + 5  # the batch is left-padded
    with torch.no_grad():
        scores, hidden = command_scores(model, ids, cands, tokenizer.pad_token_id, with_hidden=True)
    for prompt, row, got in zip(ids, cands, scores):
        torch.testing.assert_close(got, torch.tensor([_alone(model, prompt, c) for c in row]), atol=1e-4, rtol=1e-5)
    with torch.no_grad():
        alone = model(torch.tensor([ids[1]]), output_hidden_states=True).hidden_states[-1][0, -1].float()
    torch.testing.assert_close(hidden[1], alone, atol=1e-4, rtol=1e-4)


def test_the_mask_takes_the_dtype_the_model_computes_in_not_its_first_parameters(tiny_path):
    """A bfloat16 model whose first parameter is float32 (as a float32 adapter weight can be): the attention mask
    is built in bfloat16, the dtype its hidden states flow in, and the scores are those of reading alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    model.register_parameter("probe", torch.nn.Parameter(torch.zeros(1)))  # parameters() yields it first
    assert next(model.parameters()).dtype == torch.float32 and models.activation_dtype(model) == torch.bfloat16
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    prompt = tokenizer("Read it.\n # Action:\n", add_special_tokens=False)["input_ids"]
    cands = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in ("cat a.py\n", "cd ..\n")]
    seen = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(kwargs["attention_mask"].dtype),
                                           with_kwargs=True)
    with torch.no_grad():
        (scores,), _ = command_scores(model, [prompt], [cands], tokenizer.eos_token_id)
    hook.remove()
    assert seen == [torch.bfloat16]  # not a float32 mask that the attention casts at every layer
    torch.testing.assert_close(scores, torch.tensor([_alone(model, prompt, c) for c in cands]), atol=0.1, rtol=0.02)


def _taxi_state(seed=3):
    env = make_env("taxi", shuffle_action=True)
    obs, info = env.reset(seed=seed)
    return env, obs, info


def test_the_scorer_gives_a_distribution_over_the_labels_shown_with_gradient(policy):
    model, tokenizer = policy
    scorer = PolicyScorer(model, tokenizer, max_seq_length=1024, temperature=0.7, answer="command")
    env, obs, info = _taxi_state()
    prompt = policy_prompt(obs, env.action_head, "Go to the passenger.")
    valid = [scorer.label_index[label] for label in info["labels"]]
    with torch.enable_grad():
        logp = scorer.logprobs([prompt, prompt], [valid, valid[:3]]).logprobs
        logp[0, valid[0]].backward()
    assert torch.isinf(logp[0]).sum() == len(scorer.labels) - len(valid) and torch.isinf(logp[1]).sum() == len(
        scorer.labels) - 3
    assert float(logp[0].detach().exp().sum()) == pytest.approx(1.0, abs=1e-5)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.requires_grad)
    model.zero_grad()
    # the same numbers as each command read alone, divided by the temperature
    menu = dict(shown_menu(prompt, scorer.label_index))
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    raw = torch.tensor([_alone(model, ids, tokenizer(menu[scorer.labels[i]] + ANSWER_END, add_special_tokens=False)
                               ["input_ids"]) for i in valid])
    torch.testing.assert_close(logp[0, valid].detach(), torch.log_softmax(raw / 0.7, -1), atol=1e-4, rtol=1e-4)


def test_episodes_play_with_command_answers_and_need_the_invalid_labels_masked(policy):
    model, tokenizer = policy
    rollout = TwoPlayerRollout(model, tokenizer, policy_answer="command")
    envs = [make_env("taxi", shuffle_action=True, horizon=4) for _ in range(3)]
    episodes = rollout.run(envs, [EpisodeStart(seed=10 + i, options={"curriculum": "full"}) for i in range(3)], np.random.default_rng(0))
    for episode in episodes:
        assert all(d.action in d.valid and np.isfinite(d.logprob) for d in episode.decisions)
    with pytest.raises(UsageError, match="--mask_invalid"):
        TwoPlayerRollout(model, tokenizer, policy_answer="command", mask_invalid=False)


def test_an_sft_text_answers_with_the_command_its_label_stands_for(policy):
    _, tokenizer = policy
    alphabet = label_alphabet(tokenizer)
    env, obs, info = _taxi_state()
    text = policy_sft_text(obs, env.action_head, info["oracle_label"], "Go to the passenger.")
    answered = command_answer_text(text, alphabet)
    command = dict(shown_menu(text, alphabet))[info["oracle_label"]]
    assert answered == text[:text.rindex(ACTION_MARKER) + len(ACTION_MARKER)] + command + ANSWER_END
    with pytest.raises(ValueError, match="not among the labels"):
        command_answer_text(text[:text.rindex(ACTION_MARKER) + len(ACTION_MARKER)] + "zz", alphabet)


def test_sft_trains_on_the_commands_words(policy, tmp_path):
    from experiment_args import ScriptArguments
    from supervised_pretrain import build_dataset

    _, tokenizer = policy
    env, obs, info = _taxi_state()
    text = policy_sft_text(obs, env.action_head, info["oracle_label"])
    command = dict(shown_menu(text, label_alphabet(tokenizer)))[info["oracle_label"]]
    task = tmp_path / "sft_policy.jsonl"
    task.write_text(json.dumps({"text": text}) + "\n")
    args = ScriptArguments(**EXACT, task_file=str(task), policy_answer="command")
    example = build_dataset(args, tokenizer, [text])[0]
    trained = [t for t, label in zip(example["input_ids"], example["labels"]) if label != -100]
    assert tokenizer.decode(trained) == command + ANSWER_END


def test_a_policy_of_one_answer_is_not_read_as_the_other(tmp_path):
    from utils.checkpoints import POLICY, SFT, CheckpointRole, write_role

    folder = tmp_path / "checkpoint-5"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    (folder / "setting.yml").write_text("model_name: tiny-gpt2\npolicy_answer: command\n")
    write_role(folder, CheckpointRole(POLICY, SFT))
    complete.mark(folder)
    from experiment_args import ScriptArguments

    errors, _ = checkpoint_problems(CheckSettings.from_args(ScriptArguments(**EXACT)), folder, "policy")
    assert any("--policy_answer=command" in e for e in errors), errors
    answering = ScriptArguments(**EXACT, policy_answer="command")
    errors, _ = checkpoint_problems(CheckSettings.from_args(answering), folder, "policy")
    assert not any("--policy_answer" in e for e in errors), errors


def test_the_label_head_and_command_answers_do_not_mix():
    """Refused by the flags, and by the scorer handed a model with the label head: one reason, worded once."""
    from experiment_args import ScriptArguments
    from utils import lm_head
    from utils.arg_groups_model import LABEL_HEAD_WITH_COMMANDS

    with pytest.raises(ValueError) as flags:
        ScriptArguments(**EXACT, shrink_head=True, policy_answer="command")
    assert str(flags.value) == f"--shrink_head: {LABEL_HEAD_WITH_COMMANDS}"
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(ScriptArguments(**EXACT)))
    lm_head.shrink_lm_head(model, [0, 1, 2])
    with pytest.raises(UsageError) as scorer:
        PolicyScorer(model, tokenizer, 64, 1.0, answer="command")
    assert str(scorer.value).startswith("--shrink_head") and str(scorer.value).endswith(LABEL_HEAD_WITH_COMMANDS)


@pytest.mark.parametrize("baseline", ["mean", "critic"])  # the critic reads the prompts' last hidden states
def test_rl_fine_tunes_a_policy_that_answers_with_commands(make_args, tmp_path, baseline):
    import rl_finetune
    from utils import checkpoints, metrics

    args = make_args(env="taxi", taxi_curriculum=True, curriculum_index=0, oracle_completion=True,
                     per_device_eval_batch_size=4, per_device_train_batch_size=8, learning_rate=1e-3,
                     trainer="pg", baseline=baseline, max_steps=2, save_steps=2, policy_answer="command")
    assert rl_finetune.main(args) == 0
    (run,) = checkpoints.run_dirs(tmp_path / "results", "rl_finetune")
    records = metrics.read_metrics(run)
    assert [r["step"] for r in records] == [1, 2] and all(np.isfinite(r["loss"]) for r in records)
    saved = checkpoints.load_settings(run / "checkpoint-2")
    assert saved["policy_answer"] == "command"
