"""utils.io: the one atomic writer (every checkpoint setting, data file and LLM cache entry goes through it)."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from utils.errors import UsageError
from utils.io import read_json, write_json, write_jsonl, write_text_atomic


def test_a_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "deep" / "file.json"
    write_json(path, {"a": 1})
    write_json(path, {"b": [1, 2]})
    assert read_json(path) == {"b": [1, 2]}
    assert [p.name for p in path.parent.iterdir()] == ["file.json"]
    assert write_jsonl(tmp_path / "x.jsonl", [{"i": i} for i in range(3)]) == 3
    assert [json.loads(line) for line in (tmp_path / "x.jsonl").read_text().splitlines()] == [{"i": i} for i in range(3)]


def test_threads_writing_one_file_never_tear_it(tmp_path):
    path = tmp_path / "shared.txt"
    texts = [str(i) * 10_000 for i in range(10)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda text: write_text_atomic(path, text), texts * 3))
    assert path.read_text() in texts and [p.name for p in tmp_path.iterdir()] == ["shared.txt"]


def test_bad_json_names_the_flag_and_file(tmp_path):
    with pytest.raises(ValueError, match="--task_file: no such file"):
        read_json(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match=r"--data: .*bad.json is not valid JSON"):
        read_json(tmp_path / "bad.json", flag="--data")


def test_a_folder_or_a_binary_file_is_named_as_such(tmp_path):
    with pytest.raises(UsageError, match="is a folder; give a file"):
        read_json(tmp_path, flag="--data")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UsageError, match="--data: .*binary.json is not UTF-8 text"):
        read_json(tmp_path / "binary.json", flag="--data")
    with pytest.raises(UsageError, match="--data: /dev/null is not a regular file"):  # it exists: not "no such file"
        read_json("/dev/null", flag="--data")
