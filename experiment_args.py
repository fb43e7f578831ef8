"""The one argument dataclass shared by every script of the project.

Every entry point (``supervised_pretrain.py``, ``rl_finetune.py``, the evaluation
scripts and the data-generation steps) parses :class:`ScriptArguments` with
:func:`parse_args`, so a flag means the same thing everywhere and a run's
``setting.yml`` can be replayed by any script.

Flags keep the names of the paper's README (``--load_dir``, ``--reflect_load_dir``,
``--shrink_head``, ``--depth_curriculum`` ...). Values come from, in increasing
precedence: the defaults below, ``--config FILE.yaml``, explicit command-line flags.
"""

import argparse
import dataclasses
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args, get_type_hints

import yaml
from transformers import HfArgumentParser

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent
ALFWORLD_PAPER_TASK = "pick_and_place_simple-Tomato-None-Microwave"


def _arg(default, help: str, group: str, **kwargs):
    """A dataclass field carrying its help string and its ``--help`` section."""
    return field(default=default, metadata={"help": help, "group": group, **kwargs})


MODEL = "model, LoRA and precision"
OPTIM = "optimisation"
ENV = "environment"
RL = "reinforcement learning"
CURRICULUM = "curriculum"
DATA = "data and data generation"
EVAL = "evaluation"
LOGGING = "logging and checkpoints"


@dataclass
class ScriptArguments:
    # --- model, LoRA and precision -------------------------------------------------
    model_name: str = _arg(
        "gpt2-xl",
        "Base model: a Hugging Face hub id, a local model directory, or 'tiny-gpt2' "
        "(built offline, random weights, for tests and the CPU demo).",
        MODEL,
    )
    load_dir: str | None = _arg(
        None,
        "Adapter directory of the policy to start from (an SFT checkpoint-N/). "
        "RL fine-tunes it; without it RL trains a new LoRA on the base model.",
        MODEL,
    )
    reflect_model_name: str | None = _arg(
        None, "Base model of the reflection model (default: --model_name).", MODEL
    )
    reflect_load_dir: str | None = _arg(
        None,
        "Adapter directory of the frozen reflection model. Reflection is used iff this is given "
        "(unless --reflect says otherwise).",
        MODEL,
        aliases=["--reflectload_dir"],
    )
    use_peft: bool = _arg(True, "Train LoRA adapters (peft) instead of all weights.", MODEL)
    peft_lora_r: int = _arg(64, "LoRA rank.", MODEL)
    peft_lora_alpha: int = _arg(16, "LoRA alpha.", MODEL)
    lora_dropout: float = _arg(0.1, "LoRA dropout.", MODEL)
    lora_target_modules: list[str] | None = _arg(
        None, "Module names LoRA adapts (default: peft's choice for the architecture).", MODEL
    )
    load_in_8bit: bool = _arg(
        True, "Load the base model in 8 bits (bitsandbytes; CUDA only, ignored on CPU).", MODEL
    )
    load_in_4bit: bool = _arg(False, "Load the base model in 4 bits (bitsandbytes; CUDA only).", MODEL)
    bf16: bool = _arg(True, "Compute in bfloat16 (CUDA only; fp32 on CPU).", MODEL)
    fp16: bool = _arg(False, "Compute in float16 (CUDA only).", MODEL)
    gradient_checkpointing: bool = _arg(False, "Trade compute for memory in SFT and RL.", MODEL)
    shrink_head: bool = _arg(
        False,
        "Replace the policy's LM head by one over the choice-label tokens only "
        "(rows copied from the model's head, frozen).",
        MODEL,
    )
    max_seq_length: int = _arg(
        1024, "Longest prompt in tokens; longer prompts are cut from the left.", MODEL
    )

    # --- optimisation --------------------------------------------------------------
    learning_rate: float = _arg(2e-4, "Adam learning rate (SFT and RL).", OPTIM)
    weight_decay: float = _arg(0.001, "Adam weight decay.", OPTIM)
    max_grad_norm: float = _arg(0.3, "Gradient-norm clip.", OPTIM)
    lr_scheduler_type: str = _arg("constant", "Learning-rate schedule of SFT (HF names).", OPTIM)
    warmup_ratio: float = _arg(0.03, "Warm-up fraction of SFT.", OPTIM)
    max_steps: int = _arg(2000, "SFT optimiser steps, or RL iterations.", OPTIM)
    per_device_train_batch_size: int = _arg(4, "SFT batch size per device.", OPTIM)
    gradient_accumulation_steps: int = _arg(1, "SFT gradient accumulation steps.", OPTIM)
    seed: int = _arg(42, "Seed of every random generator of the run.", OPTIM)

    # --- environment ---------------------------------------------------------------
    env: Literal["auto_explore", "taxi", "alfworld"] = _arg(
        "auto_explore", "Environment to train or evaluate on.", ENV
    )
    horizon: int | None = _arg(
        None, "Steps before an episode is truncated (default: the environment's own).", ENV
    )
    shuffle_action: bool = _arg(
        False, "Show each action list with a random sample of the choice labels.", ENV
    )
    with_prompt: bool = _arg(False, "Taxi: start the observation with the rule description.", ENV)
    with_history: bool = _arg(
        False, "Taxi: show the initial grid and each step's action and grid, not just action names.", ENV
    )
    easy: bool = _arg(False, "AutoExplore: the question is 'Find <file>'.", ENV)
    first_step: bool = _arg(
        False, "Train the first decision only (a contextual bandit; AutoExplore and Taxi).", ENV
    )
    leaveout_prob: float = _arg(
        0.5,
        "AutoExplore: probability to leave an entry off the path to the target out of the sandbox "
        "(training only; evaluation uses 0).",
        ENV,
    )
    alfworld_data: str | None = _arg(
        None, "ALFWorld json_2.1.1 data root (default: $ALFWORLD_DATA).", ENV
    )
    alfworld_task: str = _arg(
        ALFWORLD_PAPER_TASK, "ALFWorld task family: trial folder name prefix ('' for all).", ENV
    )
    alfworld_split: str = _arg(
        "train", "ALFWorld split for training: train, valid_seen, valid_unseen, valid_train, or valid (all three valid_*; what evaluation uses).", ENV
    )
    alfworld_expert: Literal["handcoded", "planner"] = _arg(
        "handcoded", "ALFWorld expert giving the oracle action.", ENV
    )
    alfworld_timeout: float = _arg(
        60.0, "Seconds an ALFWorld reset or step may take before the game is skipped.", ENV
    )

    # --- reinforcement learning ----------------------------------------------------
    trainer: Literal["pg", "ppo", "refuel"] = _arg(
        "pg", "RL learner: REINFORCE (the paper), PPO, or REFUEL.", RL
    )
    baseline: Literal["none", "mean", "critic"] = _arg(
        "none", "Baseline subtracted from the cost-to-go (the paper: none).", RL
    )
    reflect: bool | None = _arg(
        None,
        "Use reflection (RL/eval: default on iff --reflect_load_dir is given; SFT: default "
        "decided by the data's markers).",
        RL,
    )
    reflect_prob: float = _arg(
        1.0, "Probability that a step's policy prompt includes a reflection.", RL
    )
    reflect_max_new_tokens: int = _arg(100, "Cap on the reflection's length in new tokens.", RL)
    temperature: float = _arg(1.0, "Sampling temperature of policy and reflection.", RL)
    per_device_eval_batch_size: int = _arg(
        8, "Episodes rolled out in parallel per device (RL and evaluation).", RL
    )
    replay_buffer_size: int = _arg(
        50, "Recent successful episodes kept for replay (0 turns replay off).", RL
    )
    replay_batch_size: int = _arg(
        4, "Replayed episodes trained on per iteration alongside the fresh ones.", RL
    )
    ppo_clip: float = _arg(0.1, "PPO ratio clip.", RL)
    ppo_epochs: int = _arg(3, "PPO update epochs per batch of episodes.", RL)
    refuel_eta: float = _arg(1.0, "REFUEL: scale of the return difference.", RL)
    resume_from: str | None = _arg(
        None, "RL checkpoint directory to continue from, exactly where it stopped.", RL
    )

    # --- curriculum ----------------------------------------------------------------
    taxi_curriculum: bool = _arg(
        False, "Taxi: train pickup, then drop-off, then the full task, a third of the steps each.", CURRICULUM
    )
    depth_curriculum: bool = _arg(
        False, "AutoExplore: train on targets of increasing depth.", CURRICULUM
    )
    merge_first_two: bool = _arg(False, "AutoExplore curriculum: merge depths 0 and 1.", CURRICULUM)
    merge_after_first_k: int = _arg(
        3, "AutoExplore curriculum: depths beyond the first k levels form one last level.", CURRICULUM
    )
    curriculum_index: int | None = _arg(
        None, "Train (or evaluate) one curriculum level only.", CURRICULUM
    )

    # --- data and data generation --------------------------------------------------
    task_file: str | None = _arg(
        None, "SFT: a .jsonl of {'text'} records. AutoExplore RL/eval: a tasks .json file.", DATA
    )
    api: Literal["openai", "azure", "local", "oracle"] = _arg(
        "openai", "LLM backend for data generation and GPT evaluation.", DATA
    )
    model: str = _arg("gpt-4", "Model (or Azure deployment) name of the LLM backend.", DATA)
    base_url: str = _arg(
        "http://localhost:1234/v1", "Address of the OpenAI-compatible server of --api=local.", DATA
    )

    output_dir: str | None = _arg(None, "Data generation: output folder (default: the step's data/<env>/ path).", DATA)
    num_episodes: int = _arg(200, "Data generation: episodes (Taxi, ALFWorld) to roll out.", DATA)
    random_prob: float | None = _arg(
        None, "Data generation: probability of a random action instead of the oracle's "
        "(default: 0.9 for Taxi, 0.7 for ALFWorld, as in the paper).", DATA
    )
    llm_cache: str | None = _arg(None, "Folder caching LLM answers on disk (off by default).", DATA)
    llm_max_retries: int = _arg(5, "Retries (with backoff) of rate-limited, timed-out or 5xx LLM requests.", DATA)
    llm_timeout: float = _arg(60.0, "Seconds an LLM request may take.", DATA)
    repo_dir: str | None = _arg(
        None, "A repository folder: the repo envs.play explores; AutoExplore data: the folder of repos a step "
        "reads (filter_repo: the raw repos; later steps: the filtered ones, default "
        "data/auto_explore/repos_filtered).", DATA
    )

    # --- evaluation ----------------------------------------------------------------
    eval_reps: int = _arg(10, "Times each test task is run in evaluation.", EVAL)
    policy: Literal["oracle", "random", "human"] = _arg(
        "oracle", "envs.play: who picks the actions (the env's oracle, uniform random, or you).", EVAL
    )
    runs: int = _arg(1, "Episodes to play (envs.play), or per level (evaluation.evaluate_gpt).", EVAL)
    scenario: str | None = _arg(None, "evaluation.evaluate_gpt: the environment, taxi or alfworld.", EVAL)
    eval_load_list: str | None = _arg(
        None, "YAML list of {env, load_dir, reflect_load_dir} to evaluate in one run.", EVAL
    )

    # --- logging and checkpoints ---------------------------------------------------
    ckpt_path: str = _arg(
        str(REPO_ROOT / "results"), "Folder holding the run directories <id>_<script>/.", LOGGING
    )
    save_steps: int = _arg(100, "Checkpoint every this many SFT steps or RL iterations.", LOGGING)
    logging_steps: int = _arg(10, "SFT: log the loss every this many steps.", LOGGING)
    expdirs: list[str] | None = _arg(
        None, "visualization.plot: run directories to plot (NAME=DIR sets the legend label).", LOGGING
    )
    output_file: str | None = _arg(None, "Where a script writes its single output file (plot PNG ...).", LOGGING)
    config: str | None = _arg(
        None, "YAML file of flag values; explicit command-line flags override it.", LOGGING
    )

    def __post_init__(self) -> None:
        self._validate()
        self._fall_back_without_cuda()

    def _validate(self) -> None:
        def need(ok: bool, flag: str, message: str) -> None:
            if not ok:
                raise ValueError(f"--{flag}: {message}")

        for name, hint in get_type_hints(ScriptArguments).items():
            if getattr(hint, "__origin__", None) is Literal:
                allowed = get_args(hint)
                need(getattr(self, name) in allowed, name, f"{getattr(self, name)!r} is not one of {allowed}")
        need(not (self.load_in_8bit and self.load_in_4bit), "load_in_4bit", "cannot be combined with --load_in_8bit")
        need(not (self.bf16 and self.fp16), "fp16", "cannot be combined with --bf16")
        need(self.peft_lora_r >= 1, "peft_lora_r", f"must be >= 1, got {self.peft_lora_r}")
        need(self.peft_lora_alpha > 0, "peft_lora_alpha", f"must be > 0, got {self.peft_lora_alpha}")
        need(0.0 <= self.lora_dropout < 1.0, "lora_dropout", f"must be in [0, 1), got {self.lora_dropout}")
        need(self.max_seq_length >= 16, "max_seq_length", f"must be >= 16, got {self.max_seq_length}")
        need(self.learning_rate > 0, "learning_rate", f"must be > 0, got {self.learning_rate}")
        need(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        need(self.max_grad_norm > 0, "max_grad_norm", f"must be > 0, got {self.max_grad_norm}")
        need(0.0 <= self.warmup_ratio < 1.0, "warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        need(self.max_steps >= 1, "max_steps", f"must be >= 1, got {self.max_steps}")
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "per_device_eval_batch_size",
                     "reflect_max_new_tokens", "ppo_epochs", "eval_reps", "runs", "save_steps", "logging_steps",
                     "merge_after_first_k"):
            need(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        need(self.horizon is None or self.horizon >= 1, "horizon", f"must be >= 1, got {self.horizon}")
        need(0.0 <= self.leaveout_prob <= 1.0, "leaveout_prob", f"must be in [0, 1], got {self.leaveout_prob}")
        need(0.0 <= self.reflect_prob <= 1.0, "reflect_prob", f"must be in [0, 1], got {self.reflect_prob}")
        need(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")
        need(self.replay_buffer_size >= 0, "replay_buffer_size", f"must be >= 0, got {self.replay_buffer_size}")
        need(self.replay_batch_size >= 0, "replay_batch_size", f"must be >= 0, got {self.replay_batch_size}")
        need(self.ppo_clip > 0, "ppo_clip", f"must be > 0, got {self.ppo_clip}")
        need(self.refuel_eta > 0, "refuel_eta", f"must be > 0, got {self.refuel_eta}")
        need(self.alfworld_timeout > 0, "alfworld_timeout", f"must be > 0, got {self.alfworld_timeout}")
        need(self.num_episodes >= 1, "num_episodes", f"must be >= 1, got {self.num_episodes}")
        need(self.random_prob is None or 0.0 <= self.random_prob <= 1.0, "random_prob",
             f"must be in [0, 1], got {self.random_prob}")
        need(self.llm_max_retries >= 0, "llm_max_retries", f"must be >= 0, got {self.llm_max_retries}")
        need(self.llm_timeout > 0, "llm_timeout", f"must be > 0, got {self.llm_timeout}")
        need(not self.taxi_curriculum or self.env == "taxi", "taxi_curriculum", f"needs --env=taxi, got --env={self.env}")
        need(not self.depth_curriculum or self.env == "auto_explore", "depth_curriculum",
             f"needs --env=auto_explore, got --env={self.env}")
        need(not self.merge_first_two or self.depth_curriculum, "merge_first_two", "needs --depth_curriculum")
        if self.curriculum_index is not None:
            need(self.taxi_curriculum or self.depth_curriculum, "curriculum_index",
                 "needs --taxi_curriculum or --depth_curriculum")
            need(self.curriculum_index >= 0, "curriculum_index", f"must be >= 0, got {self.curriculum_index}")
            if self.taxi_curriculum:
                need(self.curriculum_index < 3, "curriculum_index",
                     f"Taxi has levels 0 (pickup), 1 (dropoff), 2 (full); got {self.curriculum_index}")
        need(not (self.first_step and self.env == "alfworld"), "first_step", "is for --env=auto_explore or taxi")
        need(self.trainer != "refuel" or self.baseline == "none", "baseline",
             "REFUEL regresses return differences and takes no baseline")
        need(not self.base_url or self.base_url.startswith(("http://", "https://")), "base_url",
             f"must start with http:// or https://, got {self.base_url!r}")

    def _fall_back_without_cuda(self) -> None:
        """Let the paper's GPU defaults (8-bit, bf16) run on a CPU-only machine."""
        wanted = [name for name in ("load_in_8bit", "load_in_4bit", "bf16", "fp16") if getattr(self, name)]
        if not wanted or _cuda_available():
            return
        for name in wanted:
            setattr(self, name, False)
        logger.warning("No CUDA device: %s turned off; the model runs in float32 on the CPU.",
                       ", ".join(f"--{n}" for n in wanted))

    @property
    def use_reflection(self) -> bool:
        """Whether RL and evaluation put a reflection in the policy prompt."""
        return bool(self.reflect_load_dir) if self.reflect is None else self.reflect

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


class _GroupedParser(HfArgumentParser):
    """HfArgumentParser that lists the fields under their ``group`` in ``--help``."""

    def _add_dataclass_arguments(self, dtype) -> None:
        hints = get_type_hints(dtype)
        groups: dict[str, argparse._ArgumentGroup] = {}
        for f in dataclasses.fields(dtype):
            metadata = dict(f.metadata)
            title = metadata.pop("group")
            if title not in groups:
                groups[title] = self.add_argument_group(title)
            clone = dataclasses.field(default=f.default, default_factory=f.default_factory, metadata=metadata)
            clone.name, clone.type = f.name, hints[f.name]
            self._parse_dataclass_field(groups[title], clone)
            if clone.type == bool | None:
                # A bare ``--reflect`` means True, as for the plain bool flags.
                self._actions[-1].nargs, self._actions[-1].const = "?", True


def build_parser(prog: str | None = None) -> HfArgumentParser:
    return _GroupedParser(ScriptArguments, prog=prog, allow_abbrev=False,
                          usage="%(prog)s [flags]   (all flags: --help)",
                          description="Reflect-RL: every script shares these flags.")


def _yaml_to_argv(path: str) -> list[str]:
    """Turn a YAML mapping of flag values into command-line words (so argparse checks the types)."""
    config_file = Path(path)
    if not config_file.is_file():
        raise ValueError(f"--config: no such file {path!r}")
    try:
        values = yaml.safe_load(config_file.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"--config: {path} is not valid YAML: {error}") from None
    if not isinstance(values, dict):
        raise ValueError(f"--config: {path} must hold a mapping of flag names to values")
    known = {f.name for f in dataclasses.fields(ScriptArguments)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"--config: {path} has unknown keys {unknown}")
    argv: list[str] = []
    for key, value in values.items():
        if key == "config" or value is None:
            continue
        if isinstance(value, list):
            argv += [f"--{key}", *map(str, value)]
        else:
            argv.append(f"--{key}={value}")
    return argv


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> ScriptArguments:
    """Parse ``argv`` (default ``sys.argv[1:]``) with ``--config`` values under the explicit flags."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    try:
        prefix = _yaml_to_argv(known.config) if known.config else []
        (args,) = parser.parse_args_into_dataclasses(args=prefix + argv, look_for_args_file=False)
    except ValueError as error:
        parser.error(str(error))
    return args

