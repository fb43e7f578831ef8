"""LLM concurrency: the Taxi reflection step against an endpoint with a fixed latency, at several
``--max_concurrency``, side by side in one run.

    python -m benchmarks.llm_concurrency [--episodes 96] [--latency 0.5] [--concurrency 1 4 16 64]

The endpoint is a local OpenAI-compatible server (tests/openai_server.py, the standard library's
threading HTTP server) that answers every request after ``--latency`` seconds with a reflection
that depends only on the prompt, so every run must write the same bytes. Each row runs
``data_gen.taxi.reflection --api=local`` on ``--episodes`` Taxi pickup episodes, in this process,
into a fresh folder. "request time" runs from the first request's arrival to the last answer
(the step's start-up, its environment play and its file writing are not in it); the speed-up
is the first row's request time over this row's. "most in flight" is what the server saw.
"""

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

from data_gen.taxi import reflection
from experiment_args import parse_args
from tests.openai_server import OpenAIServer


def fixed_reflection(body) -> tuple[int, str]:
    digest = hashlib.sha256(body["messages"][1]["content"].encode()).hexdigest()[:12]
    return 200, f"Reflection {digest}: the taxi should read the walls on the map before it moves."


def run_step(folder: Path, episodes: int, latency: float, concurrency: int) -> dict:
    with OpenAIServer(fixed_reflection, delay=latency) as server:
        args = parse_args(["--api=local", f"--base_url={server.url}", "--model=fixed-latency",
                           f"--num_episodes={episodes}", f"--max_concurrency={concurrency}", "--taxi_curriculum",
                           "--curriculum_index=0", f"--output_dir={folder}"], env="taxi")
        tic = time.perf_counter()
        status = reflection.main(args)
        wall = time.perf_counter() - tic
        if status != 0:
            raise RuntimeError(f"the reflection step failed at --max_concurrency={concurrency}")
        requests = len(server.requests)
        request_time = server.last_answer_at - server.first_request_at
        return {"concurrency": concurrency, "requests": requests, "wall_s": wall, "request_s": request_time,
                "requests_per_s": requests / request_time, "most_in_flight": server.max_in_flight,
                "records": (folder / "data_reflection.json").read_bytes()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llm_concurrency", description=__doc__.split("\n")[0],
                                     allow_abbrev=False)
    parser.add_argument("--episodes", type=int, default=96, help="Taxi pickup episodes per run.")
    parser.add_argument("--latency", type=float, default=0.5, help="Seconds the endpoint takes per request.")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64],
                        help="The --max_concurrency of each run; the first is the reference.")
    options = parser.parse_args(argv)
    if options.episodes < 1:  # checked here, in this command's flags, not as the reflection step's
        parser.error(f"--episodes: at least 1, got {options.episodes}")
    if min(options.concurrency) < 1:
        parser.error(f"--concurrency: each at least 1, got {options.concurrency}")
    if options.latency < 0:
        parser.error(f"--latency: at least 0, got {options.latency}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="llm_concurrency-") as scratch:
        for n in options.concurrency:
            rows.append(run_step(Path(scratch) / f"n{n}", options.episodes, options.latency, n))
    reference = rows[0]
    print(f"\nTaxi reflection step, {options.episodes} pickup episodes, {reference['requests']} requests, "
          f"{options.latency} s per request\n")
    print("| --max_concurrency | wall s | request time s | requests/s | speed-up | most in flight | same records |")
    print("|---:|---:|---:|---:|---:|---:|:---:|")
    for row in rows:
        same = "yes" if row["records"] == reference["records"] else "NO"
        print(f"| {row['concurrency']} | {row['wall_s']:.1f} | {row['request_s']:.1f} | {row['requests_per_s']:.1f} "
              f"| {reference['request_s'] / row['request_s']:.1f}x | {row['most_in_flight']} | {same} |")
    identical = all(row["records"] == reference["records"] for row in rows)
    if not identical:
        print("\nthe records differ between concurrency levels", file=sys.stderr)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
