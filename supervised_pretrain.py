"""SFT entry point (HF Trainer on the .jsonl texts, LoRA, loss on the completion only).

Not yet implemented: it lands with the Training issue. The flags are already final.
"""

import sys

from experiment_args import parse_args


def main(args) -> int:
    print("supervised_pretrain.py: not yet implemented (Training issue)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(parse_args(prog="supervised_pretrain.py")))
