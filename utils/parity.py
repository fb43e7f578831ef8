"""Where this project differs from the paper's code: the one list behind ``--preset paper`` and the
table of docs/parity.md, "Parity with the paper's code".

Each :class:`Deviation` is a behaviour of the paper's code (zhourunlong/Reflect-RL, read against
``../shared/PARITY.md``, and played side by side with ours where its section "Checked by playing"
says so) beside ours, with its :attr:`Deviation.status`:

* ``PAPER``: the paper's behaviour is our default; ``ours`` names what it replaced, if a flag keeps it;
* ``FLAG``: ours is the default and the paper's is one flag away: ``--preset paper`` sets every such
  ``setting`` to ``paper_value`` (explicit flags and ``--config`` still win), and the run's
  ``setting.yml`` records the resolved values;
* ``KEPT``: ours, with no flag for the paper's; ``why`` says why.

Rows that change what a run is rewarded for, what counts as success, or which tasks a curriculum
level holds are ``PAPER`` unless ``why`` gives a measured reason.
"""

from dataclasses import dataclass
from typing import Any

PAPER, FLAG, KEPT = "the paper's by default", "one flag away", "kept"


@dataclass(frozen=True)
class Deviation:
    behaviour: str
    paper: str
    ours: str
    why: str
    setting: str | None = None  # the ScriptArguments field that selects the paper's behaviour
    paper_value: Any = None
    status: str = FLAG

    def __post_init__(self) -> None:
        if self.status not in (PAPER, FLAG, KEPT):
            raise ValueError(f"{self.behaviour}: status {self.status!r}")
        if (self.status == FLAG and self.setting is None) or (self.status == KEPT and self.setting is not None):
            raise ValueError(f"{self.behaviour}: a row one flag away names its setting, a kept row none")


DEVIATIONS: tuple[Deviation, ...] = (
    # --- environments: what is rewarded, counted, or trained (checked by playing both) -----------
    Deviation("Taxi: reward of the first pickup", "+20 replaces the move's -1 (1.0 after /20)",
              "`--pickup_reward add` pays +20 on top of -1 (0.95)",
              "the paper's; `make demo`'s table was measured with `add` and keeps it", "pickup_reward", "replace",
              status=PAPER),
    Deviation("Taxi without `--taxi_curriculum`", "the full task with no pickup bonus; its success threshold "
              "(cost < -1) cannot be reached, so no episode counts as a success",
              "before: the full task with the bonus (a pickup earned 1.0)",
              "the paper's rewards; success there is the delivery (stage `plain`), since the paper's threshold "
              "counts none", status=PAPER),
    Deviation("Taxi: the dangerous rule on the first step", "its check compares the last two maps, so a first "
              "move that changes nothing costs gymnasium's reward (-0.05 into a wall) and the episode goes on",
              "ends the episode with -0.5 from the first step",
              "the rule as the paper states it; its code misses step 0", "danger_on_first_step", False),
    Deviation("`--first_step` (Taxi, AutoExplore)", "one decision, scored on its own: Taxi that step's reward; "
              "AutoExplore +100 + horizon for the task's first optimal command, a step's cost otherwise",
              "before: the oracle played the episode out and its return counted (AutoExplore's success rate "
              "was about 100% whatever the policy did); that bandit is now `--oracle_completion`, whose "
              "'success' is 'the first decision was optimal and the task got solved'",
              "the paper's; the played-out bandit is kept under its own name because it learns from a "
              "denser signal", status=PAPER),
    Deviation("AutoExplore step costs", "written to charge 2 more for 'Error' and 1 for 'Warning' in a step's "
              "messages; the count runs over (role, text) pairs, never matches, and adds 0: every step costs 1",
              "`--auto_explore_costs outcome`: 2 more for a failed command, 1 for one that told nothing new; "
              "`keywords`: the words as the code intended",
              "the paper's code in effect (`step`); in label play `outcome` charges the same, since the labels "
              "never offer a failing or repeated command", "auto_explore_costs", "step", status=PAPER),
    Deviation("AutoExplore depth curriculum", "a task at every depth of its targets; `--merge_first_two` "
              "merges the first two non-empty depths; tasks with an empty question dropped (without "
              "`--easy`); `max_steps // tasks` iterations per task, the rest to the last level",
              "before: a task at its first target's depth only, depths 0 and 1 merged only when both existed, "
              "empty questions kept (on 10 tasks and 1000 steps: levels from 0/111/445/778, the paper's "
              "0/100/400/800)", "the paper's", status=PAPER),
    Deviation("AutoExplore `--easy`", "'Find <path from the repository root>' for one of the task's files, "
              "drawn at random, the only target", "before: 'Find <file name>' for the shallowest target",
              "the paper's (it tells the agent more)", status=PAPER),
    Deviation("AutoExplore `--leaveout_prob`", "keeps every entry whose path is a prefix of a target's (as "
              "strings, so 'src/u' stays beside 'src/utils.py')", "before: kept the target's folders only",
              "the paper's", status=PAPER),
    Deviation("ALFWorld history", "every step since the start", "`--alfworld_history_steps 10`: the last 10",
              "the paper's; prompts grow with the episode (the horizon bounds them)", status=PAPER),
    Deviation("ALFWorld oracle", "none by default (the PLANNER expert is optional)", "the handcoded expert; "
              "`--alfworld_expert none` plays without one", "the data steps and the reflector's accuracy need "
              "an oracle, and it changes no reward; `none` saves the expert's planning at every step",
              status=KEPT),
    Deviation("`--shuffle_action` on ALFWorld", "the labels 0..n-1 permuted, the commands listed in label order",
              "before: labels drawn from the whole set, in the commands' order (AutoExplore's rule, kept there)",
              "the paper's, per environment", status=PAPER),
    Deviation("horizon", "15 steps in every environment", "the environment's own: Taxi 20, AutoExplore 15, "
              "ALFWorld 30", "Taxi's full task can need more than 15 moves; ALFWorld's expert plans often do",
              "horizon", 15),
    Deviation("episode ends (done / truncated)", "Taxi's pickup ends as truncated only, a danger as both, "
              "AutoExplore's horizon as done", "terminated for an end of the task, truncated for the horizon "
              "(gymnasium's meaning)", "the paper's returns are the same either way; learners read the flags",
              status=KEPT),
    # --- the texts the model reads (same information; the wording is ours) -----------------------
    Deviation("Taxi map: depot letters", "blanked (the map shows walls and T/P/D/O/X only)",
              "R, G, Y, B on their cells", "the letters name the depots the rules describe",
              "taxi_depot_letters", False),
    Deviation("prompt layout", "the analyze marker on the state's last line; with a reflection the policy's "
              "prompt keeps the instruction at the top (Taxi's; ALFWorld's and AutoExplore's reflectors get "
              "none); Taxi's history: a lead sentence, then one action name per line", "the marker on its own "
              "line; no instruction in the policy's prompt; an instruction for ALFWorld's reflector too; "
              "'Previous actions: a, b'", "shorter prompts; `make demo`'s table was measured with them", "text_layout",
              "paper"),
    Deviation("action lines", "'Action 0: move south'", "'0. Move south' (every environment)",
              "one format for all environments and label alphabets; the same information", status=KEPT),
    Deviation("the paper's SFT texts", "built differently from its RL prompts (the state from the current-"
              "state header only, no newline before the action marker)", "SFT trains on the RL prompt itself",
              "a model sees at test time what it was trained on", status=KEPT),
    Deviation("AutoExplore observation", "cwd without the repository's name; entries in the file system's "
              "order, folders without '/', files of any suffix; blank lines between sections, empty ones left "
              "blank; cut files end with a 'Large file' note; commands `cd ..` first, then per entry",
              "cwd with the repository's name; sorted entries, folders with '/', allowed files only; '(none)' "
              "for an empty section; cut files say where they were cut; cd, then cat, then id commands",
              "deterministic across file systems; a file that cannot be read or identified is not offered",
              status=KEPT),
    Deviation("AutoExplore invalid label", "the observation rebuilt with a warning line", "the same "
              "observation again (`info['invalid_label']`)", "with masking (the default) the policy never "
              "chooses one; an API model is told by its client", status=KEPT),
    Deviation("ALFWorld observation", "TextWorld's welcome banner kept; 'Here is the previous path' with "
              "numbered steps", "the banner dropped; a '--- History ---' block of '> command' and reply",
              "the banner carries no information; the same steps in the same order", status=KEPT),
    # --- data, SFT and RL --------------------------------------------------------------------------
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
    Deviation("the policy's answer", "the label of its choice, one token after the action marker",
              "`--policy_answer command`: the command's words, each command the menu shows scored by their "
              "log-probability, one pass reading the prompt once (`rollout/commands.py`)",
              "SmolLM2-135M did not learn to find, in menus of more than 10 commands, the label of the command "
              "the analysis names (6-13% of validation texts after 60 SFT steps); a command's words copy the "
              "name the analysis wrote (`docs/auto_explore.md`)", "policy_answer", "label", status=PAPER),
    Deviation("GPT baselines", "two turns per step: reflect, then act, with the episode's history",
              "the same by default; `one_turn` answers each observation alone",
              "one turn is cheaper and isolates the model's reading of a single state", "gpt_protocol", "two_turn", status=PAPER),
    Deviation("scripts", "`clean_checkpoints.py`, `visualization/ensemble_logs.py`, `agent/brute_force.py`, "
              "`agent/react_agent.py`", "`--save_total_limit`, `visualization.plot --expdirs NAME=DIR1,DIR2`, "
              "`python -m data_gen.taxi.brute_force`, `--gpt_protocol react`",
              "each is part of the tool that does the rest of its job; the brute-force agent records the "
              "observation it acted in (the paper's script recorded the one after)", status=KEPT),
    Deviation("oracle reflection writer", "GPT-4 (on Taxi told the best action as a spoiler)",
              "`--api oracle` writes the situation and the BFS/expert plan, naming the next move",
              "an offline, deterministic stand-in for GPT-4; API writers get the paper's spoiler prompt, and "
              "reflections that quote it are asked again", status=KEPT),
    Deviation("ALFWorld API reflection writer", "not told the expert's next command",
              "told it as a spoiler it must not quote (as the paper's Taxi writer is)",
              "the reflection then reasons towards the expert's command rather than a guess; the spoiler "
              "checks reject one that quotes it", "alfworld_spoiler", False),
    Deviation("critic training schedule", "every 5 iterations, on their decisions (`--critic_update_freq`)",
              "with every iteration, in the policy's optimiser step", "the baseline follows the policy as it "
              "changes; both are flags (`--use_critic` and `--critic_layer_type` are the paper's too)",
              "critic_update_freq", 5),
    Deviation("critic passes per training", "5 passes over those decisions, its own optimiser "
              "(`--critic_update_iter`)", "1", "one pass per iteration already sees every decision once",
              "critic_update_iter", 5),
    Deviation("model cache folder", "`--cache_dir`", "the `HF_HOME`/`HF_HUB_CACHE` environment variables",
              "the hub reads them for every tool at once", status=KEPT),
)

PRESETS: dict[str, dict[str, Any]] = {
    "paper": {d.setting: d.paper_value for d in DEVIATIONS if d.setting is not None},
}


def markdown_table() -> str:
    """docs/parity.md's table: one row per deviation (behaviour, the paper's, ours, status, the flag, why)."""
    rows = ["| behaviour | the paper's code | ours | status | the paper's with | why |", "|---|---|---|---|---|---|"]
    for d in DEVIATIONS:
        flag = "default" if d.status == PAPER else f"`--{d.setting}={_word(d.paper_value)}`" if d.setting else "—"
        rows.append(f"| {d.behaviour} | {d.paper} | {d.ours} | {d.status} | {flag} | {d.why} |")
    return "\n".join(rows) + "\n"


def _word(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
