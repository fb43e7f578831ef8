"""The Taxi +drop-off column, with the paper's curriculum ablation (its Figure 4): DangerousTaxi's drop-off
level (the passenger already in the taxi, the destination to reach), offline, tiny-gpt2 on 2 CPU cores.

The curriculum runs train pickup first, then drop-off (``--curriculum_steps``: the levels' own iterations),
as the paper's "w/ CL" runs were trained with the pickup curriculum before drop-off; the two "w/o
curriculum" runs train drop-off from their first iteration, for as many drop-off iterations. Every run's
validation panel plays drop-off only, so the curves compare drop-off success over drop-off iterations.
Every row is judged on drop-off episodes; Reflect-RL (with the curriculum) is also played on the full
task, the passenger picked up and then delivered in one episode (reported only).

The data, the SFT budgets and the RL settings are the pickup column's (``recipes/taxi_pickup.py``), with
the data played on both levels the runs train on. Every departure from the paper's recipe is a number
below or there, with its reason.
"""

import dataclasses
from pathlib import Path

import data_gen.taxi.gen_sft
import data_gen.taxi.reflection
from envs.taxi import CURRICULA, FULL
from recipes import gpu, taxi_pickup
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
    paper_rows,
)
from utils.io import read_json, write_json

PICKUP, DROPOFF = CURRICULA[0], CURRICULA[1]
HORIZON = taxi_pickup.HORIZON  # drop-off, like pickup, takes at most 9 moves
FULL_HORIZON = 20  # the full task takes up to 18
TASK = ("--env=taxi", "--taxi_curriculum", f"--horizon={HORIZON}")  # the paper's pickup reward (replace)
DATA_EPISODES = 2000  # per level played (pickup, drop-off)
# "oracle + random 0.3" (the pickup column: 0.5; the paper: 0.9). From the 0.5 data the SFT policy follows the
# advice on about 37% of its moves, and a drop-off ride (5 to 9 actions from one depot to another, with no
# short ones as pickup has) then never succeeds: 0 of 3,200 validation-level episodes in 200 RL iterations at
# learning rates 1e-4 and 3e-4, and RL learns to crash at once. From 0.3 data the same RL starts at 10% on the
# validation panel and climbs (docs/taxi_dropoff.md, the ablation).
DATA_RANDOM_PROB = 0.3
PICKUP_ITERATIONS = 40  # the curriculum runs' pickup phase, before their drop-off iterations
DROPOFF_ITERATIONS = 80  # every run's drop-off iterations

# The reflector's SFT: 1,500 steps (the pickup column: 1,000). RL teaches the policy to follow the reflector (0.95-0.99
# of its moves by the end), so the reflector's accuracy on drop-off states sets where every reflecting run ends: at
# 1,000 steps the seeds' reflectors were right on the whole ride in 18-41 of 60 validation episodes, and Reflect-RL
# ended at 22-72% with or without the curriculum (docs/taxi_dropoff.md, the ablation, steps 5 and 6).
REFLECTOR_STEPS = 1500
SFT = {**taxi_pickup.SFT, "reflector": dataclasses.replace(taxi_pickup.SFT["reflector"], steps=REFLECTOR_STEPS)}
CL = dict(iterations=PICKUP_ITERATIONS + DROPOFF_ITERATIONS, level_steps=(PICKUP_ITERATIONS, DROPOFF_ITERATIONS))
NO_CL = dict(iterations=DROPOFF_ITERATIONS, flags=("--curriculum_index=1",))
RL = {
    REFLECT_RL: RLVariant(**CL, policy="policy", reflector="reflector"),
    WITHOUT_REFLECTION: RLVariant(**CL, policy="plain"),
    RLFT_ONLY: RLVariant(**CL),
    "Reflect-RL w/o curriculum": RLVariant(**NO_CL, policy="policy", reflector="reflector"),
    "SFT+RLFT w/o reflection, w/o curriculum": RLVariant(**NO_CL, policy="plain"),
}
ROWS = paper_rows(Row("Reflect-RL w/o curriculum", "rl:Reflect-RL w/o curriculum", "reflector"),
                  Row("SFT+RLFT w/o reflection, w/o curriculum", "rl:SFT+RLFT w/o reflection, w/o curriculum"))
BUDGET = {**taxi_pickup.BUDGET,
          "panel_every": 10}  # the drop-off curve: the validation panel every 10 iterations


def data(recipe: Recipe, seed: int, out: Path) -> list:
    """'oracle + random' episodes on each level the runs train (pickup, drop-off), joined, then the SFT files."""
    levels = recipe.extra["data_levels"]
    steps = [(data_gen.taxi.reflection.main,
              [*recipe.task, f"--curriculum_index={CURRICULA.index(level)}", "--api=oracle",
               f"--num_episodes={recipe.extra['data_episodes']}", f"--random_prob={recipe.extra['data_random_prob']}",
               f"--output_dir={out / level}", f"--seed={seed}"]) for level in levels]
    joined = out / "data_reflection.json"
    return [*steps, (join_records([out / level / "data_reflection.json" for level in levels], joined), []),
            (data_gen.taxi.gen_sft.main, ["--env=taxi", f"--model_name={recipe.model_name}", f"--task_file={joined}"])]


def join_records(sources: list[Path], target: Path):
    """A data step: the JSON lists of ``sources`` written one after the other to ``target``."""
    def main(_args) -> int:
        write_json(target, [record for source in sources for record in read_json(source)])
        return 0
    return main


def _levels(*levels: str, horizon: int = HORIZON) -> list[str]:
    return [f"--horizon={horizon}", "--eval_levels", *levels]


RECIPE = Recipe(
    name="taxi_dropoff", title="DangerousTaxi drop-off", task=TASK, data=data, sft=SFT,
    sft_streams=(("reflector",), ("policy", "plain")), rl=RL,
    # The RL runs go on in the SFT streams (overlap): while the reflector trains, the policies' stream trains them
    # and runs the three variants that read no reflector; Reflect-RL, the longest run, follows the reflector.
    rl_streams=((REFLECT_RL,),
                (WITHOUT_REFLECTION, "SFT+RLFT w/o reflection, w/o curriculum", RLFT_ONLY, "Reflect-RL w/o curriculum")),
    overlap=True,
    rows=ROWS, rl_flags=lambda recipe, data_dir: ["--eval_levels", DROPOFF],  # the panel plays drop-off
    evaluations={"held-out": Evaluation(lambda data_dir: _levels(DROPOFF), ((DROPOFF, "Taxi +drop-off"),)),
                 "full task": Evaluation(lambda data_dir: _levels(FULL, horizon=FULL_HORIZON),
                                         ((FULL, "Taxi full task"),), rows=(REFLECT_RL,))},
    budget=BUDGET, accuracy=reflector_accuracy(data_gen.taxi.reflection.advised_command),
    smoke_extra={"data_episodes": 20},  # demo.py --profile smoke
    gpu=lambda model_name: on_gpu_profile(model_name),
    extra={"data_episodes": DATA_EPISODES, "data_random_prob": DATA_RANDOM_PROB,
           "data_levels": [PICKUP, DROPOFF]},
    figures=(CurveFigure("dropoff_curves.png", "Taxi drop-off: validation success (the paper's Figure 4)",
                         (REFLECT_RL, "Reflect-RL w/o curriculum", WITHOUT_REFLECTION,
                          "SFT+RLFT w/o reflection, w/o curriculum"), xlabel="drop-off iteration",
                         shift=((REFLECT_RL, PICKUP_ITERATIONS), (WITHOUT_REFLECTION, PICKUP_ITERATIONS))),),
    departures=(
        ("oracle + random 0.3 (the paper: 0.9)", "from 0.5 data the drop-off policy never succeeds (validation)"),
        *(d for d in taxi_pickup.RECIPE.departures if not d[0].startswith(("pickup bonus", "oracle + random"))),
        (f"horizon {HORIZON} on pickup and drop-off, {FULL_HORIZON} on the full task (the paper: 15)",
         "each level's longest plan fits, and running out of time costs what crashing does"),
        (f"{PICKUP_ITERATIONS} pickup, then {DROPOFF_ITERATIONS} drop-off iterations (the paper: thousands)",
         "a CPU budget of 25 minutes a seed"),
    ),
)


# --- the same column on one GPU (``demo.py --profile gpu``), on a pretrained model --------------------------------
# The pretrained Taxi recipe's SFT (recipes/taxi_pickup.py, chosen on validation episodes of SmolLM2-135M) and this
# column's data mix (0.3, chosen here on drop-off validation episodes); every run's drop-off iterations and the
# curriculum's pickup ones at a GPU's batches, in what a 9-minute window holds by the GPU rates measured so far.
GPU_PICKUP_ITERATIONS, GPU_DROPOFF_ITERATIONS = 2, 4  # of 64 episodes (taxi_pickup.GPU_BUDGET)
GPU_CL = dict(iterations=GPU_PICKUP_ITERATIONS + GPU_DROPOFF_ITERATIONS,
              level_steps=(GPU_PICKUP_ITERATIONS, GPU_DROPOFF_ITERATIONS))
GPU_RL = {name: dataclasses.replace(variant, **(GPU_CL if variant.level_steps else {"iterations": GPU_DROPOFF_ITERATIONS}))
          for name, variant in RL.items()}


def on_gpu_profile(model_name: str) -> Recipe:
    """This column on one GPU (recipes/gpu.py), on the pretrained ``model_name``."""
    (figure,) = RECIPE.figures
    return gpu.on_gpu(
        RECIPE, model_name, sft=taxi_pickup.PRETRAINED_SFT, rl=GPU_RL,
        budget={**taxi_pickup.PRETRAINED_BUDGET, **taxi_pickup.GPU_BUDGET},
        sft_flags=("--per_device_train_batch_size=16", "--logging_steps=10"),
        extra={**RECIPE.extra, "data_episodes": taxi_pickup.PRETRAINED_DATA_EPISODES},
        figures=(dataclasses.replace(figure, shift=tuple((name, GPU_PICKUP_ITERATIONS) for name, _ in figure.shift)),),
        departures=(
            (f"{GPU_PICKUP_ITERATIONS} pickup, then {GPU_DROPOFF_ITERATIONS} drop-off iterations of "
             f"{taxi_pickup.GPU_BUDGET['rl_batch']} episodes (the paper: thousands)", "a 9-minute GPU window"),
            *(d for d in RECIPE.departures if d[0].startswith(("oracle + random", "horizon"))),
            *(d for d in taxi_pickup.on_gpu_profile(model_name).departures
              if d[0].startswith(("the policies' SFT", "the reflector's SFT"))),
        ))
