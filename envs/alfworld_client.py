"""The env's end of the ALFWorld game process (``envs/alfworld_worker.py`` is the other end).

:class:`_Worker` starts the worker (``spawn`` context), sends it a request and waits at
most a timeout for the answer; a game that raises, hangs (the worker is then killed) or
kills the worker is reported as a :class:`_GameFailure`. :func:`_release` is the env's
finalizer: it stops the worker and deletes the env's scratch folder.
"""

import logging
import multiprocessing
import os
import shutil
import threading
from multiprocessing.connection import wait
from pathlib import Path

from envs.alfworld_worker import serve

logger = logging.getLogger(__name__)

# Importing textworld and alfworld in a fresh worker takes 1-3 s of CPU; a game's timeout should
# not be spent on it.
STARTUP_TIMEOUT = 120.0
# Workers start at most one a core at a time in a process: an evaluation's batch of 16 environments
# started its 16 workers at once, and beside a second such process on 2 cores one of 32 waited past
# the timeout. The timeout then counts from a worker's own turn.
_STARTS = threading.BoundedSemaphore(max(1, os.cpu_count() or 1))


class _GameFailure(Exception):
    """A game raised, timed out or killed its worker; ``reason`` is one line for the block list."""

    def __init__(self, reason: str, details: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.details = details


class _Worker:
    """The parent's end of the game process: start, ask with a timeout, kill, shut down.

    Holds no reference to the env, so that the env's finalizer can shut it down.
    """

    def __init__(self, scratch: Path, memoise: bool = True, keep: bool = True, shallow: bool = True):
        self.scratch = scratch
        self.memoise = memoise  # the worker remembers the engine's pure answers (alfworld_worker.memoise_engine)
        self.keep = keep  # ... its translations on disk too (alfworld_worker.engine_store)
        self.shallow = shallow  # the grammar's contexts copied without deep copies (alfworld_worker.copy_contexts_shallowly)
        self.process = None
        self.conn = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self) -> None:
        with _STARTS:
            self.process, self.conn = self._spawn()
            try:
                answer = self._receive(STARTUP_TIMEOUT)
            except _GameFailure as failure:
                raise RuntimeError(
                    f"the ALFWorld worker did not start: {failure.reason}. It is a spawned process, which "
                    "imports the main script again: a script that builds ALFWorldEnv must run it under "
                    "`if __name__ == \"__main__\":`"
                ) from None
        if answer[0] != "ready":
            self.kill()
            raise RuntimeError(f"the ALFWorld worker did not start: {answer[1]}\n{answer[2]}")
        logger.debug("ALFWorld worker started (pid %s)", self.process.pid)

    def _spawn(self) -> tuple:
        """The worker process, started, and our end of its pipe."""
        # "spawn", not fork: the parent may hold torch threads and CUDA state.
        context = multiprocessing.get_context("spawn")
        conn, child_conn = context.Pipe()
        process = context.Process(target=serve, daemon=True, name="alfworld-worker",
                                  args=(child_conn, str(self.scratch), self.memoise, self.keep, self.shallow))
        process.start()
        # Closing our copy of the child's end is what lets a dead worker read as EOF here.
        child_conn.close()
        return process, conn

    def request(self, message: tuple, timeout: float) -> dict:
        """Send ``message`` and wait at most ``timeout`` seconds for the game's state."""
        if not self.alive():
            self.kill()
            self.start()
        try:
            self.conn.send(message)
        except OSError as error:
            self.kill()
            raise _GameFailure(f"worker died before the {message[0]} ({error})") from None
        try:
            answer = self._receive(timeout)
        except _GameFailure:
            raise
        except BaseException:
            # Interrupted while the game runs (e.g. Ctrl-C): its late answer would be read as
            # the answer to the next request, so this worker cannot be trusted any more.
            self.kill()
            raise
        if answer[0] == "error":
            raise _GameFailure(answer[1], answer[2])
        return answer[1]

    def _receive(self, timeout: float) -> tuple:
        ready = wait([self.conn, self.process.sentinel], timeout)
        if self.conn in ready:
            try:
                return self.conn.recv()
            except (EOFError, OSError):
                pass  # the worker died; its exit code tells more below
        if not ready:
            self.kill()
            raise _GameFailure(f"timeout: no answer within {timeout:g} s, worker killed")
        self.process.join(5)
        code = self.process.exitcode
        self.kill()
        raise _GameFailure(f"worker died (exit code {code})")

    def kill(self) -> None:
        if self.process is not None:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(5)
            self.process = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def shutdown(self) -> None:
        """Ask the worker to exit; kill it if it does not within a few seconds."""
        if self.alive():
            try:
                self.conn.send(("close",))
            except OSError:
                pass  # already gone: kill() below reaps it
            else:
                self.process.join(5)
        self.kill()


def _release(worker: _Worker, scratch: Path) -> None:
    """Stop the worker and delete the scratch folder (at close, garbage collection or exit)."""
    worker.shutdown()
    if scratch.exists():
        shutil.rmtree(scratch)
