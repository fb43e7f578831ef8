"""RLFT entry point: two-player rollouts, REINFORCE / PPO / REFUEL, curricula.

Not yet implemented: it lands with the Training issue. The flags are already final.
"""

import sys

from experiment_args import parse_args


def main(args) -> int:
    print("rl_finetune.py: not yet implemented (Training issue)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(parse_args(prog="rl_finetune.py")))
