"""python -m gpu.profile: every column's GPU profile (``demo.py --profile gpu``, recipes/gpu.py) in one Markdown table,
as docs/gpu.md shows it."""

import argparse
import sys

from recipes import RECIPES


def profile_table(model_name: str = "SmolLM2-135M-Instruct.Q4_1.gguf") -> str:
    """Every column's GPU profile in one Markdown table (``python -m recipes.gpu``; docs/gpu.md shows it)."""
    lines = ["| column | SFT: steps x texts a step, rate | RL: iterations x episodes, rate | evaluation episodes a row "
             "| processes at once |", "|---|---|---|---|---:|"]
    for recipe in RECIPES.values():
        profile = recipe.gpu(model_name)
        batch = next((flag.split("=")[1] for flag in reversed(profile.sft_flags)
                      if flag.startswith("--per_device_train_batch_size=")), "?")
        sft = ", ".join(f"{role} {spec.steps} x {batch} at {spec.learning_rate:g}{' (cosine)' if spec.schedule == 'cosine' else ''}"
                        for role, spec in profile.sft.items())
        rl = ", ".join(sorted({f"{variant.iterations} x {profile.budget['rl_batch']}" for variant in profile.rl.values()}))
        level = profile.budget.get("eval_level_episodes")
        evaluation = f"{level} a level" if level else f"{profile.budget['eval_episodes']}"
        lines.append(f"| {recipe.name} | {sft} | {rl}, at {profile.budget['rl_learning_rate']:g} | {evaluation} | "
                     f"{profile.workers} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m gpu.profile", description=__doc__.split("\n\n")[0]).parse_args(argv)
    print(profile_table(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
