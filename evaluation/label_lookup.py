"""python -m evaluation.label_lookup --model_name=M --load_dir=CKPT --task_file=TEXTS.jsonl [--use_peft --cpu_bf16]:
how often a policy puts the right label first among the labels its prompt shows, reading the SFT texts' own
analyses (teacher-forced: the oracle's reflection, not a reflector's), by how many labels are shown.

It separates the policy's half of a two-player episode from the reflector's: a policy that cannot find the label of
the command a right analysis names fails whatever the reflector writes. AutoExplore's menus list 3 to 90 commands
(one ``cd``, ``cat`` and ``id`` per file), each under a label (in order in the paper's SFT texts and evaluation, at
random in its RL: ``--shuffle_action``), and the label stands before its command, so the policy must look back from
the command the analysis names to the label in front of it. Give it SFT texts the policy
was not trained on (the validation tasks' texts, ``data_gen.auto_explore.gen_sft --task_file=<data>/validate.json
--output_dir=...``) to choose an SFT budget, and its training texts to tell under-fitting from over-fitting. The
table goes to stdout and, with ``--output_dir``, to ``label_lookup.json`` there.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

from experiment_args import run_script
from prompts import completion_start, shown_menu
from rollout import PolicyScorer
from utils import models
from utils.errors import UsageError
from utils.io import write_json

PROG = "python -m evaluation.label_lookup"
BUCKETS = ((1, 10), (11, 30), (31, None))  # labels shown: a Taxi or ALFWorld menu, a folder, a package's top folder


NEAR = 2  # menu lines: a wrong pick this close to the right one is a near miss


def shown_labels(prompt: str, alphabet: dict[str, int]) -> list[str]:
    """The labels of the menu a policy prompt ends with (:func:`shown_menu`)."""
    return [label for label, _ in shown_menu(prompt, alphabet)]


def miss_kind(commands: list[str], right: int, chosen: int) -> str | None:
    """What a pick at menu line ``chosen`` is, the right one being line ``right``: None where it is right, "same
    name" where it is another command on the same entry (``id load.py`` for ``cat load.py``), "near" where it is
    at most :data:`NEAR` lines away, else "far"."""
    if chosen == right:
        return None
    if commands[chosen].split(" ", 1)[-1] == commands[right].split(" ", 1)[-1]:
        return "same name"
    return "near" if abs(chosen - right) <= NEAR else "far"


def bucket_name(low: int, high: int | None) -> str:
    return f"{low}-{high}" if high is not None else f"{low}+"


def lookup(scorer: PolicyScorer, texts: list[str], batch: int) -> list[tuple[int, str | None, float]]:
    """Per text: how many labels its menu shows, what the policy's first-ranked label among them is
    (:func:`miss_kind`: None where it is the text's own label) and that label's negative log-probability (over the
    shown labels)."""
    items = []
    for number, text in enumerate(texts, 1):
        cut = completion_start(text)
        prompt, label = text[:cut], text[cut:].strip()
        menu = shown_menu(prompt, scorer.label_index)
        labels = [shown for shown, _ in menu]
        if label not in labels:
            raise UsageError(f"--task_file: text {number} is not a policy text whose label is among those it shows "
                             f"(label {label[:40]!r}, shown {labels[:5]}...)")
        items.append((prompt, labels.index(label), menu))
    found = []
    with torch.no_grad():
        for start in range(0, len(items), batch):
            chunk = items[start:start + batch]
            valid = [[scorer.label_index[label] for label, _ in menu] for _, _, menu in chunk]
            logp = scorer.logprobs([prompt for prompt, _, _ in chunk], valid).logprobs
            for (_, right, menu), ids, row in zip(chunk, valid, logp):
                chosen = ids.index(int(row.argmax()))  # the argmax is among the shown labels (the others are masked)
                found.append((len(menu), miss_kind([command for _, command in menu], right, chosen),
                              float(-row[ids[right]])))
    return found


MISSES = ("same name", "near", "far")


def table(found: list[tuple[int, str | None, float]]) -> dict[str, dict]:
    """Per bucket of labels shown, and over all: texts, the share ranked first, the shares of each kind of miss
    (:data:`MISSES`), the mean negative log-probability, and a uniform pick's share (the mean of 1/shown)."""
    rows = {}
    for name, keep in [*((bucket_name(low, high), lambda k, low=low, high=high: low <= k <= (high or k))
                         for low, high in BUCKETS), ("all", lambda k: True)]:
        kept = [(k, miss, nll) for k, miss, nll in found if keep(k)]
        if kept:
            rows[name] = {"texts": len(kept), "first": float(np.mean([miss is None for _, miss, _ in kept])),
                          **{kind: float(np.mean([miss == kind for _, miss, _ in kept])) for kind in MISSES},
                          "nll": float(np.mean([nll for _, _, nll in kept])),
                          "uniform": float(np.mean([1 / k for k, _, _ in kept]))}
    return rows


def markdown(rows: dict[str, dict], where: str) -> str:
    lines = [f"Right label ranked first, teacher-forced ({where}); a wrong first pick is another command on the "
             f"same name, within {NEAR} lines of the right one, or farther:", "",
             "| labels shown | texts | right label first | same name | near | far | uniform pick | mean NLL |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {name} | {r['texts']} | {r['first']:.3f} | {r['same name']:.3f} | {r['near']:.3f} | {r['far']:.3f} "
              f"| {r['uniform']:.3f} | {r['nll']:.2f} |" for name, r in rows.items()]
    return "\n".join(lines) + "\n"


def main(args) -> int:
    if not args.task_file or not Path(args.task_file).is_file():
        raise UsageError(f"--task_file: {args.task_file or '(none)'} is not a file of SFT policy texts (JSON lines)")
    texts = []
    for number, line in enumerate(Path(args.task_file).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            texts.append(json.loads(line)["text"])
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise UsageError(f"--task_file: line {number} of {args.task_file} is not {{\"text\": ...}} ({error})") from None
    policy, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args), adapter_dir=args.load_dir,
                                                        trainable=False)
    policy.eval()
    scorer = PolicyScorer(policy, tokenizer, args.max_seq_length, temperature=1.0, answer=args.policy_answer)
    rows = table(lookup(scorer, texts, args.per_device_eval_batch_size))
    print(markdown(rows, f"{args.load_dir or args.model_name} on {args.task_file}"), flush=True)
    if args.output_dir:
        write_json(Path(args.output_dir) / "label_lookup.json", {"load_dir": args.load_dir, "texts": args.task_file,
                                                                  "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, PROG))
