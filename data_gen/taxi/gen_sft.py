"""python -m data_gen.taxi.gen_sft: SFT texts from ``data/taxi/data_reflection.json``.

Writes ``sft.jsonl``, ``sft_reflection.jsonl`` and ``sft_policy.jsonl`` next to it (or
into ``--output_dir``); see ``data_gen/sft.py`` for what each holds.
"""

import sys

from data_gen.sft import gen_sft_main
from data_gen.taxi.reflection import OUT_DIR
from envs.taxi import DangerousTaxiEnv
from experiment_args import run_script


def main(args) -> int:
    return gen_sft_main(args, DangerousTaxiEnv, OUT_DIR / "data_reflection.json", "taxi.gen_sft")


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m data_gen.taxi.gen_sft"))
