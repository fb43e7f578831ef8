"""The environment registry: a new environment is one file and one registry line.

A toy environment, registered in ``envs.ENVS`` here and nowhere else, runs RL for two iterations
and an evaluation; outside ``envs/`` no code branches on an environment's name.
"""

import json
import re
from pathlib import Path

import pytest

import envs
import rl_finetune
from envs.base import Outcome, TextEnv
from envs.curriculum import single_level
from envs.spec import EnvSpec
from evaluation import evaluate
from utils.checkpoints import run_dirs

REPO = Path(__file__).resolve().parents[1]


class NumberLine(TextEnv):
    """Walk from 0 to ``goal`` on a line; each step costs 0.1."""

    default_horizon = 6

    def _reset(self, options: dict) -> None:
        self.position, self.goal = 0, int(options.get("goal", 2))

    def _state_text(self) -> str:
        return f"You stand at {self.position}; the goal is at {self.goal}.\n"

    def _action_texts(self) -> list[str]:
        return ["step left", "step right"]

    def _act(self, index: int) -> Outcome:
        self.position += 1 if index else -1
        return Outcome(reward=-0.1, terminated=self.position == self.goal)

    def _oracle_index(self) -> int:
        return int(self.goal > self.position)

    def _success(self) -> bool:
        return self.position == self.goal


TOY = EnvSpec(
    name="number_line", make=NumberLine, settings=lambda args, **_: {},
    curriculum=lambda args, max_steps: single_level("both goals", [{"goal": 2}, {"goal": -1}], max_steps),
    held_out=lambda args, env: [({"goal": 2}, "goal 2"), ({"goal": -1}, "goal -1")],
)


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setitem(envs.ENVS, TOY.name, TOY)


def test_a_registered_environment_trains_and_evaluates(toy_registered, make_args, tmp_path):
    args = make_args(env="number_line", max_steps=2, save_steps=2, per_device_eval_batch_size=2,
                     per_device_train_batch_size=2)
    assert rl_finetune.main(args) == 0
    (run,) = run_dirs(tmp_path / "results", "rl_finetune")
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    episodes = [json.loads(line) for line in (run / "checkpoint-2" / "episodes.jsonl").read_text().splitlines()]
    assert episodes and all(e["steps"] for e in episodes)

    result = evaluate.run(make_args(env="number_line", eval_reps=3, per_device_eval_batch_size=3),
                          [{"env": "number_line", "load_dir": str(run / "checkpoint-2"), "name": "toy"}])
    (levels,) = [r["levels"] for r in result.results]
    assert {name: level["episodes"] for name, level in levels.items()} == {"goal 2": 3, "goal -1": 3, "all": 6}


def test_an_unregistered_environment_is_named(make_args):
    with pytest.raises(ValueError, match="--env: 'number_line' is not one of"):
        make_args(env="number_line")
    with pytest.raises(ValueError, match="unknown environment 'number_line'"):
        envs.make_env("number_line")


def test_flags_of_one_environment_are_checked_through_the_specs(make_args, toy_registered, caplog):
    with pytest.raises(ValueError, match="--taxi_curriculum: is for --env=taxi, got --env=number_line"):
        make_args(env="number_line", taxi_curriculum=True)
    with pytest.raises(ValueError, match="--first_step: is for --env=auto_explore or taxi"):
        make_args(env="alfworld", first_step=True)
    make_args(env="number_line", with_history=True)
    assert "--with_history (only with --env taxi)" in caplog.text


def test_every_spec_is_complete():
    for name, spec in envs.ENVS.items():
        assert spec.name == name and issubclass(spec.make, TextEnv)
        for module in (*spec.data_steps, spec.api_evaluator):
            assert (REPO / (module.replace(".", "/") + ".py")).is_file(), module
        assert spec.api_instructions


def test_an_api_model_needs_the_environments_instructions(toy_registered):
    from evaluation.gpt_agent import api_instructions

    assert api_instructions("taxi") == envs.ENVS["taxi"].api_instructions
    with pytest.raises(ValueError, match="--env number_line: its EnvSpec gives no api_instructions"):
        api_instructions("number_line")


def test_nothing_outside_envs_branches_on_an_environment_name():
    pattern = re.compile(r"args\.env (==|!=|in) |\.env == ")
    found = [f"{path.relative_to(REPO)}:{n}" for path in REPO.rglob("*.py")
             if path.relative_to(REPO).parts[0] not in ("envs", "tests", ".venv", "build")
             for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []
