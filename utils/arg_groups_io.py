"""The flags' groups of data generation, the LLM backend, evaluation and logging (the others are in
``utils/arg_groups.py`` and ``utils/arg_groups_model.py``, the helpers every group uses in ``utils/arg_fields.py``);
``experiment_args.ScriptArguments`` composes them all."""

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from utils.arg_fields import (
    API,
    ONLY_EVALUATION,
    ONLY_RL,
    ONLY_SFT,
    PANEL,
    READS_REPOS,
    RL_SCRIPT,
    Applies,
    _arg,
    _at_least,
    _Group,
    _positive,
    _probability,
    need,
    output_folders,
)
from utils.paths import RESULTS_DIR


@dataclass
class DataArguments(_Group):
    """Inputs and outputs of SFT and of the data-generation steps."""

    TITLE: ClassVar[str] = "data and data generation"

    task_file: str | None = _arg(
        None, "SFT: a .jsonl of {'text'} records. AutoExplore RL/eval: a tasks .json file.")
    output_dir: str | None = _arg(None, "Data generation: output folder (default: the step's data/<env>/ path).")
    num_episodes: int = _arg(200, "Data generation: episodes (Taxi, ALFWorld) to roll out.")
    sft_label: Literal["taken", "oracle"] = _arg(
        "taken", "Taxi/ALFWorld gen_sft: label each state with the action taken in the 'oracle + random' "
        "rollout (the paper) or with the oracle's best action.")
    alfworld_spoiler: bool = _arg(
        True, "ALFWorld reflection with an API writer: tell it the expert's next command as a spoiler it must not "
        "quote (--no_alfworld_spoiler: no spoiler, as the paper's ALFWorld writer; its Taxi writer had one).")
    negatives_at: Literal["path", "target_folder"] = _arg(
        "path", "AutoExplore reflection_negative: read a wrong file in up to 2 folders on the way to the target, "
        "one each (path), or read 2 wrong files in the target's own folder (target_folder, the paper's code).")
    sft_positives: Literal["correct", "all"] = _arg(
        "correct", "AutoExplore gen_sft: learn from the writer's positive trajectories that identify a target "
        "(correct), or from all of them, a wrong or no identification included (all, the paper's code).")
    random_prob: float | None = _arg(
        None, "Data generation: probability of a random action instead of the oracle's "
        "(default: 0.9 for Taxi, 0.7 for ALFWorld, as in the paper).")
    holdout_repo: str | None = _arg(
        None, "AutoExplore split_data: every task of this repository (the folder name its tasks' root names) goes "
        "to holdout.json and none to train/validate/test: a generalisation set of a repository training never saw.")
    repo_dir: str | None = _arg(
        None, "A repository folder: the repo envs.play explores; AutoExplore data: the folder of repos a step "
        "reads (filter_repo: the raw repos; later steps: the filtered ones, default "
        "data/auto_explore/repos_filtered).", READS_REPOS)

    def __post_init__(self) -> None:
        _at_least(self, 1, "num_episodes")
        _probability(self, "random_prob")
        output_folders(self, "output_dir")
        super().__post_init__()


@dataclass
class LLMArguments(_Group):
    """The LLM behind data generation and the API-model evaluations."""

    TITLE: ClassVar[str] = "LLM backend"

    api: Literal["openai", "azure", "local", "oracle"] = _arg(
        "openai", "LLM backend for data generation and GPT evaluation.")
    model: str = _arg("gpt-4", "Model (or Azure deployment) name of the LLM backend.", API)
    base_url: str | None = _arg(
        None, "Address of the OpenAI-compatible server: --api=local (default http://localhost:1234/v1), "
        "--api=openai (a proxy; default OpenAI's), --api=azure (default $AZURE_BASE_URL).", API)
    llm_cache: str | None = _arg(None, "Folder caching LLM answers on disk (off by default).", API)
    llm_max_retries: int = _arg(5, "Retries (with backoff) of rate-limited, timed-out or 5xx LLM requests.", API)
    llm_timeout: float = _arg(60.0, "Seconds an LLM request may take.", API)
    llm_max_tokens: int | None = _arg(
        None, "A ceiling on the length of every LLM answer, in tokens (each step has its own: reflections 120, "
        "tasks 600, AutoExplore steps 200, evaluated actions 64); for cheaper runs and slow local servers.", API)
    max_concurrency: int = _arg(8, "LLM requests in flight at once (independent episodes, tasks or files run "
                                   "side by side; the records written do not depend on it).", API)

    def __post_init__(self) -> None:
        _at_least(self, 0, "llm_max_retries")
        _at_least(self, 1, "max_concurrency", "llm_max_tokens")
        _positive(self, "llm_timeout")
        need(not self.base_url or self.base_url.startswith(("http://", "https://")), "base_url",
              f"must start with http:// or https://, got {self.base_url!r}")
        output_folders(self, "llm_cache")
        super().__post_init__()


@dataclass
class EvalArguments(_Group):
    """Evaluation and envs.play."""

    TITLE: ClassVar[str] = "evaluation"

    eval_reps: int = _arg(10, "Times each test task is run in evaluation.", ONLY_EVALUATION)
    eval_level_episodes: int = _arg(
        0, "Evaluation: at least this many episodes per level (e.g. AutoExplore depth): a level's tasks are repeated "
        "ceil(N / tasks) times when that exceeds --eval_reps (0: --eval_reps for every level).", ONLY_EVALUATION)
    eval_levels: list[str] | None = _arg(
        None, "Evaluation: play only these levels' held-out units (e.g. --eval_levels 'depth 1' 'depth 2'; default: "
        "all); RL: those of the validation panel (--eval_steps).",
        Applies(PANEL.where, PANEL.holds, scripts=(RL_SCRIPT,)))
    eval_steps: int = _arg(
        0, "RL: play a fixed validation panel (seeds and tasks apart from the final evaluation's) every this many "
        "iterations and log heldout_success (0: off).", ONLY_RL)
    eval_panel: int = _arg(20, "RL: validation panel episodes per level, task or problem (see --eval_steps).", PANEL)
    validation_task_file: str | None = _arg(
        None, "AutoExplore RL: the tasks of the validation panel (--eval_steps), e.g. the split's validate.json; "
        "without it the panel plays --task_file's tasks (the training tasks) at validation seeds, with a warning.",
        PANEL)
    policy: Literal["oracle", "random", "human"] = _arg(
        "oracle", "envs.play: who picks the actions (the env's oracle, uniform random, or you).")
    runs: int = _arg(1, "Episodes to play (envs.play), or per level or problem (evaluation.evaluate_gpt).")
    eval_load_list: str | None = _arg(
        None, "YAML list of {env, load_dir, reflect_load_dir, name} to evaluate in one run (load_dir: base for "
        "the base model).")
    gpt_protocol: Literal["two_turn", "one_turn", "react"] = _arg(
        "two_turn", "API-model evaluation: at each step the model first reflects, then acts, in one conversation "
        "holding the episode so far (two_turn, the paper's protocol); answers with a thought and an action in "
        "one conversation (react, the paper's ReAct baseline); or answers each observation alone with an "
        "action (one_turn).")

    def __post_init__(self) -> None:
        _at_least(self, 1, "eval_reps", "runs", "eval_panel")
        _at_least(self, 0, "eval_steps", "eval_level_episodes")
        super().__post_init__()


@dataclass
class LoggingArguments(_Group):
    """Where runs are written, and how often."""

    TITLE: ClassVar[str] = "logging and checkpoints"

    ckpt_path: str = _arg(
        str(RESULTS_DIR), "Folder holding the run directories <id>_<script>/.")
    save_steps: int = _arg(100, "Checkpoint every this many SFT steps or RL iterations.")
    save_total_limit: int | None = _arg(
        None, "Keep only the newest N checkpoints of an SFT or RL run (default: all; the paper: 10).")
    preset: Literal["paper"] | None = _arg(
        None, "paper: every setting that utils/parity.py lists takes the paper's value (explicit flags and --config "
        "still win); setting.yml records the resolved values.")
    logging_steps: int = _arg(10, "SFT: log the loss every this many steps.", ONLY_SFT)
    expdirs: list[str] | None = _arg(
        None, "visualization.plot: run directories to plot (NAME=DIR sets the legend label).")
    output_file: str | None = _arg(None, "Where a script writes its single output file (plot PNG ...).")
    config: str | None = _arg(
        None, "YAML file of flag values; explicit command-line flags override it.")

    def __post_init__(self) -> None:
        _at_least(self, 1, "save_steps", "logging_steps", "save_total_limit")
        output_folders(self, "ckpt_path")
        need(not self.output_file or not Path(self.output_file).is_dir(), "output_file",
             f"{self.output_file} is a folder; give a file name")
        super().__post_init__()
