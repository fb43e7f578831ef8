"""Where this project differs from the paper's code: the one list behind ``--preset paper`` and the
README's table "Parity with the paper's code".

Each :class:`Deviation` is a behaviour of the paper's code (zhourunlong/Reflect-RL, read against
``../shared/PARITY.md``) beside ours. Those with a ``setting`` are one flag away: ``--preset paper``
sets every such setting to ``paper_value`` (explicit flags and ``--config`` still win), and the
run's ``setting.yml`` records the resolved values. Those without are not (yet) available.
"""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Deviation:
    behaviour: str
    paper: str
    ours: str
    why: str
    setting: str | None = None  # the ScriptArguments field that selects the paper's behaviour
    paper_value: Any = None


DEVIATIONS: tuple[Deviation, ...] = (
    Deviation("Taxi: reward of the first pickup", "+20 replaces the move's -1 (1.0 after /20)",
              "the same by default; `add` pays +20 on top of -1 (0.95)",
              "`make demo`'s table was measured with `add` and keeps it", "pickup_reward", "replace"),
    Deviation("horizon", "15 steps in every environment", "the environment's own: Taxi 20, AutoExplore 15, "
              "ALFWorld 30", "Taxi's full task can need more than 15 moves; ALFWorld's expert plans often do",
              "horizon", 15),
    Deviation("reflections", "generated until EOS or the token cap, kept whole (several lines)",
              "stopped at the first newline, one line", "the SFT data's reflections are one line (the writers "
              "write them so), so the reflector learns to end at the newline; more lines are text it never saw",
              "reflect_one_line", False),
    Deviation("RL episodes per iteration", "4", "8",
              "the batched rollout plays 8 episodes 2.7x faster per episode than one at a time "
              "(benchmarks.rollout_throughput), and the gradient is less noisy", "per_device_eval_batch_size", 4),
    Deviation("SFT batch per device", "1", "4", "padded batches of 4 train faster per text at the same learning rate",
              "per_device_train_batch_size", 1),
    Deviation("SFT warm-up", "warmup_ratio 0.03 (no effect under its constant schedule)", "0.0",
              "says what happens: no warm-up", "warmup_ratio", 0.03),
    Deviation("gradient checkpointing", "on", "off",
              "it costs about a third more compute; turn it on when memory is short", "gradient_checkpointing", True),
    Deviation("SFT optimiser", "paged_adamw_32bit (bitsandbytes)", "adamw_torch",
              "paged optimisers need bitsandbytes and CUDA; without CUDA the paper's choice falls back to "
              "adamw_torch with a warning", "optim", "paged_adamw_32bit"),
    Deviation("checkpoints kept", "the last 10 (save_total_limit)", "all",
              "evaluating a learning curve needs every checkpoint", "save_total_limit", 10),
    # Not (yet) one flag away; from PARITY.md, kept here so that the README lists them.
    Deviation("RL replay buffer", "samples one success with replacement, its own optimiser step, cleared at "
              "each curriculum level", "up to `--replay_batch_size` distinct successes trained with the fresh "
              "episodes in one step, kept across levels", "one step per iteration keeps the update size and the "
              "learning rate's meaning the same with and without replay", "replay_mode", "separate"),
    Deviation("PG loss normalisation", "divided by the number of decisions", "by the number of episodes",
              "the gradient of the mean episode cost; per decision, an episode's weight shrinks as the batch's "
              "episodes grow longer", "pg_normalize", "decisions"),
    Deviation("AutoExplore targets (RL and evaluation)", "the task's file and every file the data writer "
              "identified in the task's trajectories; tasks where it identified none left out",
              "the task's file", "a file the writer identified may be wrong, and then identifying it would be "
              "rewarded; every task keeps its place", "auto_explore_targets", "writer"),
    Deviation("AutoExplore negatives", "wrong files read in the target's own folder (2 tries per task)",
              "one wrong file read in each of up to 2 folders on the way to the target",
              "the reflector learns to notice a wrong turn at every depth, not only at the end",
              "negatives_at", "target_folder"),
    Deviation("AutoExplore SFT positives", "every positive trajectory of the writer, one that identifies a wrong "
              "file or none included", "only those that identify a target (checked by replaying them)",
              "imitating a failed search teaches the failure", "sft_positives", "all"),
    Deviation("invalid label", "never masked: any label may be chosen, one not shown is a wasted step",
              "the policy chooses among the labels shown", "a label outside the list teaches nothing and wastes "
              "samples; API models, which cannot be masked, pay a wasted step", "mask_invalid", False),
    Deviation("GPT baselines", "two turns per step: reflect, then act, with the episode's history",
              "the same by default; `one_turn` answers each observation alone",
              "one turn is cheaper and isolates the model's reading of a single state", "gpt_protocol", "two_turn"),
    Deviation("scripts", "`clean_checkpoints.py`, `visualization/ensemble_logs.py`, `agent/brute_force.py`, "
              "`agent/react_agent.py`", "`--save_total_limit`, `visualization.plot --expdirs NAME=DIR1,DIR2`, "
              "`python -m data_gen.taxi.brute_force`, `--gpt_protocol react`",
              "each is part of the tool that does the rest of its job; the brute-force agent records the "
              "observation it acted in (the paper's script recorded the one after)"),
    Deviation("oracle reflection writer", "GPT-4 (on Taxi told the best action as a spoiler)",
              "`--api oracle` writes the situation and the BFS/expert plan, naming the next move",
              "an offline, deterministic stand-in for GPT-4; API writers get the paper's spoiler prompt, and "
              "reflections that quote it are asked again"),
    Deviation("ALFWorld API reflection writer", "not told the expert's next command",
              "told it as a spoiler it must not quote (as the paper's Taxi writer is)",
              "the reflection then reasons towards the expert's command rather than a guess; the spoiler "
              "checks reject one that quotes it", "alfworld_spoiler", False),
    Deviation("AutoExplore step costs", "an output containing the words Error or Warning costs extra",
              "a failed command costs 2 extra, one that told nothing new 1", "reading a file that mentions "
              "errors is not a mistake", "auto_explore_costs", "keywords"),
    Deviation("critic training schedule", "every 5 iterations, on their decisions (`--critic_update_freq`)",
              "with every iteration, in the policy's optimiser step", "the baseline follows the policy as it "
              "changes; both are flags (`--use_critic` and `--critic_layer_type` are the paper's too)",
              "critic_update_freq", 5),
    Deviation("critic passes per training", "5 passes over those decisions, its own optimiser "
              "(`--critic_update_iter`)", "1", "one pass per iteration already sees every decision once",
              "critic_update_iter", 5),
    Deviation("model cache folder", "`--cache_dir`", "the `HF_HOME`/`HF_HUB_CACHE` environment variables",
              "the hub reads them for every tool at once"),
)

PRESETS: dict[str, dict[str, Any]] = {
    "paper": {d.setting: d.paper_value for d in DEVIATIONS if d.setting is not None},
}


def markdown_table() -> str:
    """The README's table: one row per deviation (behaviour, the paper's, ours, the flag, why)."""
    rows = ["| behaviour | the paper's code | ours (default) | the paper's with | why ours |", "|---|---|---|---|---|"]
    for d in DEVIATIONS:
        flag = f"`--{d.setting}={_word(d.paper_value)}`" if d.setting else "—"
        rows.append(f"| {d.behaviour} | {d.paper} | {d.ours} | {flag} | {d.why} |")
    return "\n".join(rows) + "\n"


def _word(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
