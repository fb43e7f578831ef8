"""The API backends against a local OpenAI-compatible server: answers, retries, errors, cache."""

import pytest

from llm import ChatClient, LLMError, make_client
from tests.openai_server import OpenAIServer

MESSAGES = [{"role": "user", "content": "Say hi."}]


def test_normal_answer_and_usage():
    with OpenAIServer(lambda body: (200, "hi there")) as server:
        client = ChatClient("local", "my-model", base_url=server.url)
        assert client.complete(MESSAGES) == "hi there"
        assert server.requests[0]["body"]["model"] == "my-model"
        assert server.requests[0]["body"]["messages"] == MESSAGES
    usage = client.usage
    assert (usage.requests, usage.prompt_tokens, usage.completion_tokens, usage.retries) == (1, 11, 7, 0)
    assert "1 requests" in usage.summary()


def test_rate_limit_then_success_is_retried():
    answers = iter([(429, "slow down"), (503, "busy"), (200, "ok")])
    with OpenAIServer(lambda body: next(answers)) as server:
        client = ChatClient("local", "m", base_url=server.url, max_retries=3)
        assert client.complete(MESSAGES) == "ok"
        assert len(server.requests) == 3
    assert client.usage.retries == 2


def test_persistent_rate_limit_gives_up_with_a_clear_error():
    with OpenAIServer(lambda body: (429, "slow down")) as server:
        client = ChatClient("local", "m", base_url=server.url, max_retries=2)
        with pytest.raises(LLMError, match="kept failing"):
            client.complete(MESSAGES)
        assert len(server.requests) == 3


def test_auth_error_is_immediate_and_clear(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
    with OpenAIServer(lambda body: (401, "invalid key")) as server:
        client = ChatClient("openai", "gpt-4", base_url=server.url, max_retries=5)
        with pytest.raises(LLMError, match=r"authentication failed.*OPENAI_API_KEY"):
            client.complete(MESSAGES)
        assert len(server.requests) == 1  # no retry storm
        assert server.requests[0]["headers"]["authorization"] == "Bearer sk-wrong"


def test_bad_request_is_immediate():
    with OpenAIServer(lambda body: (400, "context too long")) as server:
        client = ChatClient("local", "m", base_url=server.url, max_retries=5)
        with pytest.raises(LLMError, match="refused"):
            client.complete(MESSAGES)
        assert len(server.requests) == 1


def test_missing_keys_are_named(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("AZURE_OPENAI_KEY", raising=False)
    with pytest.raises(LLMError, match="OPENAI_API_KEY"):
        ChatClient("openai", "gpt-4")
    with pytest.raises(LLMError, match="AZURE_OPENAI_KEY"):
        ChatClient("azure", "gpt-4")


def test_azure_backend_uses_endpoint_and_deployment(monkeypatch):
    with OpenAIServer(lambda body: (200, "azure says hi")) as server:
        monkeypatch.setenv("AZURE_OPENAI_KEY", "azkey")
        monkeypatch.setenv("AZURE_BASE_URL", server.url.removesuffix("/v1"))
        client = ChatClient("azure", "my-deployment")
        assert client.complete(MESSAGES) == "azure says hi"
        request = server.requests[0]
        assert "/openai/deployments/my-deployment/chat/completions" in request["path"]
        assert request["headers"]["api-key"] == "azkey"


def test_disk_cache_answers_without_a_request(tmp_path):
    with OpenAIServer(lambda body: (200, "cached answer")) as server:
        first = ChatClient("local", "m", base_url=server.url, cache_dir=str(tmp_path))
        assert first.complete(MESSAGES) == "cached answer"
        second = ChatClient("local", "m", base_url=server.url, cache_dir=str(tmp_path))
        assert second.complete(MESSAGES) == "cached answer"
        assert second.complete([{"role": "user", "content": "other"}]) == "cached answer"
        assert len(server.requests) == 2 and second.usage.cached == 1


def test_make_client_from_flags(make_args):
    assert make_client(make_args(api="oracle")) is None
    client = make_client(make_args(api="local", base_url="http://127.0.0.1:9/v1", model="qwen"))
    assert client.endpoint == "http://127.0.0.1:9/v1" and client.model == "qwen"
