"""The flags' groups of optimisation, the environment, RL and the curriculum, one dataclass per purpose (the
model's group is in ``utils/arg_groups_model.py``; data generation's, the LLM backend's, evaluation's and logging's
in ``utils/arg_groups_io.py``; how a flag is declared and checked in ``utils/arg_fields.py``);
:class:`experiment_args.ScriptArguments` composes them all.

Each group checks its own fields in ``__post_init__`` (a ``ValueError`` naming the flag)
and then calls ``super().__post_init__()``, so the composed class runs every group's
checks once. Each group's ``TITLE`` is its ``--help`` section.
"""

import logging
from dataclasses import dataclass
from typing import ClassVar, Literal

from rl_algorithms.defaults import defaults_help, learner_defaults
from utils.arg_fields import (
    CLIPPED_GROUP,
    CRITIC,
    DEPTH_CURRICULUM,
    GIGPO,
    GREEDY_REFLECTIONS,
    NOT_REFUEL,
    ONLY_RL,
    ONLY_SFT,
    PG,
    PG_OR_GROUP,
    PPO_OR_CLIPPED,
    REFLECTOR,
    REFUEL,
    SEEDS,
    SFT_SCRIPT,
    WARM_UP,
    Applies,
    _arg,
    _at_least,
    _Group,
    _positive,
    _probability,
    flag_owners,
    need,
    output_folders,
)
from utils.cuda import cuda_available

logger = logging.getLogger(__name__)

ALFWORLD_PAPER_TASK = "pick_and_place_simple-Tomato-None-Microwave"
DEFAULT_TRAINER = "pg"  # the paper's learner, REINFORCE
GROUP_LEARNERS = ("rloo", "grpo", "gigpo")  # the learners that compare the episodes of one start


@dataclass
class OptimArguments(_Group):
    """The optimiser, steps and batch sizes of SFT and RL, and the run's seed."""

    TITLE: ClassVar[str] = "optimisation"

    learning_rate: float = _arg(2e-4, "Adam learning rate (SFT and RL).")
    weight_decay: float = _arg(0.001, "Adam weight decay.")
    max_grad_norm: float = _arg(0.3, "Gradient-norm clip.")
    lr_scheduler_type: str = _arg("constant", "Learning-rate schedule of SFT (HF names).", ONLY_SFT)
    warmup_ratio: float = _arg(
        0.0, "Warm-up fraction of SFT; needs a schedule with warm-up, e.g. constant_with_warmup (the paper's "
        "0.03 did nothing under its constant schedule).", (WARM_UP, ONLY_SFT))
    max_steps: int = _arg(2000, "SFT optimiser steps, or RL iterations.",
                          Applies("no --num_train_epochs", lambda a: a.num_train_epochs is None, (SFT_SCRIPT,)))
    group_by_length: bool = _arg(False, "SFT: batch texts of similar length together (less padding).", ONLY_SFT)
    completion_logits: bool = _arg(
        True, "SFT: compute the LM head and the loss at the completion's positions only, the only ones the loss "
        "reads (the same loss; a big vocabulary's head over the prompt is most of the logits' cost). Off: at "
        "every position, as the paper's code.", ONLY_SFT)
    num_train_epochs: float | None = _arg(
        None, "SFT: passes over the data; given, it replaces --max_steps for SFT (the paper's flag).", ONLY_SFT)
    optim: str = _arg("adamw_torch", "SFT optimiser, a transformers TrainingArguments.optim name (the paper: "
                      "paged_adamw_32bit, bitsandbytes on CUDA; without CUDA it falls back to adamw_torch).", ONLY_SFT)
    per_device_train_batch_size: int = _arg(4, "SFT batch size per device.")
    gradient_accumulation_steps: int = _arg(1, "SFT gradient accumulation steps.", ONLY_SFT)
    seed: int = _arg(42, "Seed of every random generator of the run.")

    def __post_init__(self) -> None:
        _positive(self, "learning_rate", "max_grad_norm", "num_train_epochs")
        _at_least(self, 0, "weight_decay")
        _at_least(self, 1, "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps")
        need(0.0 <= self.warmup_ratio < 1.0, "warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        need(self.seed in SEEDS, "seed", f"must be in [0, 2**32 - 1], got {self.seed}")
        super().__post_init__()


@dataclass
class EnvArguments(_Group):
    """Which environment, and how it is configured."""

    TITLE: ClassVar[str] = "environment"

    env: str = _arg(
        "auto_explore", "Environment to train or evaluate on: a name of the envs.ENVS registry (taxi, "
        "auto_explore, alfworld; --scenario, the paper's name in evaluate_gpt).",
        aliases=["--scenario"])
    horizon: int | None = _arg(
        None, "Steps before an episode is truncated (default: the environment's own).")
    shuffle_action: bool = _arg(
        False, "Show each action list with a random sample of the choice labels.")
    text_layout: Literal["ours", "paper"] = _arg(
        "ours", "How the texts are arranged: ours, or the paper's structure (in our words): the analyze marker "
        "on the state's last line, the instruction kept in the policy's prompt with a reflection, Taxi's history "
        "as one action name per line.")
    with_prompt: bool = _arg(False, "Taxi: start the observation with the rule description.")
    with_history: bool = _arg(
        False, "Taxi: show the initial grid and each step's action and grid, not just action names.")
    taxi_depot_letters: bool = _arg(
        True, "Taxi: show the depots' letters R, G, Y, B on the map (the paper's map blanks them: "
        "--no_taxi_depot_letters).")
    danger_on_first_step: bool = _arg(
        True, "Taxi: the dangerous rule (a move that changes nothing costs -10 and ends the episode) holds from "
        "the first step, as the paper states it; its code applies it from the second (--no_danger_on_first_step).")
    pickup_reward: Literal["replace", "add"] = _arg(
        "replace", "Taxi: the first pickup's reward is +20 (replace: the paper's environment, 1.0 after "
        "scaling) or +20 on top of the move's -1 (add: 0.95, this project's rule before the parity review).")
    easy: bool = _arg(False, "AutoExplore: the question is 'Find <path of one of the task's files>', that file "
                      "the only target (the paper's).")
    auto_explore_costs: Literal["step", "outcome", "keywords"] = _arg(
        "step", "AutoExplore: what a step costs beyond 1: nothing (step: what the paper's code charges in "
        "effect), 2 more for a command that failed and 1 for one that told nothing new (outcome), or those for "
        "the words Error/Warning anywhere in the output, a file's text included (keywords: the paper's code as "
        "written, whose count never matches).")
    auto_explore_targets: Literal["task", "writer"] = _arg(
        "task", "AutoExplore RL/eval: a task is solved by identifying its file (task), or also any file the "
        "data writer identified in its trajectories, tasks where it identified none being left out (writer, "
        "the paper's code; needs a --task_file with trajectories).")
    first_step: bool = _arg(
        False, "The paper's contextual bandit: each episode is one decision, scored on its own (Taxi: that "
        "step's reward; AutoExplore: +100 + horizon for the task's first optimal command).")
    oracle_completion: bool = _arg(
        False, "This project's bandit: after the policy's first decision the oracle plays the episode out and "
        "the return is that decision's reward; 'success' is then whether the decision was optimal.")
    leaveout_prob: float = _arg(
        0.5,
        "AutoExplore: probability to leave an entry whose path is no prefix of a target's out of the sandbox "
        "(training only; evaluation uses 0).")
    auto_explore_view_tokens: int = _arg(
        500, "AutoExplore: the most (word-sized) tokens a cat, head or tail shows of a file; fewer make shorter "
        "observations, for a small model's budget.")
    sandbox_dir: str | None = _arg(
        None, "AutoExplore: the folder where the repository copies the agent explores are made, in a folder of "
        "the run's process that a later run removes if the process was killed (default: the system's temporary "
        "folder).")
    alfworld_data: str | None = _arg(
        None, "ALFWorld json_2.1.1 data root (default: $ALFWORLD_DATA).")
    alfworld_task: str = _arg(
        ALFWORLD_PAPER_TASK, "ALFWorld task family: trial folder name prefix ('' for all).")
    alfworld_split: str = _arg(
        "train", "ALFWorld split for training: train, valid_seen, valid_unseen, valid_train, or valid (all three valid_*; what evaluation uses).")
    alfworld_expert: Literal["handcoded", "planner", "none"] = _arg(
        "handcoded", "ALFWorld expert giving the oracle action (none: no oracle, the paper's RL default; the "
        "data steps need one).")
    alfworld_history_steps: int = _arg(
        0, "ALFWorld: steps of history shown in the observation (0: every step since the start, the paper's).")
    alfworld_timeout: float = _arg(
        60.0, "Seconds an ALFWorld reset or step may take before the game is skipped.")

    def __post_init__(self) -> None:
        _at_least(self, 1, "horizon")
        _probability(self, "leaveout_prob")
        _positive(self, "alfworld_timeout")
        _at_least(self, 0, "alfworld_history_steps")
        _at_least(self, 1, "auto_explore_view_tokens")
        need(not (self.first_step and self.oracle_completion), "oracle_completion",
             "and --first_step are two different bandits; give one")
        output_folders(self, "sandbox_dir")
        from envs import ENVS

        need(self.env in ENVS, "env", f"{self.env!r} is not one of {tuple(ENVS)}")
        for flag, names in flag_owners(ENVS, "exclusive_flags").items():  # e.g. --taxi_curriculum, --first_step
            need(not getattr(self, flag, False) or self.env in names, flag,
                 f"is for --env={' or '.join(names)}, got --env={self.env}")
        super().__post_init__()


@dataclass
class RLArguments(_Group):
    """The RL learner, the two-player rollout, and resuming."""

    TITLE: ClassVar[str] = "reinforcement learning"

    trainer: str = _arg(DEFAULT_TRAINER, "RL learner, a name of rl_algorithms.LEARNERS: pg (REINFORCE, the paper), ppo, refuel, "
                        "and the group learners rloo, grpo, gigpo (they need --group_size 2 or more).")
    group_size: int = _arg(
        1, "RL: play each start this many times per iteration, as independent episodes (each samples its own "
        "actions) that the learner sees as one group; an iteration is --per_device_eval_batch_size episodes, "
        "that is batch / GROUP_SIZE starts. The group learners compare the episodes of a group.", ONLY_RL)
    grpo_variant: Literal["grpo", "dr_grpo"] | None = _arg(
        None, "GRPO/GiGPO: grpo (advantages scaled by the group's standard deviation, each episode's loss the "
        "mean over its decisions) or dr_grpo (Dr. GRPO's unbiased form: no scaling, decisions summed, divided by "
        f"the batch's episodes). Default: the learner's, kept by the ablation on validation episodes "
        f"({defaults_help('grpo_variant')}; rl_algorithms/defaults.py, docs/learners.md).", CLIPPED_GROUP)
    kl_coef: float = _arg(
        0.0, "GRPO/GiGPO: weight of the KL penalty to the policy RL started from (the k3 estimator per "
        "decision; 0: off, as Dr. GRPO and DAPO).", CLIPPED_GROUP)
    gigpo_weight: float = _arg(1.0, "GiGPO: weight of the step-level advantage added to the episode-level one.",
                               GIGPO)
    gigpo_gamma: float = _arg(0.95, "GiGPO: discount of the returns from a step that the step groups compare.",
                              GIGPO)
    baseline: Literal["none", "mean", "critic"] = _arg(
        "none", "Baseline subtracted from the cost-to-go (the paper: none).")
    use_critic: bool = _arg(False, "The paper's name for --baseline critic.")
    critic_update_freq: int = _arg(
        1, "--baseline critic: train the critic every N iterations, on the decisions of those N, with its own "
        "optimiser (the paper: 5). With this and --critic_update_iter at 1, it learns in the policy's step.", CRITIC)
    critic_update_iter: int = _arg(
        1, "--baseline critic: passes over those decisions, in minibatches of --per_device_train_batch_size, "
        "each time the critic is trained (the paper: 5).", CRITIC)
    critic_layer_type: Literal["linear", "mlp"] = _arg(
        "linear", "--baseline critic: the value head, one linear layer or an MLP with one hidden layer.", CRITIC)
    shared_critic: bool = _arg(
        True, "The critic reads the policy's hidden state (the only critic the paper's code builds; a critic "
        "with a model of its own is not available).")
    reflect: bool | None = _arg(
        None,
        "Use reflection (RL/eval: default on iff --reflect_load_dir is given; SFT: default "
        "decided by the data's markers).")
    reflect_prob: float = _arg(
        1.0, "Probability that a step's policy prompt includes a reflection.", REFLECTOR)
    reflect_max_new_tokens: int = _arg(100, "Cap on the reflection's length in new tokens.", REFLECTOR,
                                       aliases=["--max_new_tokens"])
    reflect_one_line: bool = _arg(
        True, "Stop a generated reflection at its first newline and keep it on one line, as the SFT data is "
        "(--no_reflect_one_line: only EOS or the token cap stop it, its lines kept whole, as the paper's code).",
        REFLECTOR)
    reflection_memo: bool = _arg(
        True, "Remember each reflection by its prompt's token ids and answer the same prompt again from memory "
        "(exact: the reflector is frozen and reflections are greedy, --argmax_top1 making them a function of the prompt "
        "even where two top logits tie; with --draft_tokens in bf16, exact to rounding: a near-tie may fall either way "
        "with the guesses checked beside it; --no_reflection_memo: generate every one).",
        (REFLECTOR, GREEDY_REFLECTIONS))
    argmax_top1: bool = _arg(
        True, "With --top_k 1, take each reflection token as the argmax of the logits rather than sampling it from "
        "the one token top-k keeps: the same token, without a softmax and a random draw over the vocabulary at "
        "every token (a tenth of a SmolLM2 reflection's time on a CPU). Only where two top logits tie exactly "
        "does it differ: argmax takes the lower token id where sampling draws one of them (--no_argmax_top1: "
        "sample, as transformers does for top_k=1).", (REFLECTOR, GREEDY_REFLECTIONS))
    prefix_cache: bool = _arg(
        True, "Read the prompt prefix a batch's rows share (the reflector's instruction, an ALFWorld room) once, and "
        "give every row its keys and values; kept while the weights stay the same (same choices, log-probs equal "
        "to rounding; --no_prefix_cache: every row reads its whole prompt).")
    policy_memo: bool = _arg(
        False, "Remember the policy's label log-probs by prompt while its weights stay the same, and answer a prompt "
        "seen again from memory (choices without gradient: evaluation, a rollout without --reuse_rollout_pass). The "
        "same distribution to rounding, as the row is not read again in another batch; off by default, so that the "
        "learner goldens keep their bytes.")
    draft_tokens: int = _arg(
        4, "Greedy reflections: guess up to DRAFT_TOKENS tokens of each reflection from text it is likely to repeat "
        "(the episode's previous reflection, its own text so far) and check them in one forward pass, keeping those "
        "the model would have written itself (batched prompt-lookup decoding, utils/draft_decoding.py). The same "
        "text but where rounding moves a near-tie; 0: transformers' generate, one token a pass. Not with "
        "--static_cache.", (REFLECTOR, GREEDY_REFLECTIONS))
    packed_weights: bool = _arg(
        True, "On a CPU, multiply the frozen reflector's linear layers with copies of their weights laid out once "
        "for oneDNN; torch lays a weight out again at every product, which for a reflection's passes of a few rows "
        "costs as much as the product (SmolLM2 in bfloat16, 5 rows: 89 us a layer against 48, the LM head 5.5 ms "
        "against 2.3; utils/packed_weights.py). The same logits in bfloat16 on a CPU that computes it natively; "
        "in float32 another kernel, so equal to rounding (a near-tie may fall the other way). Costs a second copy "
        "of those weights (--no_packed_weights: torch's product).", REFLECTOR)
    static_cache: bool = _arg(
        False, "Generate reflections into a key/value cache allocated once for the longest sequence, not grown "
        "at every token (the same reflections). Off: on a CPU it did not pay (benchmarks/rl_iteration.py).",
        REFLECTOR)
    temperature: float = _arg(1.0, "Sampling temperature of policy and reflection.")
    top_p: float = _arg(1.0, "Nucleus sampling of the reflection: keep the smallest set of tokens of total "
                        "probability >= TOP_P (1: off, the paper's default).", REFLECTOR)
    top_k: int = _arg(0, "Sample the reflection from the TOP_K likeliest tokens only (0: off, like the paper's "
                      "99999; 1: greedy reflections).", REFLECTOR)
    per_device_eval_batch_size: int = _arg(
        8, "Episodes rolled out in parallel per device (RL and evaluation).")
    replay_buffer_size: int = _arg(
        50, "Recent successful episodes kept for replay (0 turns replay off).", PG_OR_GROUP)
    replay_batch_size: int | None = _arg(
        None, "Replayed successes trained on per iteration alongside the fresh ones (0: no replay). Default: the "
        f"learner's ({defaults_help('replay_batch_size')}; rl_algorithms/defaults.py; the group learners' kept by "
        "the ablation on validation episodes, docs/learners.md).", PG_OR_GROUP)
    mask_invalid: bool = _arg(
        True, "The policy chooses among the labels shown only (--no_mask_invalid: among all labels of its "
        "alphabet, a label not shown being a wasted step, as the paper's code).")
    replay_mode: Literal["joint", "separate"] = _arg(
        "joint", "PG replay: train the replayed successes with the fresh episodes in one step (joint), or take "
        "a separate step on one success drawn with replacement and empty the buffer at each new curriculum "
        "level (separate, the paper's code).", PG)
    pg_normalize: Literal["episodes", "decisions"] = _arg(
        "episodes", "PG: divide the batch's summed loss by its episodes (the gradient of the mean episode cost) "
        "or by its decisions (the paper's code).", PG)
    ppo_clip: float = _arg(0.1, "PPO/GRPO/GiGPO ratio clip.", PPO_OR_CLIPPED, aliases=["--ppo_clip_coef"])
    ppo_epochs: int = _arg(3, "PPO/GRPO/GiGPO update epochs per batch of episodes.", PPO_OR_CLIPPED,
                           aliases=["--ppo_update_iter"])
    refuel_eta: float = _arg(1.0, "REFUEL: scale of the return difference.", REFUEL)
    entropy_coef: float = _arg(
        0.0, "PG/PPO/RLOO/GRPO/GiGPO: weight of an entropy bonus on the policy's label distribution, weighted over "
        "decisions as the learner's loss is (the paper: 0, off).", NOT_REFUEL)
    reuse_rollout_pass: bool | None = _arg(
        None, "RL: the policy's forward passes in the training rollout keep their autograd graphs, and the update "
        "reads the fresh episodes' log-probs from them instead of reading every prompt again, so an iteration "
        "saves a forward pass over its decisions (the same gradient, to rounding; replayed episodes are read "
        "again; benchmarks/rl_iteration.py measures it). The "
        "rollout then reads the policy's prompts whole (no --prefix_cache), and the activations of the "
        "iteration's policy passes are held until the update (SmolLM2, 16 episodes: 6.1 GiB more at the peak; "
        "--reuse_rollout_pass=false where memory is short). Default (auto): on a CPU wherever it applies; off on "
        "CUDA, for the memory of a large model, and with --baseline critic or --trainer refuel, which read other "
        "passes (given explicitly there, it is refused).", ONLY_RL)
    resume_from: str | None = _arg(
        None, "RL checkpoint directory to continue from, exactly where it stopped.")

    def __post_init__(self) -> None:
        from rl_algorithms import LEARNERS  # the registry is the one list of learners

        need(self.trainer in LEARNERS, "trainer", f"{self.trainer!r} is not one of {tuple(LEARNERS)}")
        for flag, value in learner_defaults(self.trainer).items():  # not given: the learner's own default
            if getattr(self, flag) is None:
                setattr(self, flag, value)
        if self.use_critic:
            need(self.baseline in ("none", "critic"), "use_critic", f"asks for a critic, but --baseline is "
                 f"{self.baseline!r}")
            self.baseline = "critic"
        need(self.shared_critic, "shared_critic", "a critic with a model of its own is not available (the paper's "
             "code does not build one either: it creates the model and drops it); the critic shares the policy's")
        _at_least(self, 1, "critic_update_freq", "critic_update_iter")
        _at_least(self, 1, "reflect_max_new_tokens", "per_device_eval_batch_size", "ppo_epochs")
        _at_least(self, 0, "replay_buffer_size", "replay_batch_size")
        _positive(self, "temperature", "ppo_clip", "refuel_eta")
        _at_least(self, 0, "entropy_coef", "top_k", "draft_tokens")
        _probability(self, "reflect_prob")
        need(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
        need(self.trainer != "refuel" or self.baseline == "none", "baseline",
              "REFUEL regresses return differences and takes no baseline")
        _at_least(self, 1, "group_size")
        need(self.trainer not in GROUP_LEARNERS or self.group_size >= 2, "group_size",
             f"--trainer {self.trainer} compares the episodes of one start: give --group_size 2 or more")
        need(self.per_device_eval_batch_size % self.group_size == 0, "group_size",
             f"{self.group_size} does not divide --per_device_eval_batch_size {self.per_device_eval_batch_size}")
        need(self.trainer not in GROUP_LEARNERS or self.baseline == "none", "baseline",
             f"--trainer {self.trainer} takes its baseline from the group")
        _at_least(self, 0, "kl_coef", "gigpo_weight")
        need(not self.reuse_rollout_pass or (self.trainer != "refuel" and self.baseline != "critic"),
             "reuse_rollout_pass", "the update would never read the kept passes: REFUEL scores pairs of branches, "
             "and a critic reads hidden states the rollout does not keep")
        need(0.0 <= self.gigpo_gamma <= 1.0, "gigpo_gamma", f"must be in [0, 1], got {self.gigpo_gamma}")
        super().__post_init__()

    @property
    def keep_rollout_passes(self) -> bool:
        """``--reuse_rollout_pass`` settled: as given, or (auto) on a CPU wherever the update reads the passes."""
        if self.reuse_rollout_pass is not None:
            return self.reuse_rollout_pass
        return self.trainer != "refuel" and self.baseline != "critic" and not cuda_available()


@dataclass
class CurriculumArguments(_Group):
    """Which tasks each RL iteration trains on."""

    TITLE: ClassVar[str] = "curriculum"

    taxi_curriculum: bool = _arg(
        False, "Taxi: train pickup, then drop-off, then the full task, a third of the steps each.")
    depth_curriculum: bool = _arg(
        False, "AutoExplore: train on targets of increasing depth.")
    merge_first_two: bool = _arg(
        False, "AutoExplore curriculum: merge the first two depths that hold targets (0 and 1, or 1 and 2).")
    merge_after_first_k: int = _arg(
        3, "AutoExplore curriculum: depths beyond the first k levels form one last level.", DEPTH_CURRICULUM)
    curriculum_index: int | None = _arg(
        None, "Train (or evaluate) one curriculum level only.")
    curriculum_steps: list[int] | None = _arg(
        None, "RL: iterations per curriculum level, in order, summing to --max_steps; levels past the list are not "
        "trained (Taxi: --curriculum_steps 40 80 is pickup for 40 iterations, then drop-off for 80; default: the "
        "environment's own split of --max_steps over every level).")
    few_data: int = _arg(
        0, "RL: train on the first N problems only: ALFWorld games of the training split (in path order, as the "
        "paper's --few_data) or AutoExplore tasks of --task_file (0: all). Evaluation is not affected.")

    def __post_init__(self) -> None:
        _at_least(self, 1, "merge_after_first_k")
        _at_least(self, 0, "few_data")
        _at_least(self, 0, "curriculum_index")
        need(not self.merge_first_two or self.depth_curriculum, "merge_first_two", "needs --depth_curriculum")
        need(self.curriculum_index is None or self.taxi_curriculum or self.depth_curriculum, "curriculum_index",
              "needs --taxi_curriculum or --depth_curriculum")
        if self.curriculum_steps is not None:
            need(self.taxi_curriculum or self.depth_curriculum, "curriculum_steps",
                 "needs --taxi_curriculum or --depth_curriculum")
            need(self.curriculum_index is None, "curriculum_steps",
                 f"splits iterations over several levels, but --curriculum_index {self.curriculum_index} trains one")
            need(bool(self.curriculum_steps) and min(self.curriculum_steps) >= 1, "curriculum_steps",
                 f"one count of at least 1 per level trained, got {self.curriculum_steps}")
        super().__post_init__()
