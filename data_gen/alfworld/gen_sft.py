"""python -m data_gen.alfworld.gen_sft: SFT texts from ``data/alfworld/data_reflection.json``.

Writes ``sft.jsonl``, ``sft_reflection.jsonl`` and ``sft_policy.jsonl`` next to it (or
into ``--output_dir``); see ``data_gen/sft.py`` for what each holds.
"""

import sys

from data_gen.alfworld.reflection import OUT_DIR
from data_gen.sft import gen_sft_main
from envs.alfworld import ALFWorldEnv
from experiment_args import run_script


def main(args) -> int:
    return gen_sft_main(args, ALFWorldEnv, OUT_DIR / "data_reflection.json", "alfworld.gen_sft")


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m data_gen.alfworld.gen_sft"))
