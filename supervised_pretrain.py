"""SFT entry point: fine-tune a LoRA adapter on ``{"text": ...}`` lines with the HF Trainer.

    python supervised_pretrain.py --max_steps=2000 --task_file=data/auto_explore/tasks_filtered/sft_policy.jsonl

The loss covers only the completion: the text after the last marker — the reflection
after the analyze marker (reflection data; an EOS is appended so the model learns to
stop), or the choice label after the action marker (policy data; with ``--policy_answer=command`` the command the label
stands for, in its words). ``--reflect=True``/
``False`` insists on one kind. Prompts longer than ``--max_seq_length`` lose their
beginning. Checkpoints land in ``results/<id>_supervised_pretrain/checkpoint-N/`` with
their ``setting.yml`` and ``role.json`` (a reflector or a policy, as the texts end);
``--resume_from CHECKPOINT`` continues a run. torch and transformers' Trainer (10 s to import) load once the
flags are parsed, so ``--help`` and a mistyped flag answer at once.
"""

import inspect
import json
import logging
import sys
from pathlib import Path

from experiment_args import run_script
from prompts import (
    ACTION_MARKER,
    ANALYZE_MARKER,
    check_label_file,
    completion_start,
    label_alphabet,
    tokenizer_name,
)
from utils.complete import resume_hint
from utils.errors import UsageError
from utils.io import on_full_disk, read_input

logger = logging.getLogger(__name__)
SCRIPT = "supervised_pretrain"
IGNORE = -100


def read_texts(task_file: str | None) -> list[str]:
    if not task_file:
        raise UsageError("--task_file: give the SFT .jsonl file (lines of {\"text\": ...})")
    path = Path(task_file)
    texts = []
    for number, line in enumerate(read_input(path, "--task_file").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(f"--task_file: {path}:{number} is not JSON ({error})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise UsageError(f"--task_file: {path}:{number} has no string field 'text'")
        try:
            completion_start(record["text"])  # its marker, after which the completion starts
        except ValueError:
            raise UsageError(f"--task_file: {path}:{number}: its text holds neither {ACTION_MARKER!r} nor "
                             f"{ANALYZE_MARKER!r}, after which its completion starts (data_gen's SFT files hold them)"
                             ) from None
        texts.append(record["text"])
    if not texts:
        raise UsageError(f"--task_file: {path} holds no texts")
    return texts


def encode_example(tokenizer, text: str, max_seq_length: int, reflect: bool | None) -> dict | None:
    """Token ids and labels (-100 on the prompt); None if even the completion does not fit."""
    return encode_examples(tokenizer, [text], max_seq_length, reflect)[0]


def encode_examples(tokenizer, texts: list[str], max_seq_length: int, reflect: bool | None) -> list[dict | None]:
    """:func:`encode_example` of each text, tokenised in two batch calls (a third of the time of one call
    per text)."""
    starts = [completion_start(text) for text in texts]
    markers = []
    for text, start in zip(texts, starts):
        marker = ANALYZE_MARKER if text[:start].endswith(ANALYZE_MARKER) else ACTION_MARKER
        if reflect is not None and (marker == ANALYZE_MARKER) != reflect:
            wanted = "a reflection after" if reflect else "a label after"
            raise UsageError(f"--reflect={reflect}: expected {wanted} the last marker, got text ending {text[-120:]!r}")
        markers.append(marker)
    # Markers end at a token boundary (checked by the loader): the text's tokens are the prompt's, then the
    # completion's. (Tokenising the completion alone could differ: SentencePiece adds a leading space.)
    prompts = tokenizer([text[:start] for text, start in zip(texts, starts)], add_special_tokens=False)["input_ids"]
    wholes = tokenizer(texts, add_special_tokens=False)["input_ids"]
    examples = []
    for text, start, marker, prompt, whole in zip(texts, starts, markers, prompts, wholes):
        if whole[: len(prompt)] != prompt:
            raise UsageError(f"tokenizer {tokenizer_name(tokenizer)!r} merges the marker with the completion in "
                             f"{text[start - 40:start + 40]!r}")
        completion = whole[len(prompt):]
        if marker == ANALYZE_MARKER:
            completion = completion + [tokenizer.eos_token_id]
        room = max_seq_length - len(completion)
        if room < 1:
            examples.append(None)
            continue
        prompt = prompt[-room:]
        examples.append({"input_ids": prompt + completion, "labels": [IGNORE] * len(prompt) + completion})
    return examples


class PadCollator:
    """Right-pads a batch of encoded examples (labels with -100).

    ``completion_logits`` (``--completion_logits``): the batch also says which positions the loss reads, a
    position whose next token is a label (``logits_to_keep``, a boolean mask), and those next tokens
    (``shift_labels``), so the model projects only those positions onto its vocabulary. The loss is the same
    mean over the same tokens: only the prompt's logits, which it never read, are not computed.
    """

    def __init__(self, pad_token_id: int, completion_logits: bool = False):
        self.pad = pad_token_id
        self.completion_logits = completion_logits

    def __call__(self, examples: list[dict]) -> dict:
        import torch

        width = max(len(e["input_ids"]) for e in examples)
        batch = {"input_ids": [], "attention_mask": [], "labels": []}
        for e in examples:
            gap = width - len(e["input_ids"])
            batch["input_ids"].append(e["input_ids"] + [self.pad] * gap)
            batch["attention_mask"].append([1] * len(e["input_ids"]) + [0] * gap)
            batch["labels"].append(e["labels"] + [IGNORE] * gap)
        batch = {k: torch.tensor(v) for k, v in batch.items()}
        if self.completion_logits:
            following = torch.nn.functional.pad(batch["labels"][:, 1:], (0, 1), value=IGNORE)
            batch["logits_to_keep"] = following != IGNORE
            batch["shift_labels"] = following[batch["logits_to_keep"]]
        return batch


def check_data_labels(args, tokenizer, texts: list[str]) -> None:
    """Policy texts must carry the choice labels of the model being trained: those of the data's
    ``labels.json`` (written by gen_sft; none: the paper's) are compared with the tokenizer's."""
    if not any(text[:completion_start(text)].endswith(ACTION_MARKER) for text in texts):
        return  # reflection data shows no choice labels
    check_label_file(Path(args.task_file).parent, label_alphabet(tokenizer), args.model_name,
                     "--task_file's folder")


def command_answers(texts: list[str], alphabet, task_file: str) -> list[str]:
    """``--policy_answer=command``: each policy text answers with the command its label stands for
    (:func:`rollout.commands.command_answer_text`); reflection texts as they are."""
    from rollout.commands import command_answer_text

    answered = []
    for number, text in enumerate(texts, 1):
        if text[:completion_start(text)].endswith(ACTION_MARKER):
            try:
                text = command_answer_text(text, alphabet)
            except ValueError as error:
                raise UsageError(f"--task_file: text {number} of {task_file}: {error}") from None
        answered.append(text)
    return answered


def build_dataset(args, tokenizer, texts: list[str]):
    from datasets import Dataset

    check_data_labels(args, tokenizer, texts)
    if args.policy_answer == "command":
        texts = command_answers(texts, label_alphabet(tokenizer), args.task_file)
    examples = encode_examples(tokenizer, texts, args.max_seq_length, args.reflect)
    kept = [e for e in examples if e is not None]
    if len(kept) < len(examples):
        logger.warning("%d of %d texts dropped: their completion alone exceeds --max_seq_length=%d",
                       len(examples) - len(kept), len(examples), args.max_seq_length)
    if not kept:
        raise UsageError(f"--task_file: no text of {args.task_file} fits --max_seq_length={args.max_seq_length}")
    return Dataset.from_list(kept)


def completion_logits(args, model) -> bool:
    """``--completion_logits``, where the model's forward pass can keep the logits of chosen positions
    (``logits_to_keep``, a mask: transformers' causal LMs); elsewhere every position's, with a warning."""
    if not args.completion_logits:
        return False
    from utils import lm_head

    if "logits_to_keep" in inspect.signature(lm_head.base_model(model).forward).parameters:
        return True
    logger.warning("--completion_logits: %s's forward pass has no logits_to_keep; the LM head runs at every "
                   "position", type(lm_head.base_model(model)).__name__)
    return False


def main(args) -> int:
    # bad data is said at once: before torch and the Trainer import (10 s) and a model loads (GPT-2 XL: minutes)
    texts = read_texts(args.task_file)
    import torch
    from transformers import Trainer, TrainingArguments

    from utils import checkpoints, metrics, models, seeding
    from utils.sft_callbacks import RunFiles, SkipNonFiniteSteps

    seeding.set_seed(args.seed)
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args), adapter_dir=args.load_dir)
    dataset = build_dataset(args, tokenizer, texts)
    run_dir = checkpoints.make_run_dir(args, SCRIPT)
    print(f"[supervised_pretrain] output directory: {run_dir}", flush=True)
    training_args = TrainingArguments(
        output_dir=str(run_dir),
        max_steps=-1 if args.num_train_epochs is not None else args.max_steps,
        num_train_epochs=args.num_train_epochs if args.num_train_epochs is not None else 1.0,
        train_sampling_strategy="group_by_length" if args.group_by_length else "random",
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type=args.lr_scheduler_type,
        warmup_steps=args.warmup_ratio,
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm,
        logging_steps=args.logging_steps,
        save_steps=args.save_steps,
        save_total_limit=None,  # RunFiles prunes, once a checkpoint is whole
        optim=args.optim,
        bf16=args.bf16,
        fp16=args.fp16,
        seed=args.seed,
        data_seed=args.seed,
        report_to="none",
        remove_unused_columns=False,
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
    )
    guard = SkipNonFiniteSteps()
    files = RunFiles(args, run_dir, label_alphabet(tokenizer), checkpoints.sft_role(texts), guard)
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset,
                      data_collator=PadCollator(tokenizer.pad_token_id, completion_logits(args, model)),
                      processing_class=tokenizer,
                      callbacks=[guard, files])
    with on_full_disk(run_dir, then=lambda: resume_hint(run_dir)):
        result = trainer.train(resume_from_checkpoint=args.resume_from)
    final = run_dir / f"checkpoint-{trainer.state.global_step}"
    seconds = result.metrics.get("train_runtime", float("nan")) / max(files.steps_done, 1)
    print(f"[supervised_pretrain] {seconds:.2f} s per step, {metrics.peak_memory()}", flush=True)
    skipped = guard.skipped
    # the Trainer's mean leaves skipped steps out, and is 0.0 where every step was skipped
    loss = float("nan") if skipped and skipped >= files.steps_done else result.training_loss
    print(f"[supervised_pretrain] trained {trainer.state.global_step} steps on {len(dataset)} texts, "
          f"final loss {loss:.4f}; {'adapter' if args.use_peft else 'model'}: {final}"
          + (f" ({skipped} of {files.steps_done} steps skipped for a non-finite loss or gradient: the weights are "
             "those of the steps taken; a lower --learning_rate or float32 may help)" if skipped else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "supervised_pretrain.py"))
