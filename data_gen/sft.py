"""SFT texts from (state, reflection, label) records, built by the shared prompt builder.

The label of a state is the action the "oracle + random" rollout took there (``--sft_label
taken``, the paper's recipe: the policy learns the format and a weak link to the
reflection, and stays exploratory) or the oracle's best action (``--sft_label oracle``).
Records keep both (``taken``, ``action``).

Records keep the paper's choice labels (the data-generation steps render with them); the
texts carry the labels of ``--model_name``'s tokenizer (``prompts.label_alphabet``: the
paper's for the GPT-2 family), and ``labels.json`` beside them says which, so SFT, RL and
evaluation can check that they agree.

Three files, each line ``{"text": ...}``:

* ``sft.jsonl`` — no reflection: ``obs + ACTION_MARKER + label`` (SFT-only and SFT+RLFT without reflection);
* ``sft_reflection.jsonl`` — the reflection model: reflection prompt + reflection;
* ``sft_policy.jsonl`` — the Reflect-RL policy: policy prompt with the reflection + label.
"""

import json
from pathlib import Path

from data_gen.common import print_counts
from prompts import LABELS, policy_sft_text, reflection_sft_text, relabel, relabel_label, write_label_file
from utils.errors import UsageError
from utils.io import read_input, write_jsonl

SFT_FILES = ("sft.jsonl", "sft_reflection.jsonl", "sft_policy.jsonl")


def sft_texts(obs: str, env_cls, label: str, reflection: str, layout: str = "ours") -> tuple[str, str, str]:
    """The three SFT texts of one state, in the order of :data:`SFT_FILES`, in the text ``layout``."""
    head, instruction = env_cls.action_head, env_cls.instruction(layout)
    return (
        policy_sft_text(obs, head, label),
        reflection_sft_text(obs, head, reflection, instruction=instruction, layout=layout),
        policy_sft_text(obs, head, label, reflection=reflection, instruction=instruction, layout=layout),
    )


LABEL_KEYS = {"taken": "taken", "oracle": "action"}  # --sft_label -> the record field it reads


def sft_labels(args) -> tuple[str, ...]:
    """The choice labels of ``--model_name`` (the model the texts are for), or a one-line error
    (``models.load_tokenizer``'s: no such folder, nothing to download ...)."""
    from utils import models

    return models.policy_labels(args.model_name)


def write_sft_files(records: list[dict], env_cls, out_dir: str | Path, label: str, suffix: str = "",
                    labels=LABELS, model: str = "", layout: str = "ours") -> dict[str, int]:
    """Write the three files (``sft<suffix>.jsonl`` ...) from records with state/reflection and the
    label ``--sft_label`` names, carried from the paper's labels into ``labels`` (of ``model``), and
    ``labels.json``."""
    key, head = LABEL_KEYS[label], env_cls.action_head
    columns = list(zip(*(sft_texts(relabel(r["state"], head, labels), env_cls, relabel_label(r[key], labels),
                                   r["reflection"], layout) for r in records))) or [(), (), ()]
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    write_label_file(out_dir, labels, model)
    counts = {}
    for name, texts in zip(SFT_FILES, columns):
        name = name.replace(".jsonl", f"{suffix}.jsonl")
        counts[name] = write_jsonl(Path(out_dir) / name, ({"text": text} for text in texts))
    return counts


def read_records(task_file: Path, label: str) -> list[dict]:
    """The reflection step's records in ``task_file``, each with the fields :func:`write_sft_files` reads (its
    state, its reflection, the label ``--sft_label`` names), or a ``UsageError`` naming the file and record."""
    try:
        records = json.loads(read_input(task_file, "--task_file"))
    except json.JSONDecodeError as error:
        raise UsageError(f"--task_file: {task_file} is not valid JSON ({error})") from None
    if not isinstance(records, list) or not all(isinstance(record, dict) for record in records):
        raise UsageError(f"--task_file: {task_file} must hold a JSON list of records (the reflection step's "
                         "data_reflection.json)")
    if not records:  # SFT files with no text in them: SFT would refuse them, a step later
        raise UsageError(f"--task_file: {task_file} holds no records (the reflection step's data_reflection.json "
                         "holds one per state)")
    key = LABEL_KEYS[label]
    for index, record in enumerate(records):
        if key not in record and "state" in record:
            raise UsageError(f"--sft_label {label}: record {index} of {task_file} has no {key!r} field "
                             "(written before records kept it); run the reflection step again")
        missing = [name for name in ("state", "reflection", key) if not isinstance(record.get(name), str)]
        if missing:
            raise UsageError(f"--task_file: record {index} of {task_file} has no string field "
                             f"{' or '.join(map(repr, missing))} (give the reflection step's data_reflection.json)")
    return records


def gen_sft_main(args, env_cls, default_input: Path, step: str) -> int:
    """``python -m data_gen.<env>.gen_sft``: the three files next to the reflection data (or in --output_dir)."""
    task_file = Path(args.task_file or default_input)
    records = read_records(task_file, args.sft_label)
    out_dir = Path(args.output_dir) if args.output_dir else task_file.parent
    labels = sft_labels(args)
    counts = write_sft_files(records, env_cls, out_dir, label=args.sft_label, labels=labels, model=args.model_name,
                             layout=args.text_layout)
    print_counts(step, {"records": len(records), "label": args.sft_label, **counts,
                        "choice labels": "the paper's" if labels == LABELS else f"{args.model_name}'s",
                        "output": str(out_dir)})
    return 0
