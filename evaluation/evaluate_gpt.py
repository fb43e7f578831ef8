"""Evaluate an API model on DangerousTaxi or ALFWorld.

    python -m evaluation.evaluate_gpt --scenario=taxi --runs=100 --api=openai --model=gpt-4
    python -m evaluation.evaluate_gpt --scenario=alfworld --runs=20 --api=local --base_url=http://localhost:1234/v1

The episodes are those of ``evaluation.evaluate`` (the same held-out seeds; Taxi: ``--runs``
per curriculum level, or the one ``--curriculum_index`` names; ALFWorld: ``--runs`` per
``valid`` problem), played by the model with a detailed instruction (see
``evaluation/gpt_agent.py``). Prints and saves success rate, average cost and the count
of unusable answers in ``results/<id>_evaluate_gpt/``.
"""

import sys

from envs import env_spec
from evaluation.gpt_common import run_gpt_evaluation
from experiment_args import run_script


def main(args) -> int:
    evaluator = env_spec(args.env).api_evaluator
    if evaluator != "evaluation.evaluate_gpt":
        raise ValueError(f"--scenario (--env): an API model on {args.env} is evaluated by python -m {evaluator}")
    return run_gpt_evaluation(args, "evaluate_gpt", reps=args.runs)


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m evaluation.evaluate_gpt"))
