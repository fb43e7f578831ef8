"""Evaluate an API model on AutoExplore.

    python -m evaluation.auto_explore_gpt --task_file=data/auto_explore/tasks_filtered/test.json --eval_reps=10

Every task of ``--task_file`` is played ``--eval_reps`` times (the same seeds as
``evaluation.evaluate``) by the model behind ``--api``/``--model``/``--base_url``, with
a detailed instruction. Prints and saves success rate and average cost per target depth,
and the count of unusable answers, in ``results/<id>_auto_explore_gpt/``.
"""

import sys

from evaluation.gpt_common import run_gpt_evaluation
from experiment_args import require_env, run_script


def main(args) -> int:
    require_env(args, "auto_explore", "auto_explore_gpt")
    return run_gpt_evaluation(args, "auto_explore_gpt", reps=args.eval_reps)


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m evaluation.auto_explore_gpt", env="auto_explore"))
