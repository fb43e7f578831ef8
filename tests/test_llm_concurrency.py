"""LLM steps at scale: the journal under concurrent workers, records independent of --max_concurrency,
reflections checked for their spoiler, and a run killed with SIGKILL that resumes to the same files."""

import hashlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from data_gen.common import Journal, Unfinished, reflect_with_api, reflection_problem
from data_gen.taxi import reflection as taxi_reflection
from tests.openai_server import OpenAIServer, json_body
from utils.llm import ChatClient

REPO = Path(__file__).resolve().parents[1]


# --- the journal ---------------------------------------------------------------------------------


def _slow_square(x: int) -> int:
    time.sleep(random.Random(x).uniform(0, 0.02))  # finish out of order
    return x * x


@pytest.mark.parametrize("workers", [1, 4, 16])
def test_journal_is_written_in_item_order_at_any_concurrency(tmp_path, workers):
    items = [(f"item-{i}", i) for i in range(40)]
    journal = Journal(tmp_path, "squares")
    assert journal.run(items, _slow_square, "squares", workers=workers) == [i * i for i in range(40)]
    reference = tmp_path / "reference"
    Journal(reference, "squares").run(items, _slow_square, "squares")
    assert journal.path.read_bytes() == (reference / ".progress" / "squares.jsonl").read_bytes()


def test_a_failure_keeps_the_finished_prefix_and_stops(tmp_path):
    started = []

    def work(x):
        started.append(x)
        if x == 5:
            raise RuntimeError("boom")
        time.sleep(0.01)
        return x

    journal = Journal(tmp_path, "failing")
    with pytest.raises(RuntimeError, match="boom"):
        journal.run([(str(i), i) for i in range(100)], work, "failing", workers=4)
    done = [json.loads(line)["key"] for line in journal.path.read_text().splitlines()]
    assert done == [str(i) for i in range(len(done))] and len(done) <= 5  # a prefix: nothing after the failure
    assert len(started) < 30  # items not yet started were dropped


def test_a_failure_in_prepare_lets_the_items_handed_out_finish(tmp_path):
    """An item prepared and handed to the pool finishes even if no thread had picked it up yet when
    preparing a later one failed (before, whether it was kept depended on thread timing)."""
    release = threading.Event()

    def work(x):
        if x < 2:
            release.wait(5)  # both workers busy: item 2 waits in the queue
        return x

    def prepare(x):
        if x == 3:
            release.set()
            raise RuntimeError("the environment broke")
        return x

    journal = Journal(tmp_path, "prepared")
    with pytest.raises(RuntimeError, match="broke"):
        journal.run([(str(i), i) for i in range(5)], work, "prepared", workers=2, prepare=prepare)
    assert set(Journal(tmp_path, "prepared").done) == {"0", "1", "2"}


def test_unfinished_results_are_used_but_not_journalled(tmp_path):
    journal = Journal(tmp_path, "partial")
    work = lambda x: Unfinished(-x, "no answer") if x % 2 else x  # noqa: E731
    assert journal.run([(str(i), i) for i in range(4)], work, "partial", workers=2) == [0, -1, 2, -3]
    assert journal.unfinished == {"1": "no answer", "3": "no answer"}
    again = Journal(tmp_path, "partial")
    assert set(again.done) == {"0", "2"}  # a re-run works on 1 and 3 again


def test_a_torn_last_line_is_dropped_so_the_next_line_starts_clean(tmp_path):
    journal = Journal(tmp_path, "torn")
    journal.run([("a", 1), ("b", 2)], lambda x: x, "torn")
    with open(journal.path, "a") as handle:
        handle.write('{"key": "c", "res')  # a crash in the middle of a write
    again = Journal(tmp_path, "torn")
    assert set(again.done) == {"a", "b"}
    again.run([("a", 1), ("b", 2), ("c", 3)], lambda x: x, "torn")
    assert [json.loads(line)["key"] for line in again.path.read_text().splitlines()] == ["a", "b", "c"]


# --- reflections must not give their spoiler away -----------------------------------------------


@pytest.mark.parametrize(("text", "problem"), [
    ("The taxi should move south to reach the passenger.", "names the spoiler"),
    ('The best action is "Move south".', "names the spoiler"),
    ("I was told where to go, so I will go down.", "mentions the spoiler"),
    ("The spoiler says to go down.", "mentions the spoiler"),
    ("The passenger waits below the taxi, two rows down.", None),
    ("Moving southwards is blocked by a wall.", None),
])
def test_reflection_problem(text, problem):
    assert reflection_problem(text, "Move south") == problem


def test_alfworld_commands_are_spoilers_too():
    assert reflection_problem("I should go to countertop 1 now.", "go to countertop 1") == "names the spoiler"
    assert reflection_problem("The tomato may be on countertop 1.", "go to countertop 1") is None


def test_leaking_or_empty_reflections_are_asked_again_then_left_out():
    def responder(body):
        prompt = body["messages"][1]["content"]
        return 200, "" if "first" in prompt else ("Move south." if "second" in prompt else "Look below.")

    with OpenAIServer(responder) as server:
        client = ChatClient("local", "m", base_url=server.url)
        asks = [("first", "Move south"), ("second", "Move south"), ("third", "Move south")]
        records = [{"state": user} for user, _ in asks]
        result = reflect_with_api(client, "system", records, asks, records)
        assert [record["reflection"] for record in records] == [None, None, "Look below."]
        assert isinstance(result, Unfinished) and result.result is records
        assert len(server.requests) == 3 + 3 + 1


# --- data steps: the same records at every concurrency ------------------------------------------


def fake_reflection(body) -> tuple[int, str]:
    """A deterministic writer: a reflection that depends only on the prompt (never on timing)."""
    digest = hashlib.sha256(body["messages"][1]["content"].encode()).hexdigest()[:8]
    return 200, f"Reflection {digest}: read the map and think about the walls."


def test_taxi_reflection_records_do_not_depend_on_concurrency(make_args, tmp_path):
    outputs = []
    for n in (1, 4, 16):
        with OpenAIServer(fake_reflection, delay=0.01) as server:
            args = make_args(env="taxi", api="local", base_url=server.url, model="m", num_episodes=8,
                             max_concurrency=n, output_dir=str(tmp_path / f"n{n}"), taxi_curriculum=True,
                             curriculum_index=0)
            assert taxi_reflection.main(args) == 0
            if n > 1:
                assert server.max_in_flight > 1
        (journal,) = (tmp_path / f"n{n}" / ".progress").glob("*.jsonl")
        outputs.append(((tmp_path / f"n{n}" / "data_reflection.json").read_bytes(), journal.read_bytes()))
    assert outputs[0] == outputs[1] == outputs[2]


def test_a_server_that_stops_answering_chat_completions_stops_the_step_in_one_line(make_args, tmp_path, capsys):
    """Odd replies (here a JSON list) are retried, then end the step with exit 1 in one line; the episodes
    finished before are kept, and a re-run asks only for the others."""
    settings = {"env": "taxi", "api": "local", "model": "m", "max_concurrency": 1, "llm_max_retries": 2}
    asked = {}
    for episodes in (1, 3):
        with OpenAIServer(fake_reflection) as server:
            args = make_args(**settings, base_url=server.url, num_episodes=episodes,
                             output_dir=str(tmp_path / f"n{episodes}"))
            assert taxi_reflection.main(args) == 0
            asked[episodes] = len(server.requests)
    first_episode = asked[1]
    capsys.readouterr()
    answered = itertools.count()
    odd = json_body([{"not": "a chat completion"}])
    part = tmp_path / "part"
    with OpenAIServer(lambda body: fake_reflection(body) if next(answered) < first_episode else (200, odd)) as server:
        args = make_args(**settings, base_url=server.url, num_episodes=3, output_dir=str(part))
        assert taxi_reflection.main(args) == 1
        assert len(server.requests) == first_episode + 3  # one state of episode 1, asked three times
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "stopped" in line]
    assert line == (f"[taxi.reflection] stopped: --api=local at {server.url} (model 'm') answered with something "
                    "that is not a chat completion (the body is a list, not a JSON object; 3 tries): "
                    "'[{\"not\": \"a chat completion\"}]' (finished episodes are kept; re-run to resume)")
    assert "Traceback" not in err and not (part / "data_reflection.json").exists()
    assert set(Journal(part, taxi_reflection.journal_name(args)).done) == {"episode-0"}
    with OpenAIServer(fake_reflection) as server:
        assert taxi_reflection.main(make_args(**settings, base_url=server.url, num_episodes=3,
                                              output_dir=str(part))) == 0
        asked_again = len(server.requests)
    whole_file = (tmp_path / "n3" / "data_reflection.json").read_bytes()
    assert (part / "data_reflection.json").read_bytes() == whole_file
    assert asked_again == asked[3] - first_episode  # episode 0 was not asked again


def test_oracle_steps_stay_sequential(make_args, tmp_path, monkeypatch):
    threads = set()
    real = taxi_reflection.episode

    def spy(args, client, index):
        threads.add(threading.get_ident())
        return real(args, client, index)

    monkeypatch.setattr(taxi_reflection, "episode", spy)
    args = make_args(env="taxi", api="oracle", num_episodes=6, max_concurrency=16, output_dir=str(tmp_path))
    assert taxi_reflection.main(args) == 0
    assert len(threads) == 1


# --- kill -9 in the middle of a concurrent run ---------------------------------------------------


def _command(url: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "data_gen.taxi.reflection", "--api=local", f"--base_url={url}", "--model=m",
            "--num_episodes=24", "--max_concurrency=8", f"--output_dir={out}", "--seed=3"]


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_files(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with OpenAIServer(fake_reflection, delay=0.05) as server:
        whole = tmp_path / "whole"
        subprocess.run(_command(server.url, whole), cwd=REPO, env=env, check=True, capture_output=True)
        part = tmp_path / "part"
        process = subprocess.Popen(_command(server.url, part), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        progress = part / ".progress"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # kill it once some episodes are journalled, not all
            journals = list(progress.glob("*.jsonl")) if progress.is_dir() else []
            if journals and len(journals[0].read_text().splitlines()) >= 4:
                break
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait()
        (journal,) = progress.glob("*.jsonl")
        killed_at = len(journal.read_text().splitlines())
        assert 4 <= killed_at < 24 and not (part / "data_reflection.json").exists()
        before = len(server.requests)
        subprocess.run(_command(server.url, part), cwd=REPO, env=env, check=True, capture_output=True)
        resent = len(server.requests) - before
    assert (part / "data_reflection.json").read_bytes() == (whole / "data_reflection.json").read_bytes()
    assert journal.read_bytes() == next((whole / ".progress").glob("*.jsonl")).read_bytes()
    states = len(json.loads((whole / "data_reflection.json").read_text()))
    assert resent < states  # the journalled episodes were not asked again
