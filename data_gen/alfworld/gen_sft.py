"""python -m data_gen.alfworld.gen_sft: SFT texts from ``data/alfworld/data_reflection.json``.

Writes ``sft.jsonl``, ``sft_reflection.jsonl`` and ``sft_policy.jsonl`` next to it (or
into ``--output_dir``); see ``data_gen/sft.py`` for what each holds.
"""

import sys
from pathlib import Path

from data_gen.alfworld.reflection import OUT_DIR
from data_gen.common import print_counts, read_json
from data_gen.sft import write_sft_files
from envs.alfworld import ALFWorldEnv
from experiment_args import parse_args


def main(args) -> int:
    task_file = Path(args.task_file or OUT_DIR / "data_reflection.json")
    records = read_json(task_file)
    out_dir = Path(args.output_dir) if args.output_dir else task_file.parent
    counts = write_sft_files(records, ALFWorldEnv, out_dir)
    print_counts("alfworld.gen_sft", {"records": len(records), **counts, "output": str(out_dir)})
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args(prog="python -m data_gen.alfworld.gen_sft")))
