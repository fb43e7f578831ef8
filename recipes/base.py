"""What a column of the paper's table is to ``demo.py``: a :class:`Recipe`.

A recipe says, in one place, everything one training seed of that column runs: its data steps, the
SFT models and the RL variants with their budgets, the rows of the table and the evaluations they
get, and where it departs from the paper and why. ``demo.py`` runs any recipe the same way:

1. data (``Recipe.data``), in this process;
2. SFT of every role of ``Recipe.sft``, in the side-by-side streams ``Recipe.sft_streams``;
3. RLFT of every variant of ``Recipe.rl``, each playing a fixed validation panel, in the streams
   ``Recipe.rl_streams``: once every SFT has finished, or (``Recipe.overlap``) each RL stream going on where the
   SFT stream of its index ends, a run starting as soon as the SFT models it reads are trained;
4. every row of ``Recipe.rows`` evaluated on each of ``Recipe.evaluations`` (the same episodes for
   every row and training seed), and the reflector's accuracy (``Recipe.accuracy``);
5. the table and the curves.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from utils.arg_groups import DEFAULT_TRAINER
from utils.checkpoints import POLICY, REFLECTOR


@dataclass(frozen=True)
class SFTRole:
    """One SFT model: the file it trains on (in the data folder), its budget, and flags of its own on top of
    the recipe's ``sft_flags`` (e.g. ``--disable_dropout`` for one role only)."""

    file: str
    steps: int
    learning_rate: float
    schedule: str = "constant"
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class RLVariant:
    """One RLFT run: the SFT roles it starts from (None: the base model; no reflector: no reflection), its
    iterations per curriculum level (``--curriculum_steps``; empty: the environment's own split), and flags
    of its own on top of the recipe's task (e.g. another curriculum)."""

    iterations: int
    policy: str | None = None
    reflector: str | None = None
    level_steps: tuple[int, ...] = ()
    flags: tuple[str, ...] = ()

    @property
    def trainer(self) -> str:
        """The run's learner: its ``--trainer=`` flag, else rl_finetune's default (the paper's PG)."""
        return next((flag.split("=", 1)[1] for flag in reversed(self.flags) if flag.startswith("--trainer=")),
                    DEFAULT_TRAINER)


@dataclass(frozen=True)
class CurveFigure:
    """A figure of validation-panel curves of some RL variants (``rl_finetune --eval_steps``), each run's
    iterations shifted by ``shift[name]`` (e.g. to count drop-off iterations after a pickup curriculum)."""

    file: str
    title: str
    variants: tuple[str, ...]
    xlabel: str = "RL iteration"
    shift: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Row:
    """A row of the table: a policy (``sft:<role>`` or ``rl:<variant>``) and the SFT reflector it reads."""

    name: str
    policy: str
    reflector: str | None = None

    @property
    def sft_role(self) -> str | None:
        """The SFT role whose policy the row plays (``sft:<role>``), None for an RL variant's."""
        kind, _, source = self.policy.partition(":")
        return source if kind == "sft" else None

    @property
    def rl_variant(self) -> str | None:
        """The RL variant whose policy the row plays (``rl:<variant>``), None for an SFT role's."""
        kind, _, source = self.policy.partition(":")
        return source if kind == "rl" else None


@dataclass(frozen=True)
class Evaluation:
    """One set of final evaluation episodes: its flags (given the data folder), the levels it reports, each a
    column of the table (``(result level, column name)``), and the rows that play it."""

    flags: Callable[[Path], list[str]]
    columns: tuple[tuple[str, str], ...]
    rows: tuple[str, ...] | None = None  # the rows it is played by (None: every row)


def _no_flags(recipe: "Recipe", data_dir: Path) -> list[str]:
    return []


@dataclass(frozen=True)
class Recipe:
    name: str
    title: str  # e.g. "DangerousTaxi pickup"
    task: tuple[str, ...]  # the environment's flags, shared by every stage
    data: Callable[["Recipe", int, Path], list[tuple[Callable, list[str]]]]  # (main, argv) of each data step
    sft: dict[str, SFTRole]
    sft_streams: tuple[tuple[str, ...], ...]
    rl: dict[str, RLVariant]
    rl_streams: tuple[tuple[str, ...], ...]
    rows: tuple[Row, ...]
    evaluations: dict[str, Evaluation]  # by name; the first is the table's main one
    budget: dict[str, Any]  # every other number the runner reads (see RUNNER_BUDGET)
    departures: tuple[tuple[str, str], ...] = ()  # (what departs from the paper, why), for the report
    accuracy: Callable[..., dict] | None = None  # (recipe, eval_args, row config) -> per-step accuracy
    # trained in full, so never quantised: a CUDA machine keeps the paper's 8-bit default otherwise
    model: tuple[str, ...] = ("--model_name=tiny-gpt2", "--no_use_peft", "--no_load_in_8bit")
    sft_flags: tuple[str, ...] = ("--per_device_train_batch_size=16", "--logging_steps=50")
    extra: dict[str, Any] = field(default_factory=dict)  # the recipe's own numbers (its data budget, ...)
    rl_flags: Callable[["Recipe", Path], list[str]] = _no_flags  # RL's flags given the data folder (task files)
    # The flags of every stage that plays the policy (RL and evaluation; the policies' SFT take theirs in their
    # roles' ``flags``): the label head by default, or the command answers (--policy_answer=command), which need
    # the full head.
    policy_flags: tuple[str, ...] = ("--shrink_head",)
    figures: tuple[CurveFigure, ...] = ()  # validation curves beside rl_curves.png
    # The same column on a pretrained model (``demo.py --model_name``): the recipe for it, given the model's
    # name (None: the column has no recipe for a pretrained model yet).
    pretrained: Callable[[str], "Recipe"] | None = None
    # The same column on one GPU (``demo.py --profile gpu``): the recipe for it, given the model's name (None: the
    # column has no GPU profile).
    gpu: Callable[[str], "Recipe"] | None = None
    # How many processes run independent stages side by side (None: ``demo.py --workers``): a GPU profile runs every
    # SFT, every RL run and every evaluation row at once, on the one GPU.
    workers: int | None = None
    # RL stream i goes on in the process of SFT stream i, each run starting once its SFT models are trained, not
    # after every SFT: runs that read no long-trained model fill the time a long SFT (the reflector's) takes.
    overlap: bool = False
    # The column (recipe name) whose seed folders hold this recipe's data and SFT models, read there or made there
    # under the same keys (``--learners``: a comparison of RL learners trains no SFT model its column has); None:
    # its own.
    shares: str | None = None
    # What the runner says before the recipe starts, when this machine changes what to expect of it (e.g. a
    # CPU that computes in float32 where the recipe's times were measured in bfloat16); None: nothing.
    notice: str | None = None
    # ``demo.py --profile smoke``: the recipe's own numbers (``extra``) changed for the smoke budget (a smaller data
    # set, say); the runner's budget is shrunk alike for every recipe (:meth:`smoke`).
    smoke_extra: dict[str, Any] = field(default_factory=dict)
    # SFT and RL save a checkpoint every this many steps (iterations) as well as at their last, so that a stage cut
    # short resumes from its newest whole one (runner/stages.py); None: at their last only. The last one, which the
    # runner reads, is saved whether or not it is a multiple (the HF Trainer saves at its end, rl_finetune at
    # --max_steps) and is the newest, which --save_total_limit among the flags always keeps (prune_checkpoints).
    save_every: int | None = None
    # RL saves one every this many iterations instead (None: as ``save_every``): an iteration can take minutes where
    # an SFT step takes seconds, so a run of 20 iterations saved every 50 would keep nothing when it is cut short.
    rl_save_every: int | None = None
    # The recipe this one was cut from (``only``: ``demo.py --rows``), whose other rows a seed's report still gives
    # where their evaluations finished under the keys it would run them with (runner/seed.py); None: this one.
    whole: "Recipe | None" = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("save_every", "rl_save_every"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"recipe {self.name}: {name} must be at least 1, got {getattr(self, name)}")
        if self.overlap and len(self.sft_streams) != len(self.rl_streams):
            raise ValueError(f"recipe {self.name}: overlap pairs SFT and RL streams, but there are "
                             f"{len(self.sft_streams)} and {len(self.rl_streams)}")
        missing = set(RUNNER_BUDGET) - set(self.budget)
        if missing:
            raise ValueError(f"recipe {self.name}: budget lacks {sorted(missing)}")
        for name, variant in self.rl.items():
            for role in (variant.policy, variant.reflector):
                if role is not None and role not in self.sft:
                    raise ValueError(f"recipe {self.name}: an RL variant starts from unknown SFT role {role!r}")
            if variant.level_steps and sum(variant.level_steps) != variant.iterations:
                raise ValueError(f"recipe {self.name}: RL variant {name!r} has {variant.iterations} iterations, but its "
                                 f"levels' {list(variant.level_steps)} sum to {sum(variant.level_steps)}")
        names = {row.name for row in self.rows}
        for name, evaluation in self.evaluations.items():
            if evaluation.rows is not None and not set(evaluation.rows) <= names:
                raise ValueError(f"recipe {self.name}: evaluation {name!r} names unknown rows "
                                 f"{sorted(set(evaluation.rows) - names)}")
        for figure in self.figures:
            if not set(figure.variants) | {name for name, _ in figure.shift} <= set(self.rl):
                raise ValueError(f"recipe {self.name}: figure {figure.file!r} names an unknown RL variant")
        for row in self.rows:
            known = row.sft_role in self.sft or row.rl_variant in self.rl  # neither for an unknown kind
            if not known or (row.reflector is not None and row.reflector not in self.sft):
                raise ValueError(f"recipe {self.name}: row {row.name!r} names an unknown model")
        _ = self.players  # refuses a role read as both parts, or by nothing

    @property
    def players(self) -> dict[str, str]:
        """Each SFT role's part, :data:`POLICY` or :data:`REFLECTOR`: what the rows and RL variants read it as
        (a role read as both, or by nothing, is refused)."""
        parts: dict[str, set[str]] = {role: set() for role in self.sft}
        for policy, reflector in [(row.sft_role, row.reflector) for row in self.rows] + [
                (variant.policy, variant.reflector) for variant in self.rl.values()]:
            for role, part in ((policy, POLICY), (reflector, REFLECTOR)):
                if role is not None:
                    parts[role].add(part)
        for role, found in parts.items():
            if len(found) != 1:
                raise ValueError(f"recipe {self.name}: SFT role {role!r} is read as "
                                 f"{' and as '.join(sorted(found)) or 'nothing'} by its rows and RL variants")
        return {role: found.pop() for role, found in parts.items()}

    @property
    def model_name(self) -> str:
        """The base model of every stage (its ``--model_name``)."""
        return next(flag.split("=", 1)[1] for flag in self.model if flag.startswith("--model_name="))

    @property
    def model_label(self) -> str:
        """The base model as the reports name it: ``tiny-gpt2``, a hub id, or a file's or folder's name."""
        return Path(self.model_name).name

    def scaled(self, sft_steps: dict[str, int], iterations: int, **budget) -> "Recipe":
        """This recipe at a small budget, its pipeline and tables unchanged: ``sft_steps`` per SFT role,
        ``iterations`` per RL variant (a curriculum run keeps its levels, each with ``iterations``), ``budget`` over
        the runner's. Reflections are cut at 16 tokens (a reflector of a few SFT steps writes to the cap of 100, and
        generating them would be most of the time) and SFT batches at 4."""
        if self.whole is not None:  # its stages' commands are its whole recipe's, which this would leave unscaled
            raise ValueError(f"recipe {self.name}: scale the whole recipe, then cut its rows (Recipe.only)")

        def shrunk(variant: RLVariant) -> RLVariant:
            steps = tuple(iterations for _ in variant.level_steps)
            return dataclasses.replace(variant, iterations=sum(steps) or iterations, level_steps=steps)

        return dataclasses.replace(
            self, sft={role: dataclasses.replace(spec, steps=sft_steps[role]) for role, spec in self.sft.items()},
            rl={name: shrunk(variant) for name, variant in self.rl.items()}, budget=dict(self.budget, **budget),
            model=(*self.model, "--reflect_max_new_tokens=16"),
            sft_flags=(*self.sft_flags, "--per_device_train_batch_size=4"))  # the later flag wins

    def smoke(self, batch: int | None = None) -> "Recipe":
        """Every stage at a few steps (``demo.py --profile smoke``): minutes of CPU, to check the pipeline end to end
        (and, on the reference numerical path, that this machine gives the committed table:
        ``tests/golden/demo_smoke.md``). ``batch``: the most episodes an RL iteration or an evaluation batch plays
        (``--profile gpu-smoke``: a GPU's batches of ALFWorld games, each in its own process, would take a CPU's
        minutes to start)."""
        if self.whole is not None:  # the whole recipe at the smoke budget, cut to the same rows
            return self.whole.smoke(batch).only([row.name for row in self.rows])
        batches = {} if batch is None else {key: min(self.budget[key], batch)
                                            for key in ("rl_batch", "rl_train_batch", "eval_batch")}
        small = self.scaled({role: 4 if role == "reflector" else 2 for role in self.sft}, 2, eval_episodes=4,
                            panel_every=1, panel_episodes=2, accuracy_episodes=2, **batches,
                            **({"eval_level_episodes": 4} if self.budget.get("eval_level_episodes") else {}))
        return dataclasses.replace(small, extra=self.extra | self.smoke_extra)

    def only(self, names: list[str]) -> "Recipe":
        """This recipe with the rows ``names`` only (``demo.py --rows``), and only the stages they read: the SFT roles
        and RL runs of those rows, in the streams they had. Its name and every kept stage's command are this
        recipe's, so the same seed folder keeps them for a later run of every row, and the evaluations of the rows
        played (a stage a row and evaluation). It remembers this recipe (``whole``), so that the seed's report also
        gives the rows an earlier run played and whose stages still stand."""
        known = [row.name for row in self.rows]
        if not names or len(set(names)) != len(names) or not set(names) <= set(known):
            raise ValueError(f"--rows: each a row of {self.name} ({', '.join(map(repr, known))}), once; got {names}")
        rows = tuple(row for row in self.rows if row.name in names)
        rl = {name: variant for name, variant in self.rl.items()
              if any(row.rl_variant == name for row in rows)}
        used = sft_roles_read(rows, rl)
        sft_streams = tuple(tuple(role for role in stream if role in used) for stream in self.sft_streams)
        rl_streams = tuple(tuple(name for name in stream if name in rl) for stream in self.rl_streams)
        if self.overlap:  # stream i's SFT and RL stay paired; a pair left with nothing goes
            pairs = [(sft, runs) for sft, runs in zip(sft_streams, rl_streams) if sft or runs]
            sft_streams, rl_streams = tuple(sft for sft, _ in pairs), tuple(runs for _, runs in pairs)
        else:
            sft_streams, rl_streams = (tuple(stream for stream in streams if stream)
                                       for streams in (sft_streams, rl_streams))
        evaluations = {name: evaluation if evaluation.rows is None else dataclasses.replace(
            evaluation, rows=tuple(row for row in evaluation.rows if row in names))
            for name, evaluation in self.evaluations.items()}
        return dataclasses.replace(
            self, whole=self.whole or self, rows=rows, rl=rl, sft={role: spec for role, spec in self.sft.items() if role in used},
            sft_streams=sft_streams, rl_streams=rl_streams,
            evaluations={name: evaluation for name, evaluation in evaluations.items() if evaluation.rows != ()},
            accuracy=self.accuracy if any(row.sft_role and row.reflector for row in rows) else None,
            figures=tuple(dataclasses.replace(figure, variants=tuple(name for name in figure.variants if name in rl),
                                              shift=tuple(item for item in figure.shift if item[0] in rl))
                          for figure in self.figures if set(figure.variants) & set(rl)))

    def data_commands(self, seed: int, data: Path) -> list[str]:
        """Each data step of training seed ``seed`` writing its folder ``data``, as one line: module and arguments."""
        return [f"{main.__module__} {' '.join(argv)}" for main, argv in self.data(self, seed, data)]

    def settings(self, seed: int = 0, data: Path = Path("data")) -> dict:
        """Every setting of a seed's pipeline (training seed ``seed``, its data folder ``data``): a finished seed is
        reused only under the same."""
        return {"task": list(self.task), "model": list(self.model), "sft_flags": list(self.sft_flags),
                "data": self.data_commands(seed, data), "rl_flags": self.rl_flags(self, data),
                "sft": {k: vars(v) for k, v in self.sft.items()}, "rl": {k: vars(v) for k, v in self.rl.items()},
                "rows": [vars(row) for row in self.rows], "budget": self.budget, "extra": self.extra,
                # only where set: seeds finished before the field existed saved at the last step alike
                **{name: getattr(self, name) for name in ("save_every", "rl_save_every")
                   if getattr(self, name) is not None}}


def sft_roles_read(rows: tuple[Row, ...] | list[Row], rl: dict[str, RLVariant]) -> set[str]:
    """The SFT roles that ``rows`` and the RL runs ``rl`` read (their policies and reflectors): the SFT a recipe cut
    down to them must still train (``Recipe.only``, ``--learners``)."""
    return ({role for row in rows for role in (row.sft_role, row.reflector)}
            | {role for variant in rl.values() for role in (variant.policy, variant.reflector)}) - {None}


# The paper's row names, which also name the RL variants behind its rows (and the paper's numbers).
SFT_ONLY, SFT_WITH_REFLECTION, RLFT_ONLY = "SFT only", "SFT only, with reflection", "RLFT only"
WITHOUT_REFLECTION, REFLECT_RL = "SFT+RLFT w/o reflection", "Reflect-RL"


def paper_rows(*ablations: Row) -> tuple[Row, ...]:
    """The rows every column of the paper's table has, with a column's own ``ablations`` before Reflect-RL.
    They name the SFT roles ``plain``, ``policy`` and ``reflector`` and the RL variants by row name."""
    return (Row(SFT_ONLY, "sft:plain"), Row(SFT_WITH_REFLECTION, "sft:policy", "reflector"),
            Row(RLFT_ONLY, f"rl:{RLFT_ONLY}"), Row(WITHOUT_REFLECTION, f"rl:{WITHOUT_REFLECTION}"),
            *ablations, Row(REFLECT_RL, f"rl:{REFLECT_RL}", "reflector"))


# The numbers demo.py reads from every recipe's budget. Optional: "eval_level_episodes", the least number of
# evaluation episodes per level (a level's few tasks repeated; 0 or absent: "eval_episodes" per task).
RUNNER_BUDGET = ("rl_batch", "rl_replay", "rl_learning_rate", "rl_baseline", "rl_entropy_coef", "reflect_top_k",
                 "eval_episodes", "eval_seed", "eval_batch", "panel_every", "panel_episodes", "accuracy_episodes",
                 "rl_train_batch")
