"""The runner's stages keyed by what they compute from (runner/stages.py): a changed setting runs again only the steps
it reaches (through the tokens of the steps each one reads), and a stage cut short continues from its newest whole
checkpoint (``--resume_from``). Most tests play the Taxi pickup seed at its smoke budget around stand-ins for the
scripts (:class:`FakeScripts`: each writes the files the runner reads, at once); the last one resumes the real SFT
and RL scripts."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import yaml

import demo
from recipes.taxi_pickup import RECIPE as TAXI
from runner import markers, stages
from runner import seed as runner_seed
from utils import checkpoints, complete

REFLECT_RL, WITHOUT_REFLECTION, RLFT_ONLY = "Reflect-RL", "SFT+RLFT w/o reflection", "RLFT only"
STEPS = ["data", "sft-reflector", "sft-policy", "sft-plain", "rl-reflect-rl", "rl-sft-rlft-w-o-reflection",
         "rl-rlft-only", *(f"evaluation-{row}" for row in (  # a stage a row, those that reflect first
             "sft-only-with-reflection", "reflect-rl", "sft-only", "rlft-only", "sft-rlft-w-o-reflection")),
         "accuracy"]  # what a seed runs, named as FakeScripts.ran names them


def _flag(argv: list[str], name: str) -> str | None:
    """The last value of ``--name=`` in ``argv``."""
    found = [word.split("=", 1)[1] for word in argv if word.startswith(f"--{name}=")]
    return found[-1] if found else None


class FakeScripts:
    """Stand-ins for the scripts a seed runs, put in place of ``stages.call``: each notes its run in ``ran`` (by the
    folder it writes; the data steps as "data") and ``argv`` (by that name), and writes what the runner reads of
    it. A training script saves ``checkpoint-N`` every ``--save_steps`` and at ``--max_steps``, each marked whole,
    and continues a ``--resume_from`` checkpoint in a new run folder, carrying its metrics, as the real ones do.
    ``fail``: by folder name, the step after whose checkpoint the script fails (once), its later ones unwritten
    but for a torn one."""

    def __init__(self):
        self.ran: list[str] = []
        self.argv: dict[str, list[str]] = {}
        self.fail: dict[str, int] = {}

    def __call__(self, main, argv: list[str]) -> None:
        module = main.__module__
        if module.startswith("data_gen."):
            out = Path(_flag(argv, "output_dir") or Path(_flag(argv, "task_file")).parent)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{module}.txt").write_text(" ".join(argv))
            if module.endswith(".gen_sft"):  # the SFT texts: the reflector's from the episodes, the policies' also
                episodes = (out / "data_gen.taxi.reflection.txt").read_text()  # from gen_sft's own flags
                for role, spec in TAXI.sft.items():
                    (out / spec.file).write_text(episodes + ("" if role == "reflector" else " ".join(argv)))
            if self.ran[-1:] != ["data"]:
                self.ran.append("data")
            return
        folder = Path(_flag(argv, "ckpt_path"))
        self.ran.append(folder.name)
        self.argv[folder.name] = argv
        previous = checkpoints.run_dirs(folder)
        number = int(previous[-1].name.split("_")[0]) + 1 if previous else 1
        script = {"supervised_pretrain": "supervised_pretrain", "rl_finetune": "rl_finetune",
                  "evaluation.evaluate": "evaluate"}[module]
        run = folder / f"{number}_{script}"
        run.mkdir(parents=True)
        if script == "evaluate":
            rows = yaml.safe_load(Path(_flag(argv, "eval_load_list")).read_text())
            levels = {"pickup": {"success": 0.25, "cost": 0.5, "episodes": 4, "units": 4}}
            (run / "results.json").write_text(json.dumps([{"name": row["name"], "levels": levels} for row in rows]))
            (run / "seconds.json").write_text(json.dumps({row["name"]: {"reflector": 0.0} for row in rows}))
            return
        resume = _flag(argv, "resume_from")
        start = int(resume.rsplit("-", 1)[1]) if resume else 0
        records = [line for line in (Path(resume).parent / "metrics.jsonl").read_text().splitlines()
                   if json.loads(line)["step"] <= start] if resume else []
        last, every = int(_flag(argv, "max_steps")), int(_flag(argv, "save_steps"))
        for step in range(start + 1, last + 1):
            records.append(json.dumps({"step": step, "episodes_played": 4}))
            (run / "metrics.jsonl").write_text("".join(line + "\n" for line in records))
            if step % every == 0 or step == last:
                checkpoint = run / f"checkpoint-{step}"
                checkpoint.mkdir()
                (checkpoint / "model.safetensors").write_text(f"{folder.name} {step}")
                complete.mark(checkpoint)
                if self.fail.get(folder.name) == step:
                    del self.fail[folder.name]
                    (run / f"checkpoint-{step + 1}").mkdir()  # torn: no marker
                    (run / f"checkpoint-{step + 1}" / checkpoints.SETTINGS_FILE).write_text("x")
                    raise RuntimeError(f"{folder.name} killed after checkpoint-{step}")


@pytest.fixture
def fake(monkeypatch):
    """The stand-in scripts, and a stand-in for the plots (the runner's own code otherwise)."""
    scripts = FakeScripts()
    monkeypatch.setattr(stages, "call", scripts)
    monkeypatch.setattr(runner_seed.plot, "plot", lambda *args, **kwargs: "rl_curves.png")
    monkeypatch.setattr(runner_seed.plot, "plot_panel", lambda *args, **kwargs: None)
    threads = torch.get_num_threads()
    yield scripts
    torch.set_num_threads(threads)


def _recipe(scripts: FakeScripts, **changes):
    """Taxi pickup at its smoke budget, its reflector's accuracy a stand-in that notes each measure in ``ran``."""
    def accuracy(recipe, eval_args, config, split="held-out"):
        scripts.ran.append("accuracy")
        return {"steps": [[0, 0.5, 2]], "all": [0.5, 2], "episodes": [0.0, 2]}

    return dataclasses.replace(TAXI.smoke(), accuracy=accuracy, **changes)


def _variant(recipe, name: str, **changes):
    return dataclasses.replace(recipe, rl={**recipe.rl, name: dataclasses.replace(recipe.rl[name], **changes)})


def _role(recipe, role: str, **changes):
    return dataclasses.replace(recipe, sft={**recipe.sft, role: dataclasses.replace(recipe.sft[role], **changes)})


def _tokens(folder: Path) -> dict[str, str]:
    return {path.name[:-len(markers.DONE)]: json.loads(path.read_text())["token"]
            for path in (folder / "logs").glob(f"*{markers.DONE}")}


def _run(scripts: FakeScripts, recipe, folder: Path, cores: int | None = None) -> list[str]:
    """Run the seed (in this process); the steps that ran."""
    scripts.ran.clear()
    demo.finished_or_run(recipe, 0, folder, 1, cores)
    return scripts.ran


def test_a_changed_rl_flag_runs_that_run_and_its_rows_evaluation_again(tmp_path, fake):
    recipe, folder = _recipe(fake), tmp_path / "seed-0"
    assert _run(fake, recipe, folder) == STEPS
    before = _tokens(folder)
    assert _run(fake, recipe, folder) == []  # read back from finished.json
    (folder / demo.FINISHED).unlink()
    assert _run(fake, recipe, folder) == []  # every step kept by its key
    assert _tokens(folder) == before

    flagged = _variant(recipe, WITHOUT_REFLECTION, flags=("--entropy_coef=0.01",))
    assert _run(fake, flagged, folder) == ["rl-sft-rlft-w-o-reflection", "evaluation-sft-rlft-w-o-reflection"]
    after = _tokens(folder)
    assert {name for name in after if after[name] != before[name]} == {"rl-sft-rlft-w-o-reflection",
                                                                        "evaluation-sft-rlft-w-o-reflection"}
    assert "--entropy_coef=0.01" in fake.argv["rl-sft-rlft-w-o-reflection"]
    # its folder held one key's run only: emptied before it ran afresh, so its run is numbered 1 again
    assert [run.name for run in checkpoints.run_dirs(folder / "runs" / "rl-sft-rlft-w-o-reflection")] == [
        "1_rl_finetune"]

    longer = _variant(flagged, RLFT_ONLY, iterations=3)
    assert _run(fake, longer, folder) == ["rl-rlft-only", "evaluation-rlft-only"]
    assert (folder / "runs" / "rl-rlft-only" / "1_rl_finetune" / "checkpoint-3").is_dir()
    # the row's list, written when its evaluation started: the run's checkpoint, found then
    (row,) = yaml.safe_load((folder / "logs" / "evaluation-rlft-only.rows.yaml").read_text())
    assert row["name"] == RLFT_ONLY and row["load_dir"].endswith("1_rl_finetune/checkpoint-3")


def test_some_rows_report_the_others_whose_stages_stand_under_the_keys_they_would_run_with(tmp_path, fake):
    """demo.py --rows (``Recipe.only``): the recipe's other rows are reported where their evaluation, and each stage
    it reads in turn, finished under the key it would run with now; one that a changed setting reaches is not, and
    nothing of theirs runs."""
    recipe, folder = _recipe(fake), tmp_path / "seed-0"
    assert _run(fake, recipe, folder) == STEPS
    every = json.loads((folder / demo.FINISHED).read_text())["run"]

    def shown(cut) -> list[str]:
        assert _run(fake, cut.only([REFLECT_RL]), folder) == []  # Reflect-RL's stages kept, no other row's run
        run = json.loads((folder / demo.FINISHED).read_text())["run"]
        assert all(result in every["results"] for result in run["results"])
        return [result["name"] for result in run["results"]]

    assert shown(recipe) == [row.name for row in recipe.rows]
    assert json.loads((folder / demo.FINISHED).read_text())["run"]["reflector_accuracy"] == every["reflector_accuracy"]
    flagged = _variant(recipe, WITHOUT_REFLECTION, flags=("--entropy_coef=0.01",))  # its RL run's key changes
    assert shown(flagged) == [row.name for row in recipe.rows if row.name != WITHOUT_REFLECTION]
    # the plain policy's SFT: read by "SFT only" and by the RL run of w/o reflection
    assert shown(_role(recipe, "plain", steps=3)) == [row.name for row in recipe.rows
                                                      if row.name not in ("SFT only", WITHOUT_REFLECTION)]
    assert shown(recipe) == [row.name for row in recipe.rows]  # nothing was run or lost meanwhile


@pytest.mark.parametrize("overlap", [False, True])
def test_a_changed_sft_budget_runs_that_sft_and_what_reads_it_again(tmp_path, fake, overlap):
    recipe, folder = _recipe(fake, overlap=overlap), tmp_path / "seed-0"
    assert sorted(_run(fake, recipe, folder)) == sorted(STEPS)
    # the plain policy: read by SFT+RLFT w/o reflection and by the "SFT only" row
    assert sorted(_run(fake, _role(recipe, "plain", steps=3), folder)) == [
        "evaluation-sft-only", "evaluation-sft-rlft-w-o-reflection", "rl-sft-rlft-w-o-reflection", "sft-plain"]
    # the reflector: read by Reflect-RL, by the rows that reflect, and by the reflector's accuracy
    before = _tokens(folder)
    assert sorted(_run(fake, _role(_role(recipe, "plain", steps=3), "reflector", steps=5), folder)) == [
        "accuracy", "evaluation-reflect-rl", "evaluation-sft-only-with-reflection", "rl-reflect-rl", "sft-reflector"]
    after = _tokens(folder)
    assert {name for name in after if after[name] != before[name]} == {
        "sft-reflector", "rl-reflect-rl", "evaluation-reflect-rl", "evaluation-sft-only-with-reflection"}
    accuracy = json.loads((folder / "logs" / runner_seed.ACCURACY).read_text())
    assert accuracy["key"]["reads"]["SFT of the reflector (sft_reflection.jsonl)"] == after["sft-reflector"]


def test_changed_data_settings_run_every_step_again_from_an_emptied_data_folder(tmp_path, fake):
    recipe, folder = _recipe(fake), tmp_path / "seed-0"
    _run(fake, recipe, folder)
    (folder / "data" / "journal of other settings.jsonl").write_text("{}\n")
    more = dataclasses.replace(recipe, extra=dict(recipe.extra, data_episodes=21))
    assert _run(fake, more, folder) == STEPS
    assert not (folder / "data" / "journal of other settings.jsonl").exists()
    assert "--num_episodes=21" in (folder / "data" / "data_gen.taxi.reflection.txt").read_text()


def test_data_that_writes_a_roles_texts_alike_keeps_its_sft(tmp_path, fake):
    """SFT stages are keyed by the bytes of their texts, not the data step's token: a data step run again for a flag
    that changes only the policies' texts retrains the policies and what reads them, not the reflector."""
    recipe, folder = _recipe(fake), tmp_path / "seed-0"
    _run(fake, recipe, folder)
    before = _tokens(folder)

    def flagged(recipe, seed, out):
        return [(main, [*argv, "--seed=7"] if main.__module__.endswith(".gen_sft") else argv)
                for main, argv in TAXI.data(recipe, seed, out)]

    assert _run(fake, dataclasses.replace(recipe, data=flagged), folder) == [step for step in STEPS
                                                                             if step != "sft-reflector"]
    assert _tokens(folder)["sft-reflector"] == before["sft-reflector"]


def test_the_numerical_path_is_part_of_every_key(tmp_path, fake):
    recipe, folder = _recipe(fake), tmp_path / "seed-0"
    _run(fake, recipe, folder)
    assert _run(fake, recipe, folder, cores=1) == STEPS  # the reference path: nothing of the native one is reused
    done = json.loads((folder / "logs" / f"sft-policy{markers.DONE}").read_text())
    assert done["key"]["numerics"] == {"reference": stages.cpu.PINNED, "cores": 1}
    (folder / demo.FINISHED).unlink()
    assert _run(fake, recipe, folder, cores=1) == []
    assert _run(fake, recipe, folder) == STEPS  # and back


def test_a_stage_cut_short_resumes_from_its_newest_whole_checkpoint(tmp_path, fake, capsys):
    recipe, folder = _recipe(fake, save_every=1), tmp_path / "seed-0"
    reflector = folder / "runs" / "sft-reflector"
    fake.fail["sft-reflector"] = 2  # of 4 steps: checkpoint-2 whole, checkpoint-3 torn
    with pytest.raises(RuntimeError, match="sft-reflector killed after checkpoint-2"):
        _run(fake, recipe, folder)
    assert fake.argv["sft-reflector"][-1] != "--resume_from"
    assert _flag(fake.argv["sft-reflector"], "save_steps") == "1"  # Recipe.save_every
    started = json.loads((folder / "logs" / f"sft-reflector{markers.STARTED}").read_text())
    assert not (folder / "logs" / f"sft-reflector{markers.DONE}").exists()

    assert _run(fake, recipe, folder) == STEPS[1:]  # the data kept; the reflector's SFT continues
    resumed = fake.argv["sft-reflector"]
    assert resumed[-1] == f"--resume_from={reflector / '1_supervised_pretrain' / 'checkpoint-2'}"
    assert (f"SFT of the reflector (sft_reflection.jsonl): cut short before; resumes from "
            f"{reflector / '1_supervised_pretrain' / 'checkpoint-2'}, its newest whole checkpoint") in capsys.readouterr().out
    done = json.loads((folder / "logs" / f"sft-reflector{markers.DONE}").read_text())
    assert done["key"] == started["key"] and "--resume_from" not in " ".join(done["key"]["command"])
    assert done["resumed_from"] == str(reflector / "1_supervised_pretrain" / "checkpoint-2")
    # the run that read it reads the resumed run's final checkpoint, found when it started
    assert _flag(fake.argv["rl-reflect-rl"], "reflect_load_dir") == str(
        reflector / "2_supervised_pretrain" / "checkpoint-4")

    # an RL run killed after its last checkpoint (before its marker): nothing left to run, its run read as it is
    (folder / demo.FINISHED).unlink()
    rl = folder / "runs" / "rl-rlft-only"
    for name in ("rl-rlft-only", "evaluation-rlft-only"):  # as if that run had not finished
        (folder / "logs" / f"{name}{markers.DONE}").unlink()
    assert _run(fake, recipe, folder) == ["evaluation-rlft-only"]
    assert "RLFT: RLFT only: its final checkpoint" in capsys.readouterr().out
    assert [run.name for run in checkpoints.run_dirs(rl)] == ["1_rl_finetune"]

    # an RL run killed part-way resumes, its metrics carried into the new run
    shortened = _variant(recipe, RLFT_ONLY, iterations=3)
    fake.fail["rl-rlft-only"] = 1
    with pytest.raises(RuntimeError, match="rl-rlft-only killed after checkpoint-1"):
        _run(fake, shortened, folder)
    assert _run(fake, shortened, folder) == ["rl-rlft-only", "evaluation-rlft-only"]
    assert _flag(fake.argv["rl-rlft-only"], "resume_from") == str(rl / "1_rl_finetune" / "checkpoint-1")
    assert [json.loads(line)["step"] for line in (rl / "2_rl_finetune" / "metrics.jsonl").read_text().splitlines()] \
        == [1, 2, 3]
    assert json.loads((folder / demo.FINISHED).read_text())["run"]["rl_episodes"][RLFT_ONLY] == 12


def test_a_stage_whose_key_changed_starts_afresh_in_an_emptied_folder(tmp_path, fake):
    recipe, folder = _recipe(fake, save_every=1), tmp_path / "seed-0"
    reflector = folder / "runs" / "sft-reflector"
    fake.fail["sft-reflector"] = 2
    with pytest.raises(RuntimeError, match="killed"):
        _run(fake, recipe, folder)
    (reflector / "left over by hand").mkdir()
    assert _run(fake, _role(recipe, "reflector", learning_rate=1e-3), folder) == STEPS[1:]
    assert _flag(fake.argv["sft-reflector"], "resume_from") is None  # another key: nothing of the old run resumed
    assert sorted(path.name for path in reflector.iterdir()) == ["1_supervised_pretrain"]
    assert sorted(path.name for path in (reflector / "1_supervised_pretrain").iterdir()) == [
        "checkpoint-1", "checkpoint-2", "checkpoint-3", "checkpoint-4", "metrics.jsonl"]


def test_without_save_every_the_commands_save_at_their_last_step_only(tmp_path, fake):
    """Recipe.save_every None keeps the runner's commands as they were (the committed goldens' runs)."""
    _run(fake, _recipe(fake), tmp_path / "seed-0")
    assert _flag(fake.argv["sft-reflector"], "save_steps") == "4" and _flag(fake.argv["rl-reflect-rl"], "save_steps") == "2"
    assert "save_every" not in TAXI.settings() and _recipe(fake, save_every=50).settings()["save_every"] == 50
    with pytest.raises(ValueError, match="save_every must be at least 1, got 0"):
        _recipe(fake, save_every=0)


# --- the real scripts ---------------------------------------------------------------------------------------------

TINY = ["--model_name=tiny-gpt2", "--seed=0"]


def _fail_once_after(monkeypatch, owner, method: str, step_of, step: int) -> None:
    """Make ``owner.method`` (a checkpoint save) raise once, right after it saved step ``step``: a kill after a
    whole checkpoint."""
    real, failed = getattr(owner, method), []

    def saving(self, *args, **kwargs):
        real(self, *args, **kwargs)
        if step_of(self, *args, **kwargs) == step and not failed:
            failed.append(step)
            raise RuntimeError(f"{owner.__name__} killed after checkpoint-{step}")

    monkeypatch.setattr(owner, method, saving)


def test_the_real_sft_and_rl_stages_resume_from_their_newest_whole_checkpoint(tmp_path, monkeypatch):
    """supervised_pretrain and rl_finetune, 3 steps saving every 2 (so the last, 3, is saved though no multiple of 2),
    each failing once right after its checkpoint-2: the next run of the same stages continues each from it, in a
    run folder of its own that latest_run finds (the RL run reads the resumed SFT policy), RL's metrics carried."""
    import rl_finetune
    from prompts import policy_sft_text
    from tests.test_sft import HEAD, OBS
    from utils import metrics, sft_callbacks

    texts = tmp_path / "sft.jsonl"
    texts.write_text("".join(json.dumps({"text": policy_sft_text(OBS.replace("T P", f"T{i % 3}P"), HEAD, str(i % 3))})
                             + "\n" for i in range(8)))
    runs, logs = tmp_path / "runs", tmp_path / "logs"
    sft = stages.Stage("sft", "supervised_pretrain", [
        *TINY, f"--ckpt_path={runs / 'sft'}", f"--task_file={texts}", "--max_steps=3", "--save_steps=2",
        "--per_device_train_batch_size=4"], logs / "sft.log", output=runs / "sft")
    rl = stages.Stage("rl", "rl_finetune", [
        *TINY, stages.LatestRun("--load_dir=", runs / "sft", "supervised_pretrain", "checkpoint-3"), "--env=taxi",
        "--taxi_curriculum", "--curriculum_index=0", "--oracle_completion", "--per_device_eval_batch_size=4",
        "--per_device_train_batch_size=8", "--max_steps=3", "--save_steps=2", f"--ckpt_path={runs / 'rl'}"],
        logs / "rl.log", needs=("sft",), output=runs / "rl")
    _fail_once_after(monkeypatch, sft_callbacks.RunFiles, "on_save", lambda self, args, state, *rest, **kw:
                     state.global_step, 2)
    _fail_once_after(monkeypatch, rl_finetune.Recorder, "checkpoint", lambda self, progress, *rest: progress.iteration, 2)

    for failing in ("RunFiles", "Recorder"):  # SFT fails; then SFT resumes and RL fails; then RL resumes
        with pytest.raises(RuntimeError, match=f"{failing} killed after checkpoint-2"):
            stages.run_side_by_side([[sft, rl]], 1)
    stages.run_side_by_side([[sft, rl]], 1)
    for stage, script in ((sft, "supervised_pretrain"), (rl, "rl_finetune")):
        first, second = checkpoints.run_dirs(stage.output, script)
        assert sorted(path.name for path in second.glob("checkpoint-*")) == ["checkpoint-3"]
        assert complete.is_whole(second / "checkpoint-3") and complete.is_whole(first / "checkpoint-2")
        done = json.loads(stage.marker.read_text())
        assert done["resumed_from"] == str(first / "checkpoint-2")
        assert checkpoints.load_settings(second / "checkpoint-3")["resume_from"] == str(first / "checkpoint-2")
    assert "trained 3 steps" in sft.log.read_text()
    sft_run = checkpoints.run_dirs(runs / "sft", "supervised_pretrain")[-1]
    rl_run = checkpoints.run_dirs(runs / "rl", "rl_finetune")[-1]
    assert checkpoints.load_settings(rl_run / "checkpoint-3")["load_dir"] == str(sft_run / "checkpoint-3")
    assert [record["step"] for record in metrics.read_metrics(rl_run)] == [1, 2, 3]


def test_rl_save_every_sets_the_rl_runs_interval_and_save_every_the_sft_steps(tmp_path, fake):
    """Recipe.rl_save_every: RL's iterations take minutes where SFT's steps take seconds, so each has its interval."""
    _run(fake, _recipe(fake, save_every=3, rl_save_every=1), tmp_path / "seed-0")
    assert _flag(fake.argv["sft-reflector"], "save_steps") == "3" and _flag(fake.argv["rl-reflect-rl"], "save_steps") == "1"
    assert _recipe(fake, rl_save_every=1).settings()["rl_save_every"] == 1 and "rl_save_every" not in TAXI.settings()
    with pytest.raises(ValueError, match="rl_save_every must be at least 1, got 0"):
        _recipe(fake, rl_save_every=0)
