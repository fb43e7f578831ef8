"""The experiment runner's recipes: each is complete, Taxi pickup stays `make demo`, and AutoExplore's
data keeps its evaluation tasks apart from training's and validation's."""

import json

import pytest

import demo
from recipes import DEFAULT, RECIPES
from recipes.auto_explore import HOLDOUT_REPO
from recipes.base import RUNNER_BUDGET


def test_every_recipe_is_complete_and_taxi_pickup_is_the_default():
    assert DEFAULT == "taxi_pickup"
    for recipe in RECIPES.values():
        assert set(RUNNER_BUDGET) <= set(recipe.budget)
        assert {role for stream in recipe.sft_streams for role in stream} == set(recipe.sft)
        assert {name for stream in recipe.rl_streams for name in stream} == set(recipe.rl)
        assert recipe.departures and all(what and why for what, why in recipe.departures)
        assert json.loads(json.dumps(recipe.settings()))  # a finished seed's settings are plain JSON


def test_auto_explore_has_the_papers_rows():
    rows = [row.name for row in RECIPES["auto_explore"].rows]
    assert rows == ["SFT only", "SFT only, with reflection", "RLFT only", "SFT+RLFT w/o reflection",
                    "SFT+RLFT w/o negative", "Reflect-RL"]
    columns = [title for _, title in demo.columns(RECIPES["auto_explore"])]
    assert columns == ["AutoExplore depth 1", "AutoExplore depth 2", "generalisation: AutoExplore depth 1",
                       "generalisation: AutoExplore depth 2"]


@pytest.mark.slow
def test_auto_explore_data_keeps_evaluation_apart(tmp_path):
    recipe = RECIPES["auto_explore"]
    for main, argv in recipe.data(recipe, 0, tmp_path):
        demo.call(main, argv)
    splits = {name: json.loads((tmp_path / f"{name}.json").read_text())
              for name in ("train", "validate", "test", "holdout")}
    groups = {name: {(t["root"], t["question"]) for t in tasks} for name, tasks in splits.items()}
    for a in groups:
        for b in groups:
            assert a == b or not groups[a] & groups[b], (a, b)
    assert {t["root"] for t in splits["holdout"]} == {HOLDOUT_REPO}
    assert all(t["root"] != HOLDOUT_REPO for name in ("train", "validate", "test") for t in splits[name])
    depths = {t["n_level"] for t in splits["test"]}
    assert {1, 2} <= depths
    assert (tmp_path / "sft_reflection_positive.jsonl").is_file() and (tmp_path / "sft_policy.jsonl").is_file()
