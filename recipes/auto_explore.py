"""The AutoExplore columns (depth 1 and depth 2): the paper's own benchmark, offline, tiny-gpt2 on 2 CPU
cores. Repositories are built from installed packages (``collect_repos``), tasks and trajectories with
negatives come from the offline oracle writers, and one repository is held out of every split (the
generalisation columns). The depth curriculum and ``--merge_first_two`` are the paper's command's.

The rows add the paper's ablation, **SFT+RLFT w/o negative**: Reflect-RL whose reflector (and policy)
were fine-tuned on the ``_positive`` files, which keep the trajectories without their wrong turns.
Every departure from the paper's recipe is a number below, with its reason.

What it measures, honestly: at this budget nothing is learned. On the validation split every row stays
between 0 and 4% at depth 1 and 0 and 1% at depth 2 (docs/auto_explore.md, the ablation): in 320 SFT
steps the random-weight reflector does not yet write a well-formed sentence naming a folder or file
(its advice matches the oracle's on 0 to 5% of held-out states), and in 160 steps the policy does not learn
to find the label of the command the analysis names among 20-70 shuffled labels. The criteria of the
paper's claims are not met here; the recipe is kept so that the runner, the rows and the evaluation
are in place for a model that can learn the task (a pretrained one, issue 25).

On a pretrained model (``demo.py --task auto_explore --model_name <GGUF_FILE>``, :func:`on_pretrained`): SmolLM2-135M
under the paper's LoRA, in bfloat16 where the CPU computes it natively, the same task and held-out episodes, sdpa
attention and no dropout (an SFT step's time and memory, measured in docs/auto_explore.md), a checkpoint every 50
steps so that a seed spans sessions. The GPU profile (:func:`on_gpu_profile`) runs that recipe at a GPU's batches.

Cost on the 2-core machine: AutoExplore's observations hold file listings and contents, so its SFT
texts are long (policy: about 500 tiny-gpt2 tokens, median, up to 1024); with file views of ~60 tokens
(``VIEW``) and batches of 8 texts of similar length an SFT step takes about 0.8 s (reflections) and 2 s
(policy) on one core.
"""

import dataclasses
from pathlib import Path

from data_gen.auto_explore import (
    collect_repos,
    filter_repo,
    filter_task,
    gen_sft,
    gen_task,
    reflection_negative,
    split_data,
)
from data_gen.auto_explore.reflection_negative import advised_command
from recipes import gpu
from recipes.accuracy import reflector_accuracy
from recipes.base import (
    REFLECT_RL,
    RLFT_ONLY,
    WITHOUT_REFLECTION,
    CurveFigure,
    Evaluation,
    Recipe,
    RLVariant,
    Row,
    SFTRole,
    paper_rows,
)
from recipes.pretrained import FLOAT32, in_float32, lora_model
from utils.checkpoints import POLICY

TASK_SEED = 0  # the benchmark (repositories, tasks, their split) is the same for every training seed: one
# evaluation set for all seeds; the training seed draws the trajectories (their wrong turns), SFT and RL
HOLDOUT_REPO = "tqdm"  # no training, validation or test task comes from it: the generalisation columns (it has
# tasks at depths 1 and 2; pyyaml, flat, has none at depth 2)
# File views of about 60 word-sized tokens (the environment's default: 500). A 128-wide model's cost grows with
# the square of the text's length: at the default the SFT texts are about 900 tiny-gpt2 tokens (median) and an
# SFT step over 16 of them takes about 18 s on one core; at 60, 305 (reflections) and 500 (policy), 3 s and 9 s.
VIEW = "--auto_explore_view_tokens=60"
GENERALISATION_REPS = 4
# The paper's choice labels: its SFT texts show each state's commands under the labels in order (its gen_sft.py resets
# the copilot with shuffle_action=False), RL draws them at random (its README's rl_finetune command passes
# --shuffle_action=True) and evaluation shows them in order again (evaluate.py's default). So the task's flags have
# none, and RL adds it; RL's validation panel plays RL's environment, with random labels.
RL_ACTIONS = ("--shuffle_action",)
TASK = ("--env=auto_explore", "--depth_curriculum", "--merge_first_two", VIEW)

# The budget chosen on the validation split (docs/auto_explore.md, the ablation): step B.
SFT = {
    "reflector": SFTRole("sft_reflection.jsonl", 320, 2e-3, "cosine"),
    "policy": SFTRole("sft_policy.jsonl", 160, 3e-3, "cosine"),
    "plain": SFTRole("sft.jsonl", 160, 3e-3, "cosine"),
    "reflector_positive": SFTRole("sft_reflection_positive.jsonl", 320, 2e-3, "cosine"),
    "policy_positive": SFTRole("sft_policy_positive.jsonl", 160, 3e-3, "cosine"),
}
# Batches of 8 texts of similar length: the policy texts' lengths vary five-fold (a folder's action list).
SFT_FLAGS = ("--per_device_train_batch_size=8", "--group_by_length", "--logging_steps=20")
RL = {
    REFLECT_RL: RLVariant(20, policy="policy", reflector="reflector"),
    "SFT+RLFT w/o negative": RLVariant(20, policy="policy_positive", reflector="reflector_positive"),
    WITHOUT_REFLECTION: RLVariant(20, policy="plain"),
    RLFT_ONLY: RLVariant(20),
}
ROWS = paper_rows(Row("SFT+RLFT w/o negative", "rl:SFT+RLFT w/o negative", "reflector_positive"))
BUDGET = {
    "rl_batch": 8,
    "rl_replay": 4,
    "rl_train_batch": 16,
    "rl_learning_rate": 1e-4,
    "rl_baseline": "mean",  # as Taxi's: the variance decides whether RL improves in a CPU budget
    "rl_entropy_coef": 0.0,
    "reflect_top_k": 1,  # greedy reflections, as Taxi's
    "eval_episodes": 1,  # per test task, and more where a depth has few tasks:
    "eval_level_episodes": 200,  # at least this many episodes per depth (its tasks repeated)
    "eval_seed": 0,
    "eval_batch": 32,
    "panel_every": 10,
    "panel_episodes": 1,  # per validation task
    "accuracy_episodes": 1,  # per test task: the reflector's advice checked against the oracle's move
}


def data(recipe: Recipe, seed: int, out: Path) -> list:
    """Repositories, tasks, trajectories with negatives, the split (one repository held out), SFT files."""
    repos, filtered, tasks, chosen = out / "repos", out / "repos_filtered", out / "tasks", out / "tasks_filtered"
    writer = ["--env=auto_explore", f"--model_name={recipe.model_name}", "--api=oracle"]
    benchmark, oracle = [*writer, f"--seed={TASK_SEED}"], [*writer, f"--seed={seed}"]
    view = [flag for flag in recipe.task if flag.startswith("--auto_explore_view_tokens=")]  # the task's, if any
    return [
        (collect_repos.main, [*benchmark, f"--output_dir={repos}"]),
        (filter_repo.main, [*benchmark, f"--repo_dir={repos}", f"--output_dir={filtered}"]),
        (gen_task.main, [*benchmark, f"--repo_dir={filtered}", f"--output_dir={tasks}"]),
        (filter_task.main, [*benchmark, f"--task_file={tasks}", f"--repo_dir={filtered}", f"--output_dir={chosen}"]),
        (reflection_negative.main, [*oracle, f"--task_file={chosen / 'data.json'}", f"--repo_dir={filtered}"]),
        (split_data.main, [*benchmark, f"--holdout_repo={HOLDOUT_REPO}",
                           f"--task_file={chosen / 'data_reflection_negative.json'}", f"--output_dir={out}"]),
        (gen_sft.main, [*oracle, *view, f"--task_file={out / 'train.json'}",
                        f"--repo_dir={filtered}", f"--output_dir={out}"]),
    ]


def rl_flags(recipe: Recipe, data_dir: Path) -> list[str]:
    return [*RL_ACTIONS, f"--task_file={data_dir / 'train.json'}",
            f"--validation_task_file={data_dir / 'validate.json'}", f"--repo_dir={data_dir / 'repos_filtered'}"]


def evaluation_on(split: str, *flags: str) -> Evaluation:
    """The columns' evaluation on the tasks of ``split`` (a file of the data folder), with ``flags`` of its own."""
    columns = (("depth 1", "AutoExplore depth 1"), ("depth 2", "AutoExplore depth 2"))
    return Evaluation(lambda data_dir: [f"--task_file={data_dir / split}", f"--repo_dir={data_dir / 'repos_filtered'}",
                                        *flags, "--eval_levels", *(level for level, _ in columns)], columns)


RECIPE = Recipe(
    name="auto_explore", title="AutoExplore", task=TASK, data=data, sft=SFT,
    sft_streams=(("reflector", "policy", "reflector_positive"), ("plain", "policy_positive")), rl=RL, sft_flags=SFT_FLAGS,
    rl_streams=((REFLECT_RL, WITHOUT_REFLECTION), ("SFT+RLFT w/o negative", RLFT_ONLY)), rows=ROWS,
    evaluations={"held-out": evaluation_on("test.json"),
                 # reported only, and on fewer episodes: each of the held-out repository's tasks GENERALISATION_REPS times
                 "generalisation": evaluation_on("holdout.json", f"--eval_reps={GENERALISATION_REPS}",
                                               "--eval_level_episodes=0")},
    budget=BUDGET, rl_flags=rl_flags, accuracy=reflector_accuracy(advised_command),
    gpu=lambda model_name: on_gpu_profile(model_name),
    pretrained=lambda model_name: on_pretrained(model_name),
    figures=(CurveFigure("negatives_curves.png", "AutoExplore: validation success with and without negative examples "
                         "(the paper's Figure 3)", (REFLECT_RL, "SFT+RLFT w/o negative")),),
    departures=(
        ("file views of ~60 tokens (the paper: ~500)", "a CPU budget: the texts' length decides an SFT step's cost"),
        ("repositories from installed packages, tasks and reflections from offline oracle writers (the paper: "
         "GitHub repositories, GPT-4)", "offline and deterministic"),
        ("full-weight training (the paper: LoRA)", "LoRA over random weights learns too slowly for a CPU budget"),
        ("a batch-mean baseline, greedy reflections (the paper: none, sampled)", "as the Taxi column's"),
    ),
)


# --- the same column on a pretrained model (``demo.py --model_name <model>``): SmolLM2-135M on 2 CPU cores ---------
# LoRA r 64 / alpha 16 over the frozen base (recipes/pretrained.py), the tiny-gpt2 column's task, data and
# held-out episodes, so the two models' rows compare. The costs below were measured on the 2-core machine with
# avx512_bf16, in bfloat16 (docs/auto_explore.md, "Where an SFT step's time went").
# Attention by torch's sdpa kernel for every role (the loader's default for a bfloat16 model trained on a CPU is
# eager attention): eager keeps each layer's attention probabilities in float32 for the backward pass, so a batch
# of 8 policy texts of 700-800 tokens peaks at 15-20 GiB (two SFTs side by side would not fit in 24 GiB) and, with
# the memory given back and taken again at every step, takes 2-3x sdpa's time (18-26 s against 12 s; 8 reflection
# texts of 210 tokens: 7-16 s against 2.3 s).
PRETRAINED_ATTENTION = "--attn_implementation=sdpa"
PRETRAINED_SFT_FLAGS = ("--per_device_train_batch_size=8", "--group_by_length", "--logging_steps=10",
                        # no dropout (the paper: 0.1): LoRA's random masks are 10-15% of a policy step, and the
                        # pretrained Taxi reflector was right more often without (docs/smollm2.md)
                        "--disable_dropout")
PRETRAINED_POLICY_LEARNING_RATE = 1e-3  # the pretrained Taxi recipe's (chosen there on SmolLM2's validation episodes)
PRETRAINED_REFLECTOR_LEARNING_RATE = 2e-3  # with a cosine decay: the pretrained Taxi recipe's
# 300: the validation pilot's best (advice right in 24 / 30 / 31% of states at 100 / 200 / 300 steps)
PRETRAINED_REFLECTOR_STEPS = 300
# 60: on validation the SFT policy puts the right label first as often after 60 steps as after 240 (39.6% of 235
# texts at both, 35.7% at 120; evaluation.label_lookup, docs/auto_explore.md), at a quarter of the time
PRETRAINED_POLICY_STEPS = 60
_REFLECTOR = SFTRole("sft_reflection.jsonl", PRETRAINED_REFLECTOR_STEPS, PRETRAINED_REFLECTOR_LEARNING_RATE, "cosine")
_POLICY = SFTRole("sft_policy.jsonl", PRETRAINED_POLICY_STEPS, PRETRAINED_POLICY_LEARNING_RATE)
PRETRAINED_SFT = {"reflector": _REFLECTOR, "policy": _POLICY, "plain": dataclasses.replace(_POLICY, file="sft.jsonl"),
                  "reflector_positive": dataclasses.replace(_REFLECTOR, file="sft_reflection_positive.jsonl"),
                  "policy_positive": dataclasses.replace(_POLICY, file="sft_policy_positive.jsonl")}
# Two SFT streams (one thread each): a reflector's 300 steps take about 26 min, a policy's 60 about 11 in bf16 (a
# policy's step costs about twice a reflector's; in float32 on an AVX2 core about 17 and 36 s a step). The first
# reflector alone in one stream, the policies it is played with in the other, so that the priority rows (--rows
# "SFT only" ... Reflect-RL: the reflector, the plain policy and the policy) end their SFT when the reflector does
# (measured 2026-12-03: with the plain policy after the reflector, the other stream idled once its policy was trained).
PRETRAINED_SFT_STREAMS = (("reflector", "policy_positive"), ("plain", "policy", "reflector_positive"))
# The RL runs go on in the SFT streams (overlap), one thread each: Reflect-RL where its reflector ends, the runs that
# read the plain policy or none where the policies and the second reflector end; each starts once its SFT models are
# trained (measured 2026-12-02: with all RL after all SFT, one core idled for the 15 min of the last policy's SFT).
PRETRAINED_RL_STREAMS = ((REFLECT_RL, "SFT+RLFT w/o negative"), (WITHOUT_REFLECTION, RLFT_ONLY))
PRETRAINED_RL_ITERATIONS = 20
# The paper's RL rate; 100 held-out episodes a depth (the tiny-gpt2 column's 200 would take about an hour of the
# seed: 80 validation episodes of a row that reflects took 430 s on one core, two thirds of it the policy's reading of
# its prompts), and the held-out repository's tasks twice each. RL's decisions per backward pass 8, not 16: PG and
# GRPO step once an iteration, after every minibatch, so this is memory, not the update (the same gradient, to
# rounding); a pass over 16 long prompts holds 6-11 GiB in float32 (about 1 MiB a token, measured 2026-12-03), with
# two RL runs side by side.
PRETRAINED_BUDGET = {**BUDGET, "rl_learning_rate": 2e-4, "eval_level_episodes": 100, "rl_train_batch": 8}
PRETRAINED_GENERALISATION_REPS = 2
# The evaluation answers a policy prompt seen again from memory (rollout.policy.PolicyMemo): a test task is played 8-13
# times to reach 100 episodes a depth, its episodes pass the same states, and with greedy reflections the same state
# gives the same prompt. The same choices to rounding; the policy's reading was two thirds of an episode's time.
PRETRAINED_POLICY_MEMO = "--policy_memo"
# RL's update reads every decision again rather than from the rollout's passes kept with their graphs
# (--reuse_rollout_pass, on by default on a CPU): an iteration holds 8 episodes of up to 15 decisions over prompts of
# 350-700 tokens, 4-15 GiB of graphs a run at about 1 MiB a token in float32 (measured 2026-12-03) and up to about
# 40 where every episode plays its 15 steps (the fifth session's two RL runs filled 23 GiB in bfloat16). The cost:
# one more forward pass over the decisions; the rollout's, under no gradient, reads the prefix its batch shares once
# (--prefix_cache).
PRETRAINED_RL_FLAGS = ("--reuse_rollout_pass=false",)
PRETRAINED_RL_SAVE_EVERY = 2  # an RL iteration takes minutes here: a run cut short loses at most two
PRETRAINED_SAVE_EVERY = 50  # a stage cut short (a session's end) resumes from a checkpoint at most this many steps old
PRETRAINED_FLOAT32_NOTICE = f"{FLOAT32} (docs/auto_explore.md)"
# What the policies answer with after the action marker: "label" (the paper's) or "command", the command's words
# scored over the menu (rollout/commands.py). Chosen on validation (docs/auto_explore.md).
PRETRAINED_POLICY_ANSWER = "command"


def answering(answer: str) -> dict:
    """The recipe's fields that say what its policies answer with: the label (the paper's; the column's folder
    as it always was) or the command's words (``--policy_answer=command``, rollout/commands.py; a column of its
    own, ``...-commands-<model>``, so that the two kinds of policy never share a stage's folder). The flag goes to
    the SFT of each role the rows and RL variants read as a policy (:attr:`Recipe.players`)."""
    if answer == "label":
        return {"sft": PRETRAINED_SFT, "policy_flags": ("--shrink_head",), "tag": "", "departures": ()}
    flag = f"--policy_answer={answer}"
    players = dataclasses.replace(RECIPE, sft=PRETRAINED_SFT).players
    policies = {role: dataclasses.replace(spec, flags=(*spec.flags, flag)) if players[role] == POLICY else spec
                for role, spec in PRETRAINED_SFT.items()}
    departure = ("the policy answers with the command's words, each command the menu shows scored by their "
                 "log-probability (the paper: the label before it)", "on validation SmolLM2 did not learn to find the "
                 "label of the command the analysis names in menus of more than 10 commands (docs/auto_explore.md)")
    return {"sft": policies, "policy_flags": (flag,), "tag": f"{answer}s-", "departures": (departure,)}


def on_pretrained(model_name: str, answer: str = PRETRAINED_POLICY_ANSWER) -> Recipe:
    """This column on the pretrained ``model_name`` (hub id, folder or .gguf file), trained with LoRA, its policies
    answering with ``answer`` (:func:`answering`)."""
    answers = answering(answer)
    return dataclasses.replace(
        RECIPE, name=f"{RECIPE.name}-{answers['tag']}{Path(model_name).name}", title=f"{RECIPE.title} (LoRA)",
        model=lora_model(model_name, PRETRAINED_ATTENTION), sft=answers["sft"], sft_flags=PRETRAINED_SFT_FLAGS,
        policy_flags=answers["policy_flags"],
        sft_streams=PRETRAINED_SFT_STREAMS, rl=gpu.iterations(RL, PRETRAINED_RL_ITERATIONS),
        rl_streams=PRETRAINED_RL_STREAMS, overlap=True, budget=PRETRAINED_BUDGET, pretrained=None,
        rl_flags=lambda recipe, data_dir: [*rl_flags(recipe, data_dir), *PRETRAINED_RL_FLAGS],
        save_every=PRETRAINED_SAVE_EVERY, rl_save_every=PRETRAINED_RL_SAVE_EVERY,
        evaluations={"held-out": evaluation_on("test.json", PRETRAINED_POLICY_MEMO), "generalisation": evaluation_on(
            "holdout.json", PRETRAINED_POLICY_MEMO, f"--eval_reps={PRETRAINED_GENERALISATION_REPS}",
            "--eval_level_episodes=0")},
        notice=PRETRAINED_FLOAT32_NOTICE if in_float32() else None,
        departures=(
            *answers["departures"],
            (f"SFT of {PRETRAINED_POLICY_STEPS} (policies) and {PRETRAINED_REFLECTOR_STEPS} steps (reflectors) of 8 "
             f"texts, {PRETRAINED_RL_ITERATIONS} RL iterations of {BUDGET['rl_batch']} episodes (the paper: more)",
             "a seed of about 2.5 hours on 2 CPU cores (docs/auto_explore.md: each stage's cost); both chosen on "
             "validation: the policy's right label as often first at 60 steps as at 240, the reflector's advice "
             "right a little more often at 300 than at 200"),
            ("file views of ~60 tokens (the paper: ~500)", "a CPU budget: the texts' length decides an SFT step's cost"),
            ("repositories from installed packages, tasks and reflections from offline oracle writers (the paper: "
             "GitHub repositories, GPT-4)", "offline and deterministic"),
            (f"SFT without dropout, at lr {PRETRAINED_POLICY_LEARNING_RATE:g} (policies) and "
             f"{PRETRAINED_REFLECTOR_LEARNING_RATE:g} with a cosine decay (reflectors) (the paper: 2e-4, dropout 0.1)",
             "the pretrained Taxi recipe's, chosen there on SmolLM2's validation episodes; no dropout is also 10-15% "
             "faster"),
            ("a batch-mean baseline, greedy reflections (the paper: none, sampled)", "as the Taxi column's"),
            ("bfloat16 on a CPU that computes it natively (the paper: a GPU)", "several times faster than float32 there"),
        ),
    )


# --- the same column on one GPU (``demo.py --profile gpu``), on a pretrained model --------------------------------
# The pretrained recipe above, as it was measured and chosen on validation episodes on the CPU (its task with ~60-token
# file views, its SFT roles, steps, rates and flags, its RL iterations), at a GPU's batches: an RL iteration's time on
# a GPU is the reflector's generation, bound by latency, which serves a batch of 64 in about the time of 16, so the
# same RL episodes come in a quarter of the iterations; the evaluation in batches of 200. The first GPU window runs the
# recipe measured here, so the two machines' rows compare.
GPU_RL_ITERATIONS = max(1, PRETRAINED_RL_ITERATIONS // 4)
GPU_BUDGET = {"rl_batch": 4 * BUDGET["rl_batch"], "rl_train_batch": 16, "eval_batch": 200, "eval_level_episodes": 200,
              "panel_every": max(1, PRETRAINED_BUDGET["panel_every"] // 4)}


def on_gpu_profile(model_name: str) -> Recipe:
    """This column on one GPU (recipes/gpu.py), on the pretrained ``model_name``: the CPU's pretrained recipe."""
    cpu = on_pretrained(model_name)
    return gpu.on_gpu(
        RECIPE, model_name, task=cpu.task, sft=cpu.sft, rl=gpu.iterations(RL, GPU_RL_ITERATIONS),
        budget={**PRETRAINED_BUDGET, **GPU_BUDGET}, sft_flags=cpu.sft_flags, save_every=cpu.save_every,
        rl_save_every=cpu.rl_save_every, policy_flags=cpu.policy_flags,
        model_flags=(PRETRAINED_ATTENTION,), departures=(
            (f"{GPU_RL_ITERATIONS} RL iterations of {GPU_BUDGET['rl_batch']} episodes (the CPU recipe: "
             f"{PRETRAINED_RL_ITERATIONS} of {BUDGET['rl_batch']})", "the same RL episodes in a GPU's batches"),
            *(d for d in cpu.departures if not d[0].startswith(("bfloat16 on a CPU", "a batch-mean", "SFT of "))),
            (f"SFT of {PRETRAINED_POLICY_STEPS} (policies) and {PRETRAINED_REFLECTOR_STEPS} steps (reflectors) of 8 "
             "texts (the paper: more)", "the CPU recipe's, so that the machines' rows compare"),
        ))
