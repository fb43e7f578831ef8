"""The experiment runner's recipes: each is complete, Taxi pickup stays `make demo`, and AutoExplore's
data keeps its evaluation tasks apart from training's and validation's."""

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

import demo
from prompts import LABELS, shown_menu
from recipes import DEFAULT, RECIPES
from recipes.auto_explore import HOLDOUT_REPO
from recipes.base import RUNNER_BUDGET, Row
from runner import report, stages
from runner import seed as runner_seed


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
    columns = [title for _, title in report.columns(RECIPES["auto_explore"])]
    assert columns == ["AutoExplore depth 1", "AutoExplore depth 2", "generalisation: AutoExplore depth 1",
                       "generalisation: AutoExplore depth 2"]


@pytest.mark.slow
def test_auto_explore_data_keeps_evaluation_apart(tmp_path):
    recipe = RECIPES["auto_explore"]
    for main, argv in recipe.data(recipe, 0, tmp_path):
        stages.call(main, argv)
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


def test_auto_explore_labels_are_the_papers_in_order_for_sft_and_evaluation_and_random_in_rl(tmp_path):
    """The paper's gen_sft writes its texts with the labels in order (shuffle_action=False), its RL command passes
    --shuffle_action=True, and its evaluation keeps the default (in order)."""
    from recipes import auto_explore

    recipe = RECIPES["auto_explore"]
    steps = recipe.data(recipe, 0, tmp_path)
    assert not any("--shuffle_action" in argv for _, argv in steps)
    assert "--shuffle_action" not in recipe.task and "--shuffle_action" in recipe.rl_flags(recipe, tmp_path)
    assert "--shuffle_action" not in runner_seed.evaluation_argv(recipe, recipe.evaluations["held-out"], tmp_path)
    pretrained = auto_explore.on_pretrained("tiny-gpt2")
    assert pretrained.task == recipe.task and "--shuffle_action" in pretrained.rl_flags(pretrained, tmp_path)
    for main, argv in steps:
        stages.call(main, argv)
    texts = [json.loads(line)["text"] for line in (tmp_path / "sft_policy.jsonl").read_text().splitlines()]
    for text in texts:
        menu = shown_menu(text, LABELS)
        assert menu and [label for label, _ in menu] == list(LABELS[: len(menu)])
    # with random labels the policies' texts change and the reflectors' do not, byte for byte: a data step run again
    # for such a flag keeps the reflectors' SFT (keyed by its texts' bytes, tests/test_stage_keys.py)
    shuffled = tmp_path / "shuffled"
    for main, argv in recipe.data(recipe, 0, shuffled):
        stages.call(main, [*argv, "--shuffle_action"] if main.__module__.endswith(".gen_sft") else argv)
    for name in ("sft_reflection.jsonl", "sft_reflection_positive.jsonl"):
        assert (shuffled / name).read_bytes() == (tmp_path / name).read_bytes(), name
    for name in ("sft_policy.jsonl", "sft_policy_positive.jsonl", "sft.jsonl"):
        assert (shuffled / name).read_bytes() != (tmp_path / name).read_bytes(), name


@pytest.mark.slow
def test_auto_explore_runs_end_to_end_and_its_benchmark_is_the_same_for_every_seed(tmp_path, monkeypatch):
    """The whole AutoExplore column at a tiny budget: six rows, depth 1 and 2 on the test split and on the
    held-out repository, each depth at least its minimum of episodes, the reflector's accuracy. The tasks
    and their split do not depend on the training seed; the trajectories do."""
    from recipes import auto_explore
    from tests.test_demo import ONE_PROCESS

    recipe = RECIPES["auto_explore"]
    # the validation panel (44 tasks) at the first iteration only: at every other it was most of RL's episodes
    small = recipe.scaled({role: 2 for role in recipe.sft}, 2, eval_level_episodes=6, panel_every=4,
                   accuracy_episodes=1, eval_batch=8)
    # the held-out repository's tasks once each, not GENERALISATION_REPS times (its 35 tasks x 6 rows, 4 times,
    # were 2 of this test's 8 minutes)
    small = dataclasses.replace(small, evaluations={**small.evaluations, "generalisation": auto_explore.evaluation_on(
        "holdout.json", "--eval_reps=1", "--eval_level_episodes=0")},
        # prompts of 384 tokens at most (the median is 520): reading them was most of this test's time
        model=(*small.model, "--max_seq_length=256"))
    monkeypatch.setitem(RECIPES, recipe.name, small)
    assert demo.main(["--task", "auto_explore", f"--ckpt_path={tmp_path}", "--seed", "3", *ONE_PROCESS]) == 0
    root = tmp_path / "demo" / "auto_explore"
    run = json.loads((root / "results.json").read_text())["3"]
    assert [r["name"] for r in run["results"]] == [row.name for row in recipe.rows]
    for result in run["results"]:
        for level in ("depth 1", "depth 2", "generalisation: depth 1", "generalisation: depth 2"):
            assert result["levels"][level]["episodes"] >= 6, (result["name"], level)
        assert "depth 0" not in result["levels"]  # the columns' depths only
    data = root / "seed-3" / "data"
    test = json.loads((data / "test.json").read_text())
    depth2 = [t for t in test if t["n_level"] == 2]
    assert run["results"][0]["levels"]["depth 2"]["units"] == len(depth2)
    report = (root / "seed-3" / "results.md").read_text()
    episodes = len(depth2) * math.ceil(6 / len(depth2))  # each task alike, to the minimum of 6
    assert f"AutoExplore depth 2: {episodes} episodes of {len(depth2)} distinct tasks" in report
    assert "| accuracy | " in report and run["reflector_accuracy"]["all"][1] > 0
    assert (root / "seed-3" / "rl_curves.png").is_file() and (root / "seed-3" / "negatives_curves.png").is_file()

    other = tmp_path / "seed-4"  # another training seed: the same benchmark, other trajectories
    for main, argv in recipe.data(recipe, 4, other):
        stages.call(main, argv)
    for split in ("train", "validate", "test", "holdout"):
        assert [t["question"] for t in json.loads((other / f"{split}.json").read_text())] == \
               [t["question"] for t in json.loads((data / f"{split}.json").read_text())]
    assert (other / "sft_policy.jsonl").read_text() != (data / "sft_policy.jsonl").read_text()


def test_taxi_dropoff_has_the_papers_rows_and_the_curriculum_ablation():
    recipe = RECIPES["taxi_dropoff"]
    assert [row.name for row in recipe.rows] == [
        "SFT only", "SFT only, with reflection", "RLFT only", "SFT+RLFT w/o reflection", "Reflect-RL w/o curriculum",
        "SFT+RLFT w/o reflection, w/o curriculum", "Reflect-RL"]
    assert [title for _, title in report.columns(recipe)] == ["Taxi +drop-off", "full task: Taxi full task"]
    cl, no_cl = recipe.rl["Reflect-RL"], recipe.rl["Reflect-RL w/o curriculum"]
    assert len(cl.level_steps) == 2 and cl.level_steps[1] == no_cl.iterations  # as many drop-off iterations
    assert "--curriculum_index=1" in no_cl.flags  # drop-off from the first iteration
    assert recipe.rl["SFT+RLFT w/o reflection"].level_steps == cl.level_steps


def test_taxi_dropoff_runs_what_reads_no_reflector_while_the_reflector_trains():
    """Its RL runs go on in the SFT streams (overlap): the policies' stream trains them, then the runs that read no
    reflector, then the one that reads it; Reflect-RL follows the reflector's SFT in its stream."""
    recipe = RECIPES["taxi_dropoff"]
    assert recipe.overlap and recipe.sft_streams[0] == ("reflector",) and recipe.rl_streams[0] == ("Reflect-RL",)
    readers = [recipe.rl[name].reflector is not None for name in recipe.rl_streams[1]]
    assert readers == sorted(readers) and readers[-1]  # every run without a reflector first
    assert recipe.sft["reflector"].steps == 1500 and recipe.sft["policy"] == RECIPES["taxi_pickup"].sft["policy"]


def test_overlap_pairs_each_rl_stream_with_an_sft_stream():
    recipe = RECIPES["taxi_dropoff"]
    with pytest.raises(ValueError, match="overlap pairs SFT and RL streams, but there are 2 and 1"):
        dataclasses.replace(recipe, rl_streams=(tuple(recipe.rl),))


@pytest.mark.parametrize("policy, reflector", [
    ("sft:nowhere", None),  # an SFT role the recipe does not train
    ("rl:nowhere", None),  # an RL variant it does not run
    ("sft:RLFT only", None),  # an RL variant's name under the SFT kind
    ("rl:policy", None),  # an SFT role's name under the RL kind
    ("ppo:policy", None),  # a kind that is neither
    ("sft:policy", "nowhere"),  # a reflector it does not train
])
def test_a_row_naming_a_model_the_recipe_does_not_make_is_refused(policy, reflector):
    recipe = RECIPES["taxi_pickup"]
    assert "policy" in recipe.sft and "RLFT only" in recipe.rl  # so each case above is wrong only as it says
    rows = (*recipe.rows, Row("bad", policy, reflector))
    with pytest.raises(ValueError, match="row 'bad' names an unknown model"):
        dataclasses.replace(recipe, rows=rows)


def test_each_sft_role_plays_the_part_its_rows_and_rl_variants_read_it_as():
    """A role's part comes from what reads it, not from its name or file: the command answers' flag goes to the
    policies' SFT only, whatever their files are called; a role read as both parts, or by nothing, is refused."""
    from recipes import auto_explore

    for recipe in RECIPES.values():
        assert set(recipe.players.values()) == {"policy", "reflector"}
    assert RECIPES["auto_explore"].players == {"reflector": "reflector", "reflector_positive": "reflector",
                                               "policy": "policy", "plain": "policy", "policy_positive": "policy"}
    renamed = {role: dataclasses.replace(spec, file=f"{role}_texts.jsonl") if role.startswith("reflector")
               else dataclasses.replace(spec, file=f"sft_reflection_{role}.jsonl")
               for role, spec in auto_explore.PRETRAINED_SFT.items()}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(auto_explore, "PRETRAINED_SFT", renamed)
        sft = auto_explore.answering("command")["sft"]
    assert {role for role, spec in sft.items() if "--policy_answer=command" in spec.flags} == {
        "policy", "plain", "policy_positive"}
    recipe = RECIPES["taxi_pickup"]
    with pytest.raises(ValueError, match="'plain' is read as policy and as reflector"):
        dataclasses.replace(recipe, rows=(*recipe.rows, Row("bad", "sft:policy", "plain")))
    with pytest.raises(ValueError, match="'spare' is read as nothing"):
        dataclasses.replace(recipe, sft={**recipe.sft, "spare": recipe.sft["plain"]})


@pytest.mark.slow
def test_taxi_dropoff_runs_end_to_end_with_its_curricula_and_figure(tmp_path, monkeypatch, capsys):
    """The drop-off column at a tiny budget: the curriculum runs train pickup then drop-off, the others drop-off
    only; every run's panel plays drop-off validation episodes; every row is judged on drop-off and Reflect-RL
    also on the full task; the final episodes are apart from training's and the panel's."""
    from evaluation.episodes import HELD_OUT_SEED, VALIDATION_SEED
    from tests.test_demo import ONE_PROCESS
    from utils import checkpoints, metrics

    recipe = RECIPES["taxi_dropoff"]
    small = recipe.scaled({role: 2 for role in recipe.sft}, 2, eval_episodes=4, panel_every=1, panel_episodes=2,
                   accuracy_episodes=2)
    monkeypatch.setitem(RECIPES, recipe.name, dataclasses.replace(small, extra=dict(recipe.extra, data_episodes=10)))
    assert demo.main(["--task", "taxi_dropoff", f"--ckpt_path={tmp_path}", "--seed", "1", *ONE_PROCESS]) == 0
    root = tmp_path / "demo" / "taxi_dropoff"
    results = json.loads((root / "results.json").read_text())["1"]["results"]
    assert [r["name"] for r in results] == [row.name for row in recipe.rows]
    for result in results:
        assert result["levels"]["dropoff"]["episodes"] == 4
        assert ("full task: full" in result["levels"]) == (result["name"] == "Reflect-RL")
    seed = root / "seed-1"
    assert (seed / "dropoff_curves.png").is_file() and "–" in (seed / "results.md").read_text()
    data = json.loads((seed / "data" / "data_reflection.json").read_text())
    assert {r["state"].count("X") > 0 for r in data} == {True, False}  # pickup and drop-off states (X: carried)
    for name, variant in small.rl.items():
        (run,) = checkpoints.run_dirs(seed / "runs" / f"rl-{runner_seed.slug(name)}", "rl_finetune")
        records = metrics.read_metrics(run)
        levels = [r["level"] for r in records if "level" in r]
        assert levels == (["pickup"] * 2 + ["dropoff"] * 2 if variant.level_steps else ["dropoff"] * 2), name
        assert all(r["heldout_episodes"] == 2 for r in records if "heldout_success" in r)  # drop-off only
        episodes = [json.loads(x) for x in (run / f"checkpoint-{variant.iterations}" / "episodes.jsonl")
                    .read_text().splitlines()]
        assert all(e["seed"] < HELD_OUT_SEED < VALIDATION_SEED for e in episodes)
    accuracy = json.loads((root / "results.json").read_text())["1"]["reflector_accuracy"]
    assert accuracy["episodes"][1] == 2 and 0 <= accuracy["episodes"][0] <= accuracy["all"][0]

    # the reflector check: the seed's SFT policy reads each given reflector on validation episodes, never held-out
    import recipes.accuracy

    played = []

    def validation(args, env, reps):
        played.extend(start.seed for start in VALIDATION(args, env, reps))
        return VALIDATION(args, env, reps)

    VALIDATION = recipes.accuracy.SPLITS["validation"]
    monkeypatch.setitem(recipes.accuracy.SPLITS, "validation", validation)
    reflector = next((seed / "runs" / "sft-reflector").glob("*_supervised_pretrain/checkpoint-2"))
    said = []
    monkeypatch.setattr(demo, "say", said.append)
    check = ["--task", "taxi_dropoff", f"--ckpt_path={tmp_path}", "--seed", "1", "--check_reflectors"]
    assert demo.main([*check, str(reflector), str(reflector)]) == 0
    rows = [line for line in said[-1].splitlines() if line.startswith(f"| {reflector} |")]
    assert len(rows) == 2 and rows[0] == rows[1] and rows[0].endswith("| 2 |")  # 2 episodes, the same for each
    assert len(played) == 4 and all(VALIDATION_SEED <= s < VALIDATION_SEED + 2 for s in played)
    for argv, error in (([*check, str(tmp_path / "none")], "is not a checkpoint folder"),
                        (["--task", "taxi_dropoff", f"--ckpt_path={tmp_path}", "--seed", "2", "--check_reflectors",
                          str(reflector)], "no SFT policy in .*seed-2.*: run the seed first")):
        with pytest.raises(SystemExit):
            demo.main(argv)
        assert re.search(f"--check_reflectors: .*{error}", capsys.readouterr().err)


def _fake_run(recipe, success: float) -> dict:
    levels = {level: {"success": success, "episodes": 200, "cost": 0.0, "units": 1}
              for level, _ in report.columns(recipe)}
    return {"results": [{"name": row.name, "levels": levels} for row in recipe.rows], "reflector_accuracy": {},
            "timings": {}}


def test_task_all_runs_every_recipe_and_writes_the_papers_table_beside_ours(tmp_path, monkeypatch):
    played = []

    def finished(recipe, seed, folder, workers, cores=None, home=None):
        played.append((recipe.name, seed))
        return _fake_run(recipe, {0: 0.10, 1: 0.30}[seed])

    monkeypatch.setattr(demo, "finished_or_run", finished)
    assert demo.main(["--task", "all", "--seeds", "0", "1", f"--ckpt_path={tmp_path}"]) == 0
    assert played == [(name, seed) for name in RECIPES for seed in (0, 1)]
    table = (tmp_path / "demo" / "paper_table.md").read_text()
    reflect = next(line for line in table.splitlines() if line.startswith("| Reflect-RL |"))
    cells = [cell.strip() for cell in reflect.strip("|").split("|")][1:]
    header = next(line for line in table.splitlines() if line.startswith("| model / method"))
    columns = [cell.strip() for cell in header.strip("|").split("|")][1:]
    assert dict(zip(columns, cells)) == {
        "AutoExplore depth 1": "20.0% (10.0–30.0) / 36%", "AutoExplore depth 2": "20.0% (10.0–30.0) / 17%",
        "Taxi pickup": "20.0% (10.0–30.0) / 58%", "Taxi +drop-off": "20.0% (10.0–30.0) / 29%",
        "ALFWorld": "20.0% (10.0–30.0) / 74%"}
    negative = next(line for line in table.splitlines() if line.startswith("| SFT+RLFT w/o negative |"))
    assert "/ 33%" in negative and "| – |" in negative  # AutoExplore's ablation; not a Taxi row
    from recipes.paper_table import markdown

    pickup_only = markdown([(RECIPES["taxi_pickup"], {0: _fake_run(RECIPES["taxi_pickup"], 0.5)})])
    row = next(line for line in pickup_only.splitlines() if line.startswith("| Reflect-RL |"))
    assert "| 50.0% (50.0–50.0) / 58% |" in row and "| not run / 74% |" in row  # a column no recipe reported


def test_the_papers_table_lists_every_row_of_the_recipes_run_each_in_its_order():
    from recipes.paper_table import row_order

    dropoff = [row.name for row in RECIPES["taxi_dropoff"].rows]
    assert row_order([(RECIPES["taxi_dropoff"], {})]) == [*dropoff[:-1], "SFT+RLFT w/o negative", "Reflect-RL"]
    assert row_order([(RECIPES[name], {}) for name in ("taxi_pickup", "auto_explore", "taxi_dropoff")]) == [
        "SFT only", "SFT only, with reflection", "RLFT only", "SFT+RLFT w/o reflection", "SFT+RLFT w/o negative",
        "Reflect-RL w/o curriculum", "SFT+RLFT w/o reflection, w/o curriculum", "Reflect-RL"]


def test_alfworld_has_the_papers_rows_on_the_papers_family():
    recipe = RECIPES["alfworld"]
    assert [row.name for row in recipe.rows] == ["SFT only", "SFT only, with reflection", "RLFT only",
                                                 "SFT+RLFT w/o reflection", "Reflect-RL"]
    assert "--alfworld_task=pick_and_place_simple-Tomato-None-Microwave" in recipe.task
    assert recipe.budget["eval_level_episodes"] >= 200


def test_alfworld_runs_rlft_only_beside_the_sft_stream():
    """RLFT only reads no SFT model, so its stream starts it at once while the other trains the three SFT models
    and runs Reflect-RL; SFT+RLFT w/o reflection follows in the second stream, waiting for its policy (overlap)."""
    recipe = RECIPES["alfworld"]
    assert recipe.overlap and recipe.sft_streams == (("reflector", "policy", "plain"), ())
    assert recipe.rl_streams == (("Reflect-RL",), ("RLFT only", "SFT+RLFT w/o reflection"))
    assert recipe.rl["RLFT only"].policy is None and recipe.rl["RLFT only"].reflector is None


@pytest.mark.slow
@pytest.mark.alfworld
def test_alfworld_runs_end_to_end_training_on_train_trials_and_judged_on_valid_ones(tmp_path, monkeypatch):
    """The ALFWorld column at a tiny budget on a copy of the hand-made game as its train and valid trials: RL
    and its validation panel play the train trials, the final evaluation the valid ones (repeated to its
    minimum), at seeds apart from each other's."""
    import importlib.util
    import shutil

    from evaluation.episodes import HELD_OUT_SEED, VALIDATION_SEED
    from tests.conftest import HANDMADE_GAME as fixture
    from tests.test_demo import ONE_PROCESS
    from utils import checkpoints

    if importlib.util.find_spec("alfworld") is None:
        pytest.skip("alfworld is not installed")
    root = tmp_path / "alfworld"
    for split, trial in (("train", "trial_a"), ("train", "trial_b"), ("valid_seen", "trial_c"),
                         ("valid_unseen", "trial_d"), ("valid_train", "trial_e")):
        shutil.copytree(fixture, root / split / fixture.parent.name / trial)
    recipe = RECIPES["alfworld"]
    small = recipe.scaled({role: 2 for role in recipe.sft}, 2, eval_level_episodes=3, panel_every=1,
                   panel_episodes=1, rl_batch=2, rl_replay=1, eval_batch=3)
    task = tuple(f"--alfworld_data={root}" if flag.startswith("--alfworld_data") else
                 "--horizon=6" if flag.startswith("--horizon") else flag for flag in recipe.task)
    monkeypatch.setitem(RECIPES, recipe.name, dataclasses.replace(small, task=task,
                                                                  extra=dict(recipe.extra, data_episodes=3)))
    assert demo.main(["--task", "alfworld", f"--ckpt_path={tmp_path}", "--seed", "0", *ONE_PROCESS]) == 0
    results = json.loads((tmp_path / "demo" / "alfworld" / "results.json").read_text())["0"]["results"]
    assert [r["name"] for r in results] == [row.name for row in recipe.rows]
    family = "pick_and_place_simple-Tomato-None-Microwave"
    assert all(r["levels"][family]["episodes"] == 3 and r["levels"][family]["units"] == 3 for r in results)
    seed = tmp_path / "demo" / "alfworld" / "seed-0"
    assert {r["problem"] for r in json.loads((seed / "data" / "data_reflection.json").read_text())} == {
        f"train/{fixture.parent.name}/trial_a", f"train/{fixture.parent.name}/trial_b"}
    for role in small.sft:  # trained without dropout (its fast attention path), as the recipe says
        (run,) = checkpoints.run_dirs(seed / "runs" / f"sft-{role}", "supervised_pretrain")
        assert checkpoints.load_settings(run / "checkpoint-2")["disable_dropout"] is True
    for name in small.rl:
        (run,) = checkpoints.run_dirs(seed / "runs" / f"rl-{runner_seed.slug(name)}", "rl_finetune")
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert all(r["heldout_episodes"] == 2 for r in records if "heldout_success" in r)  # the 2 train trials
        episodes = [json.loads(x) for x in (run / "checkpoint-2" / "episodes.jsonl").read_text().splitlines()]
        assert all(e["seed"] < HELD_OUT_SEED < VALIDATION_SEED for e in episodes)


def test_the_pretrained_taxi_recipe_keeps_a_bfloat16_base_on_cuda(monkeypatch):
    """On CUDA the pretrained column loads the base in bfloat16, not the paper's 8 bits (the weights a CPU
    computes with); on a CPU it passes nothing bitsandbytes would read."""
    from recipes import pretrained, taxi_pickup

    for cuda in (True, False):
        monkeypatch.setattr(pretrained, "cuda_available", lambda cuda=cuda: cuda)
        model = taxi_pickup.on_pretrained("some/model.gguf").model
        assert ("--no_load_in_8bit" in model) is cuda and "--use_peft" in model


def test_the_pretrained_taxi_recipe_runs_its_rl_one_run_at_a_time_on_every_core():
    """SmolLM2's Reflect-RL is the critical path: a lone RL stream gives each run all the cores (stage_threads),
    where side by side its core would train for 50 minutes beside one idle after 11."""
    from recipes import taxi_pickup

    recipe = taxi_pickup.on_pretrained("some/model.gguf")
    assert len(recipe.rl_streams) == 1 and set(recipe.rl_streams[0]) == set(recipe.rl)
    assert stages.stage_threads(2, len(recipe.rl_streams), cores=2) == 2


@pytest.mark.slow
def test_the_pretrained_auto_explore_recipe_plays_end_to_end(tmp_path, monkeypatch):
    """The AutoExplore column's recipe for a pretrained model (``demo.py --task auto_explore --model_name ...``) at a
    tiny budget, on tiny-gpt2 under its LoRA adapter: its model flags (sdpa attention), its SFT flags (no dropout),
    its two SFT streams with the RL runs going on in them, its checkpoints every few steps, six rows on both depths;
    then the same command again keeps every stage."""
    from recipes import auto_explore
    from tests.test_demo import ONE_PROCESS

    recipe = auto_explore.on_pretrained("tiny-gpt2")
    assert "--attn_implementation=sdpa" in recipe.model and "--use_peft" in recipe.model
    assert "--disable_dropout" in recipe.sft_flags and recipe.save_every
    # the RL runs go on in the SFT streams: each stream's runs read only models trained before them or beside them
    assert recipe.overlap and {name for stream in recipe.rl_streams for name in stream} == set(recipe.rl)
    assert {role for stream in recipe.sft_streams for role in stream} == set(recipe.sft)
    # every evaluation answers a recurring prompt from the policy's memo (RL's flags do not: its weights move)
    assert all("--policy_memo" in evaluation.flags(Path("data")) for evaluation in recipe.evaluations.values())
    assert "--policy_memo" not in recipe.rl_flags(recipe, Path("data"))
    # RL holds no rollout graphs (4-15 GiB a run of long prompts in float32), in chunks of 8, saved every 2 iterations
    assert "--reuse_rollout_pass=false" in recipe.rl_flags(recipe, Path("data"))
    assert recipe.budget["rl_train_batch"] == 8 and recipe.rl_save_every == 2
    small = dataclasses.replace(
        recipe.scaled({role: 2 for role in recipe.sft}, 2, eval_level_episodes=2, panel_every=4, accuracy_episodes=1,
                      eval_batch=8),
        evaluations={"held-out": recipe.evaluations["held-out"]}, save_every=1)
    small = dataclasses.replace(small, model=(*small.model, "--max_seq_length=256"))
    monkeypatch.setattr(auto_explore, "on_pretrained", lambda model_name: small)
    command = ["--task", "auto_explore", "--model_name", "tiny-gpt2", f"--ckpt_path={tmp_path}", "--seed", "1",
               *ONE_PROCESS]
    assert demo.main(command) == 0
    seed = tmp_path / "demo" / small.name / "seed-1"
    run = json.loads((seed / demo.FINISHED).read_text())["run"]
    assert [r["name"] for r in run["results"]] == [row.name for row in recipe.rows]
    for result in run["results"]:
        assert {"depth 1", "depth 2"} <= set(result["levels"]), result["name"]
    # a checkpoint every step (save_every=1): the first one is kept beside the last, to resume from
    assert (next((seed / "runs" / "sft-policy").glob("*_supervised_pretrain")) / "checkpoint-1").is_dir()
    tokens = {marker.name: json.loads(marker.read_text())["token"] for marker in (seed / "logs").glob("*.done.json")}
    # the same command again reads every stage back (what a changed setting runs again: tests/test_stage_keys.py)
    (seed / demo.FINISHED).unlink()
    assert demo.main(command) == 0
    assert {marker.name: json.loads(marker.read_text())["token"]
            for marker in (seed / "logs").glob("*.done.json")} == tokens
    assert json.loads((seed / demo.FINISHED).read_text())["run"]["results"] == run["results"]


def test_some_rows_keep_the_stages_they_read_in_the_streams_they_had():
    from recipes.auto_explore import on_pretrained
    from recipes.base import REFLECT_RL, SFT_ONLY, WITHOUT_REFLECTION

    full = on_pretrained("SmolLM2.gguf")
    some = full.only([SFT_ONLY, WITHOUT_REFLECTION, REFLECT_RL])  # issue 73's priority rows
    assert [row.name for row in some.rows] == [SFT_ONLY, WITHOUT_REFLECTION, REFLECT_RL]
    assert set(some.sft) == {"reflector", "plain", "policy"} and set(some.rl) == {WITHOUT_REFLECTION, REFLECT_RL}
    # the reflector in one stream, the policies in the other; the RL runs go on where their SFT ends
    assert some.sft_streams == (("reflector",), ("plain", "policy"))
    assert some.rl_streams == ((REFLECT_RL,), (WITHOUT_REFLECTION,)) and some.overlap
    assert some.accuracy is None  # read by the SFT policy with reflection, a row not asked for
    assert {name: spec for name, spec in full.sft.items() if name in some.sft} == some.sft
    assert some.settings() != full.settings()  # a finished seed of some rows is not read back for every row
    assert some.name == full.name  # ... but its folder, and the stages it finished, are shared
    pickup = RECIPES["taxi_pickup"].only([SFT_ONLY])
    assert pickup.rl == {} and pickup.rl_streams == () and pickup.sft_streams == (("plain",),)
    dropoff = RECIPES["taxi_dropoff"]
    (figure,) = dropoff.only([REFLECT_RL]).figures  # the paper's Figure 4, of the runs kept
    assert figure.variants == (REFLECT_RL,) and figure.shift == ((REFLECT_RL, 40),) and len(dropoff.figures[0].variants) == 4
    for wrong in ([], ["SFT onyl"], [SFT_ONLY, SFT_ONLY]):
        with pytest.raises(ValueError, match="--rows: each a row of taxi_pickup"):
            RECIPES["taxi_pickup"].only(wrong)


def test_a_row_not_run_yet_is_said_so_in_the_papers_table():
    from recipes.base import REFLECT_RL, SFT_ONLY
    from recipes.paper_table import markdown

    some = RECIPES["taxi_pickup"].only([REFLECT_RL])  # demo.py --rows Reflect-RL
    table = markdown([(some, {0: _fake_run(some, 0.5)})]).splitlines()
    first = next(line for line in table if line.startswith(f"| {SFT_ONLY} |"))
    assert "| not run / 7% |" in first  # Taxi pickup's SFT only: the paper's 7%, ours not run
    assert "| 50.0% (50.0–50.0) / 58% |" in next(line for line in table if line.startswith(f"| {REFLECT_RL} |"))


def test_a_recipe_cut_to_some_rows_is_scaled_through_its_whole_recipe():
    """Recipe.only keeps the recipe it was cut from, whose stages' commands the runner uses (runner/seed.py): a smoke
    budget taken after the cut is the whole recipe's, cut again; a scale that would leave the whole one as it was
    is refused."""
    taxi = RECIPES[DEFAULT]
    cut = taxi.only(["Reflect-RL"])
    small = cut.smoke()
    assert small.whole.sft == taxi.smoke().sft and small.sft == taxi.smoke().only(["Reflect-RL"]).sft
    assert [row.name for row in small.rows] == ["Reflect-RL"] and small.budget == taxi.smoke().budget
    with pytest.raises(ValueError, match="scale the whole recipe"):
        cut.scaled({role: 2 for role in cut.sft}, 2)
