"""python -m data_gen.taxi.brute_force: the paper's brute-force agent, shortest successful Taxi episodes.

Each of ``--num_episodes`` episodes of the task (``--taxi_curriculum --curriculum_index``
0: pickup, 1: dropoff; the full task without them) is solved by breadth-first search over
deep copies of the environment: a shortest action sequence whose last step ends the
episode in success within ``--horizon``. Replaying it gives a record per step.
Output ``data/taxi/<task>/oracle.json`` (``<output_dir>/<task>/`` with ``--output_dir``):
records ``{state, reflection: "", action, reason: "", model: "oracle"}`` (and ``taken``, the
same label, ``command``, ``episode``, ``step``, so that ``gen_sft`` reads them) where ``state``
is the observation in which ``action`` (a label) was taken; the paper's script recorded
the one after it. Episodes with no success within the horizon give no records (counted).
Episode ``i`` starts as episode ``i`` of ``data_gen.taxi.reflection`` with the same seed.
"""

import copy
import sys
from collections import deque
from collections.abc import Callable, Hashable
from pathlib import Path

from data_gen.common import item_rng, print_counts
from data_gen.taxi.reflection import OUT_DIR, data_curriculum, data_env
from envs.base import TextEnv, rng_seed
from envs.taxi import DangerousTaxiEnv
from experiment_args import require_env, run_script
from utils.io import write_json

STEP = "taxi.brute_force"


def shortest_labels(env: TextEnv, key: Callable[[TextEnv], Hashable]) -> list[str] | None:
    """The labels of a shortest sequence from ``env``'s current state (left untouched) whose last
    step ends the episode in success, or None when none does before the horizon.

    Breadth-first over deep copies of the environment, trying the labels in display order
    (ties break deterministically) and skipping a state whose ``key`` was reached before.
    """
    seen = {key(env)}
    frontier = deque([(env, [])])
    while frontier:
        node, path = frontier.popleft()
        for label in node.labels:
            child = copy.deepcopy(node)
            _, _, terminated, truncated, info = child.step(label)
            if terminated and info["success"]:
                return [*path, label]
            if terminated or truncated or key(child) in seen:
                continue
            seen.add(key(child))
            frontier.append((child, [*path, label]))
    return None


def taxi_key(env: DangerousTaxiEnv) -> int:
    """Gymnasium's state number: where taxi, passenger and destination are. In the full task the
    pickup bonus is not in it, but only a drop-off at a wrong depot could reach a state both with
    and without the bonus, and no shortest episode does that."""
    return env.state


def episode(env: DangerousTaxiEnv, seed: int, index: int) -> list[dict] | None:
    """The records of episode ``index``, played by replaying its shortest sequence, or None if it has none."""
    observation, info = env.reset(seed=rng_seed(item_rng(seed, "taxi", index)))
    labels = shortest_labels(env, taxi_key)
    if labels is None:
        return None
    records = []
    for label in labels:
        command = info["actions"][info["labels"].index(label)]
        records.append({"state": observation, "reflection": "", "action": label, "reason": "", "model": "oracle",
                        "taken": label, "command": command, "episode": index, "step": env.steps})
        observation, _, terminated, _, info = env.step(label)
    if not (terminated and info["success"]):
        raise RuntimeError(f"episode {index}: replaying the search's sequence did not succeed")
    return records


def main(args) -> int:
    require_env(args, "taxi", STEP)
    task, env = data_curriculum(args), data_env(args)
    episodes = [episode(env, args.seed, index) for index in range(args.num_episodes)]
    solved = [records for records in episodes if records is not None]
    records = [record for episode_records in solved for record in episode_records]
    path = Path(OUT_DIR if args.output_dir is None else args.output_dir) / task / "oracle.json"
    write_json(path, records)
    mean = len(records) / len(solved) if solved else float("nan")
    print_counts(
        STEP,
        {
            "task": task,
            "episodes": len(episodes),
            "steps": len(records),
            "mean optimal steps": f"{mean:.2f}",
            "unsolved within the horizon": len(episodes) - len(solved),
            "output": str(path),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m data_gen.taxi.brute_force", env="taxi"))
