"""The ALFWorld column: the paper's family, ``pick_and_place_simple-Tomato-None-Microwave`` (7 train trials,
4 valid trials), offline, tiny-gpt2 on 2 CPU cores, with the real ``alfworld``/``textworld`` engine.

Data is the paper's "expert + random" (the handcoded expert, a random admissible command with p = 0.7,
each state labelled with the command taken) with the offline oracle writer's reflections; then SFT of
the reflector and the two policies, RLFT three ways on the train trials, and every row evaluated on the
4 valid trials, each repeated alike to at least ``eval_level_episodes`` episodes. The validation panel
plays the train trials at validation seeds (new task sentences, never the valid trials): with 7 train
trials there is none to spare for a validation split.

The game engine and the prompt's length set the budget: a real game resets in about 6 s and steps in about
0.15 s on one core as textworld has it; its worker remembers the engine's pure answers
(``envs.alfworld_worker.memoise_engine``), so a game played again resets in 0.25-0.5 s, keeps the game's
translations on disk, so a game any worker translated before resets that fast in a new worker too, and copies
the text grammar's contexts without deep copies (``copy_contexts_shallowly``), which halves a step again. A
batch's games run side by side in their worker processes (``rollout._pool``). A policy step reads 700-1,024
tokens (prompts are cut from the left at ``--max_seq_length``, 1,024: where the agent holds an object, a
"move" command per receptacle makes them longer). Seeds 0 and 1
took 75 min and about 2 h on the 2-core machine under load, seed 2 (SFT without dropout) 76.5 min on free
cores, every row at 0% on each (docs/alfworld.md), with a validation
ablation: 5x the SFT steps, 0.3 random instead of 0.7, and unshuffled labels all left the plain SFT policy at
a uniform pick (0 of 14 validation episodes).
"""

import dataclasses
from pathlib import Path

import data_gen.alfworld.gen_sft
import data_gen.alfworld.reflection
from recipes import gpu, taxi_pickup
from recipes.base import REFLECT_RL, RLFT_ONLY, WITHOUT_REFLECTION, Evaluation, Recipe, RLVariant, SFTRole, paper_rows
from utils.paths import SHARED_DIR

DATA = SHARED_DIR / "alfworld" / "tomato_microwave_json_2.1.1"  # the paper's family, unpacked (../shared)
FAMILY = "pick_and_place_simple-Tomato-None-Microwave"
HORIZON = 15  # the paper's
# A policy prompt is the room (about 270 tokens), the history (about 50 a step) and the admissible commands
# (about 430): the whole history of a 15-step episode would double what the policy reads at its end.
HISTORY_STEPS = 3
DATA_EPISODES = 120
TASK = ("--env=alfworld", f"--alfworld_data={DATA}", f"--alfworld_task={FAMILY}", "--shuffle_action",
        f"--horizon={HORIZON}", f"--alfworld_history_steps={HISTORY_STEPS}")

# ALFWorld's texts are 500 to 1,300 tokens: batches of 8 texts of similar length, as AutoExplore's. Without
# dropout (the paper's --disable_dropout; the departure below has the measured step times): with attention
# dropout torch's CPU attention takes its slow path (a 640-token batch: 1.36 s against 0.35 s a layer,
# forward and backward).
SFT_FLAGS = ("--per_device_train_batch_size=8", "--group_by_length", "--logging_steps=20", "--disable_dropout")
SFT = {
    "reflector": SFTRole("sft_reflection.jsonl", 150, 2e-3, "cosine"),
    "policy": SFTRole("sft_policy.jsonl", 80, 1e-3, "cosine"),
    "plain": SFTRole("sft.jsonl", 80, 1e-3, "cosine"),
}
RL = {
    REFLECT_RL: RLVariant(8, policy="policy", reflector="reflector"),
    WITHOUT_REFLECTION: RLVariant(8, policy="plain"),
    RLFT_ONLY: RLVariant(8),
}
BUDGET = {**taxi_pickup.BUDGET,
          "rl_batch": 8,  # 8 games side by side, each in its worker
          "rl_replay": 4,
          "rl_train_batch": 16,
          "eval_episodes": 1,
          "eval_level_episodes": 200,  # the 4 valid trials, 50 episodes each
          "eval_batch": 16,
          "panel_every": 4,
          "panel_episodes": 1,  # per train trial: 7 validation episodes
          "accuracy_episodes": 1}


def data(recipe: Recipe, seed: int, out: Path) -> list:
    """'expert + random 0.7' episodes on the train trials with the offline oracle writer, then the SFT files."""
    return [
        (data_gen.alfworld.reflection.main, [*recipe.task, "--api=oracle", "--alfworld_split=train",
                                             f"--num_episodes={recipe.extra['data_episodes']}",
                                             f"--output_dir={out}", f"--seed={seed}"]),
        (data_gen.alfworld.gen_sft.main, ["--env=alfworld", f"--model_name={recipe.model_name}",
                                          f"--task_file={out / 'data_reflection.json'}",
                                          *(f"--sft_label={label}" for label in recipe.extra.get("sft_labels", ()))]),
    ]


RECIPE = Recipe(
    name="alfworld", title="ALFWorld (tomato to microwave)", task=TASK, data=data, sft=SFT,
    # One stream trains the three SFT models (about a minute each) and runs Reflect-RL; the other runs RLFT only
    # (which reads no SFT model) from the start, then SFT+RLFT w/o reflection once its policy is trained.
    sft_streams=(("reflector", "policy", "plain"), ()), rl=RL, sft_flags=SFT_FLAGS,
    rl_streams=((REFLECT_RL,), (RLFT_ONLY, WITHOUT_REFLECTION)), overlap=True, rows=paper_rows(),
    # No expert in the evaluation's games (the paper's default): no row reads an oracle there, and the expert's
    # planning was a fifth of a random player's game time.
    evaluations={"held-out": Evaluation(lambda data_dir: ["--eval_levels", FAMILY, "--alfworld_expert=none"],
                                        ((FAMILY, "ALFWorld"),))},
    budget=BUDGET, extra={"data_episodes": DATA_EPISODES},
    smoke_extra={"data_episodes": 8},  # demo.py --profile smoke
    gpu=lambda model_name: on_gpu_profile(model_name),
    departures=(
        ("full-weight training (the paper: LoRA)", "LoRA over random weights learns too slowly for a CPU budget"),
        ("the handcoded expert plays the data and RL games too (the paper: none; the evaluation's games have none)",
         "its oracle command is only recorded; no reward or choice reads it"),
        (f"the policy reads the last {HISTORY_STEPS} steps of history (the paper: every step)",
         "a whole history doubles what the policy reads by an episode's end, and reading is what a step costs"),
        ("the validation panel plays the train trials at other seeds", "7 train trials leave none for validation"),
        ("a batch-mean baseline, greedy reflections (the paper: none, sampled)", "as the Taxi column's"),
        ("SFT without dropout (the paper: dropout 0.1, its --disable_dropout off)",
         "attention dropout sends CPU attention to its slow path: an SFT step on these texts took 8.4 s with it, "
         "2.3 s without"),
    ),
)


# --- the same column on one GPU (``demo.py --profile gpu``), on a pretrained model --------------------------------
# The policies learn from the expert's command as label (gen_sft --sft_label oracle; the paper: the command taken).
# On an H200 (2026-11-28, docs/gpu.md), SmolLM2-135M with this LoRA, reading the data's own reflection, ranked
# the expert's command first on 89.0% of 420 validation states after 400 SFT steps of 8 texts at 1e-3 with the
# expert's labels, and on 1.2% with the taken ones (loss on the plateau). The reflector's rate and dropout are the
# pretrained Taxi recipe's; the RL budget is what a 9-minute window holds by the GPU rates measured so far.
GPU_POLICY = SFTRole("sft_policy.jsonl", 400, 1e-3)
GPU_SFT = {"reflector": SFTRole("sft_reflection.jsonl", 400, 2e-3, "cosine"), "policy": GPU_POLICY,
           "plain": dataclasses.replace(GPU_POLICY, file="sft.jsonl")}
# RL: 4 iterations of 32 games, a gradient step per 16 (an iteration's time is the reflector's generation, bound by
# latency); games run in a worker process each, so a batch is held to what 16 cores start in seconds (3 RL runs: 96).
GPU_RL_ITERATIONS = 4
GPU_BUDGET = {"rl_batch": 32, "rl_train_batch": 16, "rl_learning_rate": 2e-4, "eval_batch": 50, "panel_every": 4}


def on_gpu_profile(model_name: str) -> Recipe:
    """This column on one GPU (recipes/gpu.py), on the pretrained ``model_name``."""
    return gpu.on_gpu(
        RECIPE, model_name, sft=GPU_SFT, rl=gpu.iterations(RL, GPU_RL_ITERATIONS), budget=GPU_BUDGET,
        sft_flags=SFT_FLAGS, extra={**RECIPE.extra, "sft_labels": ("oracle",)},
        departures=(
            ("the policies' SFT labels are the expert's commands (the paper: the commands taken)",
             "on validation states SmolLM2 learned to follow a reflection with them (89.0% at 400 steps), not with "
             "the taken ones (1.2%)"),
            (f"{GPU_RL_ITERATIONS} RL iterations of {GPU_BUDGET['rl_batch']} games (the paper: more)",
             "a 9-minute GPU window"),
            *(d for d in RECIPE.departures if d[0].startswith(("the handcoded expert", "the policy reads", "the "
                                                               "validation panel", "SFT without dropout"))),
        ))
