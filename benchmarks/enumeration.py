"""Single-prompt action enumeration vs SayCan-style scoring of every action's text.

    python -m benchmarks.enumeration [--model_name tiny-gpt2] [--runs 7] [--actions 6 20 50 100]

For AutoExplore states with |A| in {6, 20, 50, 100} (``--actions``) listed actions (real
observations of a generated repository), one decision costs:

* enumeration (the paper): one forward pass over state + numbered list, read the label logits;
* SayCan, uncached: one forward pass over state + action for every action;
* SayCan with the state's KV cache shared across the actions: state once, then all actions.

Printed: median milliseconds per decision, tokens through the model, and the SayCan /
enumeration ratios, all measured side by side in this run.
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.rows import own_flags, refuse
from benchmarks.saycan import SayCanScorer
from envs import make_env
from experiment_args import one_line_usage_errors, parse_args
from prompts import ACTION_MARKER, policy_prompt, split_observation
from rollout import PolicyScorer
from utils import lm_head, models

PROG = "python -m benchmarks.enumeration"
SIZES = (6, 20, 50, 100)


def observation(size: int, root: Path, labels) -> tuple[str, list[str], object]:
    """An AutoExplore observation at a repo root with ``size`` actions (cat + id per file)."""
    repo = root / f"repo{size}"
    repo.mkdir()
    for i in range(size // 2):
        (repo / f"module_{i:03d}.py").write_text(f"def function_{i}():\n    return {i}\n")
    env = make_env("auto_explore", labels=labels)
    task = {"question": "Which file defines function_0?", "filename": "module_000.py", "root": str(repo)}
    obs, info = env.reset(seed=0, options={"task": task})
    return obs, info, env


def timed(work, runs: int) -> float:
    work()  # warm-up
    samples = []
    for _ in range(runs):
        tic = time.perf_counter()
        work()
        samples.append(time.perf_counter() - tic)
    return 1000 * statistics.median(samples)


@torch.no_grad()  # a scoped switch: the caller's grad mode comes back on return
def main(args, sizes: tuple[int, ...] = SIZES) -> int:
    runs = args.runs if args.runs > 1 else 7  # --runs defaults to 1: too few for a median
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args), trainable=False,
                                                       shrink_head=True)
    enumeration = PolicyScorer(model, tokenizer, max_seq_length=args.max_seq_length, temperature=1.0)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for size in sizes:
            obs, info, env = observation(size, Path(scratch), enumeration.labels)
            prompt = policy_prompt(obs, env.action_head)
            valid = [enumeration.label_index[label] for label in info["labels"]]
            state = split_observation(obs, env.action_head)[0] + ACTION_MARKER
            actions = info["actions"]
            enum_ms = timed(lambda p=prompt, v=valid: enumeration.logprobs([p], [v]), runs)
            enum_tokens = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
            row = {"actions": len(actions), "enumeration": (enum_ms, enum_tokens)}
            with lm_head.full_head(model):  # SayCan scores action text over the whole vocabulary
                for name, cache in (("saycan", False), ("saycan_cached", True)):
                    scorer = SayCanScorer(model, tokenizer, cache=cache)
                    ms = timed(lambda s=scorer, st=state, a=actions: s.scores(st, a), runs)
                    row[name] = (ms, scorer.tokens // (runs + 1))
            rows.append(row)
            env.close()
    print(f"\nmodel {args.model_name}; median of {runs} decisions; tokens = tokens through the model per decision\n")
    print("| actions | enumeration ms | tokens | SayCan ms | tokens | x enum | SayCan+KV cache ms | tokens | x enum |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        enum_ms, enum_tokens = row["enumeration"]
        cells = [str(row["actions"]), f"{enum_ms:.1f}", str(enum_tokens)]
        for name in ("saycan", "saycan_cached"):
            ms, tokens = row[name]
            cells += [f"{ms:.1f}", str(tokens), f"{ms / enum_ms:.1f}"]
        print("| " + " | ".join(cells) + " |")
    return 0


def command_line(argv: list[str]) -> int:
    options, argv = own_flags(argv, PROG, __doc__, {"--actions": dict(
        type=int, nargs="+", default=list(SIZES), metavar="N",
        help=f"the listed actions of each row's state, each even: a file is read (cat) or named (id) "
             f"(default: {' '.join(map(str, SIZES))})")}, out=False)
    if any(size < 2 or size % 2 for size in options.actions):
        refuse(PROG, f"--actions: each an even number of at least 2, got {options.actions}")
    return main(parse_args(["--model_name=tiny-gpt2", *argv], prog=PROG), tuple(options.actions))


if __name__ == "__main__":
    sys.exit(one_line_usage_errors(PROG, command_line, sys.argv[1:]))
