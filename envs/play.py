"""Play episodes in the terminal: ``python -m envs.play --env taxi --policy oracle|random|human``.

Prints every observation, the label chosen, the reward and the outcome. AutoExplore
plays tasks from ``--task_file``, or else finds a file of ``--repo_dir`` (default: this
project's ``data_gen`` folder) given as an easy "Find <file>" task. ALFWorld plays the
``--alfworld_split`` problems of ``--alfworld_data`` (or ``$ALFWORLD_DATA``).
"""

import sys

import numpy as np

from envs import EnvSettings, env_kwargs, env_spec, make_env
from experiment_args import run_script


def choose(policy: str, info: dict, rng: np.random.Generator) -> str | None:
    if policy == "oracle":
        if info["oracle_label"] is None:
            raise RuntimeError("the environment knows no oracle action here")
        return info["oracle_label"]
    if policy == "random":
        return str(rng.choice(info["labels"]))
    try:
        return input("label> ").strip()
    except EOFError:
        return None


def play(args) -> list[dict]:
    rng = np.random.default_rng(args.seed)
    settings = EnvSettings.from_args(args)
    env = make_env(args.env, **env_kwargs(settings, evaluation=True))
    spec = env_spec(args.env)
    outcomes = []
    try:
        for episode in range(args.runs):
            obs, info = env.reset(seed=int(rng.integers(2**31 - 1)), options=spec.play_options(settings, rng))
            print(f"===== episode {episode + 1} =====\n{obs}", flush=True)
            while True:
                label = choose(args.policy, info, rng)
                if label is None:
                    print("(input closed; stopping)")
                    return outcomes
                obs, reward, terminated, truncated, info = env.step(label)
                print(f"--> chose {label!r}: reward {reward:+.3f}"
                      + (" (not a listed label: nothing happens)" if info.get("invalid_label") else ""))
                if terminated or truncated:
                    outcome = {"success": info["success"], "cost": info["cost"], "steps": env.steps,
                               "truncated": truncated}
                    print(f"===== {'SUCCESS' if info['success'] else 'FAILURE'}: cost {info['cost']:.3f} "
                          f"after {env.steps} steps{' (horizon reached)' if truncated else ''} =====", flush=True)
                    outcomes.append(outcome)
                    break
                print(obs, flush=True)
    finally:
        env.close()
    wins = sum(o["success"] for o in outcomes)
    print(f"[play] {args.env} / {args.policy}: {wins} of {len(outcomes)} episodes succeeded")
    return outcomes


def main(args) -> int:
    outcomes = play(args)
    return 0 if outcomes else 1


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m envs.play"))
