"""Shared fixtures: offline, seeded, the tiny model, temporary run directories."""

import fcntl
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One thread per test process (pytest-xdist runs one per core); torch reads it when first imported.
# The learner goldens hold at 1 or 2 (OMP_NUM_THREADS=2 pytest tests/test_learner_golden.py).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Every Python process a test starts prints its threads' Python stacks if a signal kills it (SIGABRT, SIGSEGV):
# a gloo rank of the two-process RL tests once aborted after its last iteration, in one suite run, and was
# not caught again in ~75 runs; the failure message then shows where it was.
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

from experiment_args import ScriptArguments  # noqa: E402
from utils.paths import SHARED_DIR  # noqa: E402

# The hand-made ALFWorld game (a trial folder of the tomato->microwave family), small enough for tests to copy.
HANDMADE_GAME = SHARED_DIR / "alfworld" / "fixtures" / "pick_and_place_simple-Tomato-None-Microwave-1" / "trial_handmade"


def pytest_collection_modifyitems(config, items):
    """The slow end-to-end tests first: pytest-xdist hands tests out in this order, so the longest
    ones start at once on their own worker instead of finishing last."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def make_args(tmp_path):
    """ScriptArguments for the tiny model, writing runs under the test's temp dir."""

    def factory(**overrides) -> ScriptArguments:
        values = {"model_name": "tiny-gpt2", "ckpt_path": str(tmp_path / "results")}
        values.update(overrides)
        return ScriptArguments(**values)

    return factory


@pytest.fixture
def fresh_say_once(monkeypatch):
    """Every logger that says each message once (utils.log_filters.say_once) forgets what it has said, for this test."""
    from utils.log_filters import _SaidOnce

    for logger in list(logging.root.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger) and any(isinstance(f, _SaidOnce) for f in logger.filters):
            monkeypatch.setattr(logger, "filters", [f for f in logger.filters if not isinstance(f, _SaidOnce)])


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    from utils import tiny_gpt2

    return tiny_gpt2.tiny_gpt2_path()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_path):
    from utils import models

    return models.load_tokenizer("tiny-gpt2")


def built_once(tmp_path_factory, name: str, build) -> Path:
    """The folder ``name`` that ``build(folder)`` fills, built once per test session however pytest-xdist spreads
    the tests that need it over its workers: the first to ask builds it, under a lock, in the folder the workers'
    temporary folders share; the others wait for it and read it. A build that fails is tried again by the next
    test that asks. Tests read the folder and write elsewhere."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (folder / ".built").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


def copy_repository(destination: Path) -> Path:
    """The repository's tracked files copied to ``destination/repo``, with ``shared`` beside it
    (as ``../shared`` is beside the checkout): the copy's own default paths then lie in it."""
    work = destination / "repo"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    for name in tracked.splitlines():
        if (REPO / name).is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, work / name)
    (destination / "shared").symlink_to(SHARED_DIR)
    return work


def snapshot(folder: Path) -> dict:
    """Names, sizes and modification times of everything under ``folder``."""
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in folder.rglob("*")}


@pytest.fixture(scope="session")
def digit_model(tmp_path_factory) -> str:
    """A local model folder whose tokenizer splits numbers into digits, as SmolLM2, Qwen2.5 and
    Llama-3 do: the paper's labels 10..199 are two or three tokens, so it needs its own
    alphabet. A fast BPE trained on tiny-gpt2's corpus plus every two-letter word, without a
    pad token, and a small random GPT-2 with an untied head (fast enough for whole pipelines
    in the fast tests)."""
    import itertools
    import string

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from utils import tiny_gpt2

    eos = "<|endoftext|>"
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    bpe.decoder = decoders.ByteLevel()
    pairs = "\n".join(a + b for a, b in itertools.product(string.ascii_letters, repeat=2))
    trainer = trainers.BpeTrainer(vocab_size=6000, special_tokens=[eos], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([*tiny_gpt2._corpus().splitlines(keepends=True), *[pairs + "\n"] * 3], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=eos, bos_token=eos, unk_token=eos)
    folder = tmp_path_factory.mktemp("digit-model")
    tokenizer.save_pretrained(folder)
    config = GPT2Config(vocab_size=len(tokenizer), bos_token_id=tokenizer.eos_token_id,
                        eos_token_id=tokenizer.eos_token_id, n_positions=2048, n_embd=32, n_layer=2, n_head=2,
                        tie_word_embeddings=False)  # an untied head, unlike tiny-gpt2 and SmolLM2
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        GPT2LMHeadModel(config).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def real_llm_server(tmp_path_factory):
    """A real OpenAI-compatible server, ``transformers serve`` pinned to SmolLM2-135M-Instruct on the CPU
    (offline; ~6 s to start, once per session), for the slow tests. Send ``model=real_llm_server.model``
    to ``real_llm_server.url``; see tests/real_llm_server.py. Skipped without the serving extra or SmolLM2."""
    from tests.real_llm_server import TransformersServer, missing_requirement, serve_folder

    reason = missing_requirement()
    if reason is not None:
        pytest.skip(reason)
    with TransformersServer(serve_folder(), log_dir=tmp_path_factory.mktemp("transformers-serve")) as server:
        yield server


@pytest.fixture(scope="session")
def chain(tmp_path_factory):
    """The whole AutoExplore oracle pipeline run once on the fixture repositories (tests/auto_explore_repos.py)."""
    from types import SimpleNamespace

    from data_gen.auto_explore import filter_repo, filter_task, gen_sft, gen_task, reflection_negative, split_data
    from tests.auto_explore_repos import build_repos, make

    base = tmp_path_factory.mktemp("auto_explore")
    raw = build_repos(base / "repos")
    paths = SimpleNamespace(base=base, raw=raw, repos=base / "repos_filtered", tasks=base / "tasks",
                            filtered=base / "tasks_filtered")
    assert filter_repo.main(make(repo_dir=raw, output_dir=paths.repos)) == 0
    assert gen_task.main(make(repo_dir=paths.repos, output_dir=paths.tasks)) == 0
    assert filter_task.main(make(task_file=paths.tasks, repo_dir=paths.repos, output_dir=paths.filtered)) == 0
    assert reflection_negative.main(make(task_file=paths.filtered / "data.json", repo_dir=paths.repos)) == 0
    assert split_data.main(make(task_file=paths.filtered / "data_reflection_negative.json")) == 0
    assert gen_sft.main(make(task_file=paths.filtered / "train.json", repo_dir=paths.repos, shuffle_action=True)) == 0
    return paths


@pytest.fixture
def awkward_repo(tmp_path, monkeypatch) -> Path:
    """tests/auto_explore_repos.py's ``build_awkward_repo``, its ``UNREADABLE`` entries made unreadable: chmod 000,
    or for root, whom file modes do not stop, ``os.open``, ``os.scandir``, ``os.listdir`` and ``open`` refusing
    them as the system refuses another user."""
    import builtins
    import errno
    import io

    from tests.auto_explore_repos import UNREADABLE, build_awkward_repo

    repo = build_awkward_repo(tmp_path / "repos" / "awkward")
    denied = {str(repo / rel) for rel in UNREADABLE}
    if os.geteuid() != 0:
        for path in denied:
            os.chmod(path, 0)
        yield repo
        for path in denied:
            os.chmod(path, 0o755)
        return

    def refusing(real):
        def call(path, *args, **kwargs):
            if isinstance(path, str | bytes | os.PathLike) and os.path.abspath(os.fsdecode(path)) in denied:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(path))
            return real(path, *args, **kwargs)
        return call

    for owner, name in ((os, "open"), (os, "scandir"), (os, "listdir"), (builtins, "open"), (io, "open")):
        monkeypatch.setattr(owner, name, refusing(getattr(owner, name)))
    yield repo


def same_gradients(steps, other_steps) -> None:
    """Each optimiser step's gradients (lists of tensors, one list per step) equal to float32 rounding, compared
    to each tensor's largest entry: Adam's first step divides each entry by its own size, so the weights after
    it differ by much more where an entry is near zero, and weights are no fair comparison. The bound, 2e-4 of
    the largest entry: on an AMD EPYC (avx512, no AMX) a batch of 16 against minibatches of 4 moved a few GRPO
    entries by 3.8e-5 of it (PPO 1.4e-5); a gradient at other weights, or none, moves them by the order of the
    entry itself."""
    import torch

    assert len(steps) == len(other_steps) > 0
    for grads, other in zip(steps, other_steps, strict=True):
        for a, b in zip(grads, other, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-4 * float(b.abs().max()))


def record_reads_and_gradients(policy, learner) -> tuple[list[int], list[list]]:
    """Two lists filled from now on: the rows of each forward pass of ``policy`` (the prompts it reads), and the
    gradients of ``learner``'s parameters at each optimiser step (before it)."""
    reads, grads = [], []
    policy.register_forward_hook(lambda _, args, kwargs, out: reads.append(len(kwargs["input_ids"])), with_kwargs=True)
    learner.optimizer.register_step_pre_hook(lambda *_: grads.append([p.grad.clone() for p in learner.params]))
    return reads, grads
