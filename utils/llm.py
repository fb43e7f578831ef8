"""The one client through which data generation and GPT evaluation reach an LLM.

``--api openai`` (key in ``OPENAI_API_KEY``; ``--base_url`` for an OpenAI-compatible proxy),
``--api azure`` (``AZURE_OPENAI_KEY`` and ``AZURE_BASE_URL``), ``--api local`` (any
OpenAI-compatible server at ``--base_url``, key in ``LOCAL_API_KEY`` if it wants one).
``--api oracle`` has no client at all: the pipelines then write their texts from what
the environment knows (see each pipeline's oracle functions), offline and deterministic.

Requests may come from many threads: at most ``--max_concurrency`` are in flight at once.
Transient failures (rate limits, honouring ``Retry-After``; timeouts; 5xx) are retried with
exponential backoff by the official ``openai`` client, and so, by this one, is a reply that
is not the chat completion the API promises (not JSON, ``choices`` empty, ``content`` a
number; ``utils/llm_reply.py`` reads each reply): once retries are used up it is an
:class:`LLMError` quoting what came back. Hard failures (a bad key, an unknown model, a
refused request, nothing listening at the address) raise :class:`LLMError` at once, naming
the endpoint, the model and the server's reason; after one, every other request of the
client stops too. An empty answer, or one a caller's ``accept`` check rejects, is never
cached: the caller may ask again. Answers can be cached on disk (``--llm_cache DIR``);
answers at temperature 0 are also remembered in memory, so a prompt asked twice is sent
once. :attr:`ChatClient.usage` counts requests, answers, retries and tokens.
"""

import functools
import hashlib
import importlib
import itertools
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from utils.io import write_text_atomic
from utils.llm_reply import Malformed, error_reason, excerpt, read_completion, retry_after

logger = logging.getLogger(__name__)

KEY_ENV = {"openai": "OPENAI_API_KEY", "azure": "AZURE_OPENAI_KEY", "local": "LOCAL_API_KEY"}
AZURE_URL_ENV = "AZURE_BASE_URL"
AZURE_VERSION_ENV = "AZURE_API_VERSION"
AZURE_DEFAULT_VERSION = "2024-06-01"
LOCAL_DEFAULT_URL = "http://localhost:1234/v1"
RETRIED_STATUS = {408, 409, 429}
MALFORMED_BACKOFF = (0.5, 8.0)  # seconds before the first retry of a malformed reply, doubled up to the second
KEY_HINT = {
    "openai": f"check ${KEY_ENV['openai']}",
    "azure": f"check ${KEY_ENV['azure']} and ${AZURE_URL_ENV}",
    "local": f"if the server wants a key, set ${KEY_ENV['local']}",
}
# The HTTP library of the installed openai client: httpx up to openai 2.x, httpx2 from 3.x. Its
# limits and errors must be that library's own, and only it is sure to be installed.
http = importlib.import_module(next(c.__module__ for c in openai.DefaultHttpxClient.__mro__
                                    if c.__module__.startswith("httpx")).split(".")[0])
# It logs every request at INFO, which would break the progress bars.
logging.getLogger(http.__name__).setLevel(logging.WARNING)


class LLMError(RuntimeError):
    """An LLM request that must not be retried (bad key, unknown model, refused request) or that kept failing."""


def stops_on_llm_error(step: str, unit: str):
    """Decorate a step's ``main``: an API failure (:class:`LLMError`: a bad key, a refused
    request, retries used up) ends the step with one line naming it and exit code 1.
    Finished ``unit`` are already in the step's journal, so a re-run resumes."""

    def decorate(main: Callable[[Any], int]) -> Callable[[Any], int]:
        @functools.wraps(main)
        def guarded(args) -> int:
            try:
                return main(args)
            except LLMError as error:
                print(f"[{step}] stopped: {error} (finished {unit} are kept; re-run to resume)", file=sys.stderr)
                return 1

        return guarded

    return decorate


@dataclass
class Usage:
    """What a client has done so far; updated under the client's lock, read by progress bars."""

    requests: int = 0  # sent (the first try of each)
    in_flight: int = 0
    answered: int = 0  # usable answers received
    cached: int = 0  # answers from the disk cache or the memory of temperature-0 answers
    retries: int = 0  # retried responses (429, 408, 409, 5xx, replies that are not chat completions)
    empty: int = 0  # answers with no text
    rejected: int = 0  # answers the caller's check refused (e.g. a reflection naming its spoiler)
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def summary(self) -> str:
        unusable = f", {self.empty} empty, {self.rejected} rejected by checks" if self.empty or self.rejected else ""
        return (f"LLM usage: {self.requests} requests ({self.cached} answers from cache, {self.retries} retried"
                f"{unusable}), {self.prompt_tokens} prompt + {self.completion_tokens} completion tokens")

    def progress(self) -> dict[str, Any]:
        """The progress bar's postfix: requests in flight, done, retried, and tokens."""
        return {"in flight": self.in_flight, "done": self.answered + self.empty + self.rejected,
                "retried": self.retries, "tokens": self.prompt_tokens + self.completion_tokens}


class ChatClient:
    def __init__(self, api: str, model: str, base_url: str | None = None, cache_dir: str | None = None,
                 max_retries: int = 5, timeout: float = 60.0, max_concurrency: int = 8,
                 max_tokens_cap: int | None = None):
        if api not in KEY_ENV:
            raise ValueError(f"--api must be one of {sorted(KEY_ENV)} for a chat client, got {api!r}")
        if max_concurrency < 1:
            raise ValueError(f"--max_concurrency must be at least 1, got {max_concurrency}")
        self.api, self.model, self.max_concurrency, self.max_retries = api, model, max_concurrency, max_retries
        self.max_tokens_cap = max_tokens_cap  # --llm_max_tokens: a ceiling on every answer's length
        self.usage = Usage()
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._pool: ThreadPoolExecutor | None = None
        self._memory: dict[str, str] = {}  # temperature-0 answers of this run
        self._reached = False  # a response has come back from the endpoint at least once
        self._failure: LLMError | None = None  # the hard error that stopped this client
        http_client = openai.DefaultHttpxClient(
            event_hooks={"response": [self._count_retry]},
            limits=http.Limits(max_connections=max_concurrency + 4, max_keepalive_connections=max_concurrency + 4))
        common = {"max_retries": max_retries, "timeout": timeout, "http_client": http_client}
        if api == "openai":
            key = _require_env(KEY_ENV["openai"], api)
            # Without --base_url the openai client reads $OPENAI_BASE_URL, else OpenAI's own address.
            self._client = openai.OpenAI(api_key=key, base_url=base_url if base_url else None, **common)
            self.endpoint = str(self._client.base_url).rstrip("/")
        elif api == "azure":
            key = _require_env(KEY_ENV["azure"], api)
            self.endpoint = base_url or _require_env(AZURE_URL_ENV, api)
            self._client = openai.AzureOpenAI(
                api_key=key, azure_endpoint=self.endpoint,
                api_version=os.environ.get(AZURE_VERSION_ENV, AZURE_DEFAULT_VERSION), **common)
        else:
            self.endpoint = base_url or LOCAL_DEFAULT_URL
            self._client = openai.OpenAI(api_key=os.environ.get(KEY_ENV["local"], "no key needed"),
                                         base_url=self.endpoint, **common)
        self.where = f"--api={self.api} at {self.endpoint} (model {self.model!r})"

    def _count_retry(self, response) -> None:
        if response.status_code in RETRIED_STATUS or response.status_code >= 500:
            with self._lock:
                self.usage.retries += 1

    def complete(self, messages: list[dict], *, temperature: float = 0.0, max_tokens: int = 512,
                 accept: Callable[[str], str | None] | None = None, attempts: int = 1) -> str | None:
        """The model's answer to a chat, or None when ``attempts`` answers were all empty or refused
        by ``accept`` (which returns None for a good answer, else the reason). Usable answers are
        cached; at temperature 0 a repeated prompt is answered from memory. Thread-safe."""
        if self.max_tokens_cap is not None:
            max_tokens = min(max_tokens, self.max_tokens_cap)
        key = hashlib.sha256(json.dumps([self.api, self.model, messages, temperature, max_tokens],
                                        sort_keys=True).encode()).hexdigest()
        cached = self._recall(key, temperature)
        if cached is not None and (accept is None or accept(cached) is None):
            with self._lock:
                self.usage.cached += 1
            return cached
        for attempt in range(attempts):
            text = self._request(messages, temperature, max_tokens)
            problem = "empty" if not text.strip() else accept(text) if accept is not None else None
            with self._lock:
                if problem is None:
                    self.usage.answered += 1
                elif problem == "empty":
                    self.usage.empty += 1
                else:
                    self.usage.rejected += 1
            if problem is None:
                self._remember(key, temperature, text)
                return text
            logger.debug("%s answer %d of %d unusable (%s): %.80r", self.model, attempt + 1, attempts, problem, text)
        return None

    def complete_many(self, chats: list[list[dict]], *, accepts: list | None = None, **options) -> list[str | None]:
        """:meth:`complete` for every chat (``accepts``: one check per chat), sent concurrently (at most
        ``max_concurrency`` in flight); answers in the order of ``chats``. A hard error is raised once
        every request has stopped."""
        accepts = accepts if accepts is not None else [None] * len(chats)
        if len(chats) <= 1:
            return [self.complete(chat, accept=accept, **options) for chat, accept in zip(chats, accepts)]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="llm")
        futures = [self._pool.submit(self.complete, chat, accept=accept, **options)
                   for chat, accept in zip(chats, accepts)]
        wait(futures)
        return [future.result() for future in futures]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    # --- one request ------------------------------------------------------------------

    def _request(self, messages: list[dict], temperature: float, max_tokens: int) -> str:
        request = {"model": self.model, "messages": messages, "temperature": temperature, "max_tokens": max_tokens}
        with self._slots:
            with self._lock:
                if self._failure is not None:
                    raise self._failure
                self.usage.requests += 1
                self.usage.in_flight += 1
            try:
                text, prompt_tokens, completion_tokens = self._answer(request)
            except LLMError as error:
                with self._lock:
                    self._failure = self._failure or error
                raise
            finally:
                with self._lock:
                    self.usage.in_flight -= 1
        with self._lock:
            self.usage.prompt_tokens += prompt_tokens
            self.usage.completion_tokens += completion_tokens
        return text

    def _answer(self, request: dict) -> tuple[str, int, int]:
        """The answer's text and its prompt and completion tokens. The openai client takes any HTTP 200 for an
        answer: a reply that is not a chat completion is retried here as it retries a 5xx."""
        for retry in itertools.count():
            reply = self._send(request)
            with self._lock:
                self._reached = True
            try:
                return read_completion(reply)
            except Malformed as error:
                problem = str(error)
            if retry >= self.max_retries:
                tries = f"{retry + 1} tries" if retry else "1 try"
                raise LLMError(f"{self.where} answered with something that is not a chat completion ({problem}; "
                               f"{tries}): {excerpt(reply.text)!r}")
            with self._lock:
                self.usage.retries += 1
            first, most = MALFORMED_BACKOFF  # a Retry-After of the reply wins, as with a 5xx
            time.sleep(retry_after(reply.headers, default=min(most, first * 2 ** retry)))

    def _send(self, request: dict):
        """One successful response, unparsed; the openai client retries transient failures. Until the endpoint
        has answered once, a refused connection is not retried: nothing listens at that address."""
        client = self._client
        try:
            if not self._reached and self.max_retries > 0:
                try:
                    return client.with_options(max_retries=0).chat.completions.with_raw_response.create(**request)
                except openai.APIConnectionError as error:
                    if _refused(error):
                        raise LLMError(f"nothing answers at {self.where}: {_root_cause(error)}; is the server "
                                       "running, and is --base_url right?") from None
                except (openai.RateLimitError, openai.InternalServerError) as error:
                    time.sleep(retry_after(error.response.headers))  # transient: the retrying call below takes over
                client = client.with_options(max_retries=self.max_retries - 1)
            return client.chat.completions.with_raw_response.create(**request)
        except (openai.AuthenticationError, openai.PermissionDeniedError) as error:
            raise LLMError(f"authentication failed for {self.where}: {error_reason(error)}; "
                           f"{KEY_HINT[self.api]}") from None
        except openai.NotFoundError as error:
            raise LLMError(f"{self.where}: not found ({error_reason(error)}); check --model (the model or deployment "
                           "name the server knows) and --base_url") from None
        except (openai.BadRequestError, openai.UnprocessableEntityError, openai.ConflictError) as error:
            raise LLMError(f"the request was refused by {self.where}: {error_reason(error)}") from None
        except (openai.RateLimitError, openai.InternalServerError) as error:
            raise LLMError(f"{self.where} kept failing after retries: {error_reason(error)}") from None
        except openai.APIConnectionError as error:  # includes timeouts
            raise LLMError(f"{self.where} kept failing after retries: {type(error).__name__}: "
                           f"{_root_cause(error)}") from None
        except openai.APIStatusError as error:
            raise LLMError(f"{self.where} answered with an error: {error_reason(error)}") from None

    # --- remembered answers -----------------------------------------------------------

    def _recall(self, key: str, temperature: float) -> str | None:
        if temperature == 0:
            with self._lock:
                if key in self._memory:
                    return self._memory[key]
        if self.cache_dir is None:
            return None
        path = self.cache_dir / f"{key}.json"
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))["text"]
        except (json.JSONDecodeError, KeyError, OSError):
            return None  # a damaged cache file is simply asked again

    def _remember(self, key: str, temperature: float, text: str) -> None:
        if temperature == 0:
            with self._lock:
                self._memory[key] = text
        if self.cache_dir is None:
            return
        write_text_atomic(self.cache_dir / f"{key}.json", json.dumps({"model": self.model, "text": text}))


def _causes(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions behind it, outermost first."""
    chain = [error]
    while (cause := chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(cause)
    return chain


def _root_cause(error: BaseException) -> str:
    root = _causes(error)[-1]
    return f"{type(root).__name__}: {root}" if str(root) else type(root).__name__


def _refused(error: openai.APIConnectionError) -> bool:
    """True when the connection itself was refused (or the host is unknown), not merely slow."""
    return any(isinstance(cause, ConnectionRefusedError | http.ConnectError) for cause in _causes(error))


def _require_env(name: str, api: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise LLMError(f"--api={api} needs the environment variable {name}")
    return value


def make_client(args) -> ChatClient | None:
    """The chat client the flags ask for, or None for ``--api oracle``."""
    if args.api == "oracle":
        return None
    return ChatClient(args.api, args.model, base_url=args.base_url, cache_dir=args.llm_cache,
                      max_retries=args.llm_max_retries, timeout=args.llm_timeout, max_concurrency=args.max_concurrency,
                      max_tokens_cap=args.llm_max_tokens)


def concurrency(client: ChatClient | None) -> dict[str, Any]:
    """How a step's items share the client (``Journal.run``'s ``workers`` and ``status``): ``--max_concurrency``
    items at once with the client's requests on the progress bar, or one at a time with the oracle."""
    if client is None:
        return {"workers": 1, "status": None}
    return {"workers": client.max_concurrency, "status": client.usage.progress}


def model_name(args) -> str:
    """What records say produced them: ``oracle`` or the API model's name."""
    return "oracle" if args.api == "oracle" else args.model
