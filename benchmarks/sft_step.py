"""Seconds per SFT step with each SFT optimisation switched on in turn, side by side in one run.

    python -m benchmarks.sft_step [--model_name tiny-gpt2 | --model_name <SmolLM2 .gguf> --cpu_bf16]
        [--task_file FILE.jsonl] [--at_length Q] [--per_device_train_batch_size 16] [--max_steps 5] [--out FILE.json]

Every row trains the same batches (the task file's first texts, in order, or with ``--at_length Q`` the texts
sorted by their length in tokens from the quantile Q on, as ``--group_by_length`` batches them: 0.5 the median's,
1 the longest; without ``--task_file``, the Taxi reflector's SFT texts of 200 "oracle + random 0.5" episodes,
written by the data pipeline into a temporary folder) from the same starting weights (loaded afresh for each row)
and the same seed: the model's forward and backward pass and the AdamW step, as supervised_pretrain.py runs them,
with the scripts' own loader and collator. The first row computes as the paper's code does; each row after it
changes one option of the row before (:data:`ROWS`).
Printed per row: seconds per step (the mean over the steps after the first), the speed-up over the first row,
and the largest difference of a step's loss from the first row's.
"""

import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.rows import own_flags, print_table, refuse, save, steady_mean
from experiment_args import one_line_usage_errors, parse_args

PROG = "python -m benchmarks.sft_step"


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    flags: tuple[str, ...]  # on top of the command line's


ROWS = (
    Row("the LM head at every position, sdpa attention (the paper's code)",
        ("--no_completion_logits", "--attn_implementation=sdpa")),
    Row("+ the LM head at the completion only (--completion_logits)", ("--attn_implementation=sdpa",)),
    Row("+ eager attention (--attn_implementation=eager)", ("--attn_implementation=eager",)),
    Row("+ no dropout (--disable_dropout)", ("--attn_implementation=eager", "--disable_dropout")),
    # eager attention keeps every layer's attention probabilities for the backward pass, in float32: at
    # AutoExplore's 700-800-token policy texts a batch of 8 peaks at 15-20 GiB and takes 2-3x sdpa's time
    Row("the same with sdpa attention again (--attn_implementation=sdpa)", ("--attn_implementation=sdpa",
                                                                           "--disable_dropout")),
)


def taxi_texts(model_name: str, folder: Path) -> Path:
    """The Taxi pickup column's reflector texts (its task and "oracle + random" rate) of 200 episodes, in
    ``model_name``'s labels."""
    import data_gen.taxi.gen_sft
    import data_gen.taxi.reflection
    from recipes import taxi_pickup

    data_gen.taxi.reflection.main(parse_args([*taxi_pickup.TASK, "--api=oracle", "--num_episodes=200",
                                              f"--random_prob={taxi_pickup.DATA_RANDOM_PROB}",
                                              f"--output_dir={folder}", "--seed=0"]))
    data_gen.taxi.gen_sft.main(parse_args(["--env=taxi", f"--model_name={model_name}",
                                           f"--task_file={folder / 'data_reflection.json'}"]))
    return folder / "sft_reflection.jsonl"


def train_steps(argv: list[str], at_length: float | None = None) -> dict:
    """``--max_steps`` SFT steps on the task file's first texts (``at_length``: on its texts sorted by length, from
    that quantile on); the seconds and the loss of each, and the batches' length in tokens."""
    import supervised_pretrain as sft
    from utils import lm_head, models, seeding

    args = parse_args(argv, prog=PROG)
    seeding.set_seed(args.seed)
    model, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args))
    model.train()
    examples = list(sft.build_dataset(args, tokenizer, sft.read_texts(args.task_file)))
    size = args.per_device_train_batch_size
    if at_length is not None:
        examples.sort(key=lambda example: len(example["input_ids"]))
        first = min(int(at_length * len(examples)), max(0, len(examples) - size * args.max_steps))
        examples = examples[first:]
    if len(examples) < size * args.max_steps:
        raise SystemExit(f"{PROG}: error: --task_file {args.task_file} has {len(examples)} texts that fit, fewer "
                         f"than --max_steps x --per_device_train_batch_size = {size * args.max_steps}")
    collate = sft.PadCollator(tokenizer.pad_token_id, sft.completion_logits(args, model))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate,
                                  weight_decay=args.weight_decay)
    seconds, losses, lengths = [], [], []
    for step in range(args.max_steps):
        batch = {k: v.to(models.device()) for k, v in collate(examples[step * size:(step + 1) * size]).items()}
        lengths.append(int(batch["input_ids"].shape[1]))
        tic = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        seconds.append(time.perf_counter() - tic)
        losses.append(loss.item())
    return {"seconds": seconds, "losses": losses, "tokens": lengths,
            "attention": lm_head.base_model(model).config._attn_implementation}


def main(argv: list[str]) -> int:
    own, argv = own_flags(argv, PROG, __doc__, {"--at_length": {
        "type": float, "metavar": "Q", "help": "train on the texts sorted by length, from this quantile on (0-1)"}})
    if own.at_length is not None and not 0 <= own.at_length <= 1:
        refuse(PROG, f"--at_length: a quantile in [0, 1], got {own.at_length}")
    out = own.out
    defaults = ["--model_name=tiny-gpt2", "--per_device_train_batch_size=16", "--max_steps=5", "--seed=0",
                "--learning_rate=2e-3"]
    model_name = parse_args([*defaults, *argv], prog=PROG).model_name
    with tempfile.TemporaryDirectory() as scratch:
        if not any(a.startswith("--task_file") for a in argv):
            argv = [*argv, f"--task_file={taxi_texts(model_name, Path(scratch))}"]
        results, first = [], None
        for row in ROWS:
            trained = train_steps([*defaults, *argv, *row.flags], own.at_length)
            first = first or trained
            results.append({"row": row.name, "s_per_step": steady_mean(trained["seconds"]), **trained,
                            "loss_difference": max(abs(a - b) for a, b in zip(trained["losses"], first["losses"]))})
    base = results[0]["s_per_step"]
    print(f"\nSFT steps ({' '.join(a for a in argv if not a.startswith('--task_file=')) or 'tiny-gpt2'}); "
          f"batches of {', '.join(map(str, results[0]['tokens']))} tokens a text; the mean over steps 2 and after\n")
    print_table(["row", "s / step", "speed-up", "largest loss difference from row 1"], ["---", "---:", "---:", "---:"],
                [[r["row"], f"{r['s_per_step']:.3f}", f"{base / r['s_per_step']:.2f}x", f"{r['loss_difference']:.2g}"]
                 for r in results])
    save(out, results)
    return 0


if __name__ == "__main__":
    sys.exit(one_line_usage_errors(PROG, main, sys.argv[1:]))
