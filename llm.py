"""The one client through which data generation and GPT evaluation reach an LLM.

``--api openai`` (key in ``OPENAI_API_KEY``), ``--api azure`` (``AZURE_OPENAI_KEY`` and
``AZURE_BASE_URL``), ``--api local`` (any OpenAI-compatible server at ``--base_url``).
``--api oracle`` has no client at all: the pipelines then write their texts from what
the environment knows (see each pipeline's oracle functions), offline and deterministic.

Transient failures (rate limits, timeouts, connection errors, 5xx) are retried with
exponential backoff by the official ``openai`` client; authentication and bad-request
errors stop at once with :class:`LLMError`. Answers can be cached on disk
(``--llm_cache DIR``), and :attr:`ChatClient.usage` counts requests and tokens.
"""

import functools
import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

logger = logging.getLogger(__name__)

KEY_ENV = {"openai": "OPENAI_API_KEY", "azure": "AZURE_OPENAI_KEY", "local": "LOCAL_API_KEY"}
AZURE_URL_ENV = "AZURE_BASE_URL"
AZURE_VERSION_ENV = "AZURE_API_VERSION"
AZURE_DEFAULT_VERSION = "2024-06-01"
RETRIED_STATUS = {408, 409, 429}


class LLMError(RuntimeError):
    """An LLM request that must not be retried (bad key, bad request) or that kept failing."""


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
    requests: int = 0
    cached: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def summary(self) -> str:
        return (f"LLM usage: {self.requests} requests ({self.cached} from cache, {self.retries} retried), "
                f"{self.prompt_tokens} prompt + {self.completion_tokens} completion tokens")


class ChatClient:
    def __init__(self, api: str, model: str, base_url: str | None = None, cache_dir: str | None = None,
                 max_retries: int = 5, timeout: float = 60.0):
        if api not in KEY_ENV:
            raise ValueError(f"--api must be one of {sorted(KEY_ENV)} for a chat client, got {api!r}")
        self.api, self.model = api, model
        self.usage = Usage()
        self.cache_dir = Path(cache_dir) if cache_dir else None
        http_client = openai.DefaultHttpxClient(event_hooks={"response": [self._count_retry]})
        common = {"max_retries": max_retries, "timeout": timeout, "http_client": http_client}
        if api == "openai":
            key = _require_env(KEY_ENV["openai"], api)
            self._client = openai.OpenAI(api_key=key, base_url=base_url if base_url else None, **common)
            self.endpoint = base_url or "https://api.openai.com/v1"
        elif api == "azure":
            key = _require_env(KEY_ENV["azure"], api)
            self.endpoint = _require_env(AZURE_URL_ENV, api)
            self._client = openai.AzureOpenAI(
                api_key=key, azure_endpoint=self.endpoint,
                api_version=os.environ.get(AZURE_VERSION_ENV, AZURE_DEFAULT_VERSION), **common)
        else:
            self.endpoint = base_url or "http://localhost:1234/v1"
            self._client = openai.OpenAI(api_key=os.environ.get(KEY_ENV["local"], "no key needed"),
                                         base_url=self.endpoint, **common)

    def _count_retry(self, response) -> None:
        if response.status_code in RETRIED_STATUS or response.status_code >= 500:
            self.usage.retries += 1

    def complete(self, messages: list[dict], *, temperature: float = 0.0, max_tokens: int = 512) -> str:
        """The model's answer to a chat; cached answers are returned without a request."""
        key = hashlib.sha256(json.dumps([self.api, self.model, messages, temperature, max_tokens],
                                        sort_keys=True).encode()).hexdigest()
        cached = self._cache_get(key)
        if cached is not None:
            self.usage.cached += 1
            return cached
        self.usage.requests += 1
        where = f"--api={self.api} at {self.endpoint} (model {self.model!r})"
        try:
            response = self._client.chat.completions.create(
                model=self.model, messages=messages, temperature=temperature, max_tokens=max_tokens)
        except (openai.AuthenticationError, openai.PermissionDeniedError) as error:
            hint = f"; set ${KEY_ENV[self.api]}" if self.api != "local" else ""
            raise LLMError(f"authentication failed for {where}{hint}: {error}") from None
        except (openai.BadRequestError, openai.NotFoundError, openai.UnprocessableEntityError) as error:
            raise LLMError(f"the request was refused by {where}: {error}") from None
        except (openai.RateLimitError, openai.APITimeoutError, openai.APIConnectionError,
                openai.InternalServerError) as error:
            raise LLMError(f"{where} kept failing after retries: {error}") from None
        if response.usage is not None:
            self.usage.prompt_tokens += response.usage.prompt_tokens or 0
            self.usage.completion_tokens += response.usage.completion_tokens or 0
        text = (response.choices[0].message.content or "") if response.choices else ""
        self._cache_put(key, text)
        return text

    def _cache_get(self, key: str) -> str | None:
        if self.cache_dir is None:
            return None
        path = self.cache_dir / f"{key}.json"
        return json.loads(path.read_text(encoding="utf-8"))["text"] if path.is_file() else None

    def _cache_put(self, key: str, text: str) -> None:
        if self.cache_dir is None:
            return
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.cache_dir / f".{key}.tmp{os.getpid()}"
        tmp.write_text(json.dumps({"model": self.model, "text": text}), encoding="utf-8")
        os.replace(tmp, self.cache_dir / f"{key}.json")


def _require_env(name: str, api: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise LLMError(f"--api={api} needs the environment variable {name}")
    return value


def make_client(args) -> ChatClient | None:
    """The chat client the flags ask for, or None for ``--api oracle``."""
    if args.api == "oracle":
        return None
    return ChatClient(args.api, args.model, base_url=args.base_url if args.api != "openai" else None,
                      cache_dir=args.llm_cache, max_retries=args.llm_max_retries, timeout=args.llm_timeout)


def model_name(args) -> str:
    """What records say produced them: ``oracle`` or the API model's name."""
    return "oracle" if args.api == "oracle" else args.model
