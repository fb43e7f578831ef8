"""The brute-force agent: shortest episodes, records in the state they were taken in, the CLI."""

import copy
import json

import pytest

from data_gen.common import item_rng
from data_gen.taxi import brute_force, gen_sft
from envs import make_env
from envs.base import rng_seed
from envs.taxi import shortest_plan
from experiment_args import parse_args

LEVELS = {"pickup": 0, "dropoff": 1, "plain": None}  # plain: no curriculum


def _args(tmp_path, task, *extra):
    level = [] if LEVELS[task] is None else ["--taxi_curriculum", "--curriculum_index", str(LEVELS[task])]
    return parse_args(["--output_dir", str(tmp_path), *level, *extra], prog="brute_force", env="taxi")


def _run(tmp_path, task, *extra):
    assert brute_force.main(_args(tmp_path, task, *extra)) == 0
    return json.loads((tmp_path / task / "oracle.json").read_text())


@pytest.mark.parametrize("task", LEVELS)
def test_the_search_is_as_short_as_the_env_oracle(task):
    env = make_env("taxi", curriculum=task)
    lengths = []
    for index in range(24):
        env.reset(seed=rng_seed(item_rng(7, "taxi", index)))
        before = env.observation
        labels = brute_force.shortest_labels(env, brute_force.taxi_key)
        assert env.observation == before and env.steps == 0  # the search leaves the env untouched
        plan = shortest_plan(env._taxi, env.state, "pickup" if task == "pickup" else "deliver")
        assert labels is not None and len(labels) == len(plan)
        lengths.append(len(labels))
    assert len(set(lengths)) > 3  # the starts differ


@pytest.mark.parametrize(
    "task, extra", [("pickup", ()), ("dropoff", ("--shuffle_action",)), ("plain", ("--with_history",))]
)
def test_each_record_is_the_state_its_action_was_taken_in(tmp_path, task, extra):
    args = _args(tmp_path, task, "--num_episodes", "8", *extra)
    records = _run(tmp_path, task, "--num_episodes", "8", *extra)
    assert all(r["model"] == "oracle" and r["reflection"] == r["reason"] == "" for r in records)
    env = make_env("taxi", curriculum=task, shuffle_action=args.shuffle_action, with_history=args.with_history)
    at = 0
    for index in range(8):
        observation, _ = env.reset(seed=rng_seed(item_rng(args.seed, "taxi", index)))
        done = False
        while not done:
            record = records[at]
            assert record["state"] == observation and record["action"] in env.labels
            observation, _, terminated, truncated, info = env.step(record["action"])
            done, at = terminated or truncated, at + 1
        assert terminated and info["success"]
    assert at == len(records)


def test_same_seed_same_file_and_another_seed_another(tmp_path):
    files = [(tmp_path / name / "pickup" / "oracle.json") for name in ("a", "b", "c")]
    for folder, seed in zip(("a", "b", "c"), ("3", "3", "4"), strict=True):
        _run(tmp_path / folder, "pickup", "--num_episodes", "10", "--seed", seed)
    assert files[0].read_bytes() == files[1].read_bytes() != files[2].read_bytes()


def test_cli_writes_the_file_and_counts_unsolved_episodes(tmp_path, capsys):
    records = _run(tmp_path, "dropoff", "--num_episodes", "6", "--horizon", "5")
    summary = capsys.readouterr().out
    assert "[taxi.brute_force] task: dropoff, episodes: 6" in summary
    unsolved = int(summary.split("unsolved within the horizon: ")[1].split(",")[0])
    assert 0 < unsolved < 6  # some drop-offs take more than 5 steps
    assert records and sum(r["state"].count("Previous actions: none") for r in records) == 6 - unsolved


def test_a_copy_plays_on_its_own_and_shares_only_the_transition_table():
    env = make_env("taxi")
    env.reset(seed=1)
    clone = copy.deepcopy(env)
    assert clone._taxi.P is env._taxi.P and clone._taxi is not env._taxi and clone.np_random is not env.np_random
    clone.step(clone.labels[0])
    assert (env.steps, clone.steps) == (0, 1) and env.observation != clone.observation


def test_gen_sft_reads_the_records(tmp_path):
    records = _run(tmp_path, "pickup", "--num_episodes", "3")
    task_file = tmp_path / "pickup" / "oracle.json"
    assert gen_sft.main(parse_args([f"--task_file={task_file}", f"--output_dir={tmp_path / 'sft'}"], env="taxi")) == 0
    texts = [json.loads(line)["text"] for line in (tmp_path / "sft" / "sft.jsonl").read_text().splitlines()]
    assert len(texts) == len(records) and all(t.endswith(f"\n{r['action']}") for t, r in zip(texts, records))
