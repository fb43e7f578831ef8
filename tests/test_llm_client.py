"""The API backends against a local OpenAI-compatible server: answers, retries, errors, cache."""

import itertools
import json
import logging
import socket
import threading
import time

import pytest

from tests.openai_server import OpenAIServer, Raw, chat_completion, json_body
from utils import llm
from utils.llm import ChatClient, LLMError, make_client

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


# --- answers that must not be kept, and prompts that need not be sent twice ------------------


def test_an_empty_answer_is_neither_cached_nor_final(tmp_path):
    answers = iter([(200, ""), (200, "   "), (200, "a real answer")])
    with OpenAIServer(lambda body: next(answers)) as server:
        client = ChatClient("local", "m", base_url=server.url, cache_dir=str(tmp_path))
        assert client.complete(MESSAGES, temperature=0.7) is None  # one attempt: empty
        assert client.complete(MESSAGES, temperature=0.7, attempts=2) == "a real answer"  # asked again, not cached
        assert len(server.requests) == 3
    assert client.usage.empty == 2 and client.usage.answered == 1
    assert [json.loads(p.read_text())["text"] for p in tmp_path.glob("*.json")] == ["a real answer"]


def test_a_rejected_answer_is_asked_again_and_never_cached(tmp_path):
    answers = iter(["Move south now.", "Head for the passenger.", "unused"])
    with OpenAIServer(lambda body: (200, next(answers))) as server:
        client = ChatClient("local", "m", base_url=server.url, cache_dir=str(tmp_path))
        check = lambda text: "names the spoiler" if "south" in text.lower() else None  # noqa: E731
        assert client.complete(MESSAGES, temperature=0.7, accept=check, attempts=3) == "Head for the passenger."
        assert len(server.requests) == 2 and client.usage.rejected == 1
        again = ChatClient("local", "m", base_url=server.url, cache_dir=str(tmp_path))
        assert again.complete(MESSAGES, temperature=0.7, accept=check) == "Head for the passenger."
        assert len(server.requests) == 2


def test_a_prompt_at_temperature_zero_is_sent_once():
    with OpenAIServer(lambda body: (200, "3")) as server:
        client = ChatClient("local", "m", base_url=server.url)
        assert [client.complete(MESSAGES) for _ in range(5)] == ["3"] * 5
        assert client.complete(MESSAGES, temperature=0.7) == "3"
        assert len(server.requests) == 2 and client.usage.cached == 4


# --- errors say where, which model, and the server's reason ----------------------------------


def test_unknown_model_names_the_model_and_the_server_reason():
    detail = {"detail": "Server is pinned to 'smol'; requested 'gpt-4o'."}
    with OpenAIServer(lambda body: (404, detail["detail"])) as server:
        client = ChatClient("local", "gpt-4o", base_url=server.url)
        with pytest.raises(LLMError) as error:
            client.complete(MESSAGES)
    message = str(error.value)
    assert server.url in message and "'gpt-4o'" in message and "pinned to 'smol'" in message
    assert "HTTP 404" in message and "--model" in message


def test_401_on_a_local_server_hints_at_the_key_variable():
    with OpenAIServer(lambda body: (401, "missing bearer token")) as server:
        client = ChatClient("local", "m", base_url=server.url)
        with pytest.raises(LLMError, match=r"authentication failed.*missing bearer token.*LOCAL_API_KEY"):
            client.complete(MESSAGES)


def test_a_hard_error_stops_every_other_request():
    with OpenAIServer(lambda body: (401, "revoked")) as server:
        client = ChatClient("local", "m", base_url=server.url, max_concurrency=2)
        with pytest.raises(LLMError):
            client.complete_many([[{"role": "user", "content": str(i)}] for i in range(20)])
        assert len(server.requests) <= 2  # the ones already on their way, no more
        with pytest.raises(LLMError, match="revoked"):
            client.complete([{"role": "user", "content": "later"}])
        assert len(server.requests) <= 2


def test_nothing_listening_stops_within_seconds():
    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = ChatClient("local", "m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=5)
    start = time.monotonic()
    with pytest.raises(LLMError, match=rf"nothing answers at --api=local at http://127.0.0.1:{port}/v1 \(model 'm'\)"):
        client.complete(MESSAGES)
    assert time.monotonic() - start < 5  # not five rounds of backoff


def test_retry_after_is_honoured():
    answers = iter([(429, "slow down", {"retry-after": "1", "retry-after-ms": "1000"}), (200, "ok")])
    with OpenAIServer(lambda body: next(answers)) as server:
        client = ChatClient("local", "m", base_url=server.url)
        start = time.monotonic()
        assert client.complete(MESSAGES) == "ok"
        assert time.monotonic() - start >= 0.9
    assert client.usage.retries == 1


def test_base_url_is_used_with_api_openai(make_args, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with OpenAIServer(lambda body: (200, "proxied")) as server:
        client = make_client(make_args(api="openai", base_url=server.url, model="gpt-4o"))
        assert client.endpoint == server.url and client.complete(MESSAGES) == "proxied"
        assert server.requests[0]["headers"]["authorization"] == "Bearer sk-test"


# --- replies that are not chat completions ------------------------------------------------------


def completion_with(change) -> Raw:
    """A good chat completion's body, changed in place by ``change``."""
    body = chat_completion("never read", "m", 1)
    change(body)
    return json_body(body)


ODD_REPLIES = [  # (the reply, what the error says is wrong with it)
    pytest.param(Raw("<html>Gateway login</html>"), "the body is not JSON", id="a proxy's page"),
    pytest.param(Raw('{"id": "chatcmpl-1", "choi', "application/json"), "the body is not JSON", id="JSON cut off"),
    pytest.param(json_body([chat_completion("hi", "m", 1)]), "the body is a list, not a JSON object", id="a list"),
    pytest.param(completion_with(lambda body: body.update(choices="hi")), "choices is a string, not a list",
                 id="choices a string"),
    pytest.param(completion_with(lambda body: body.update(choices=[])), "no choices", id="choices empty"),
    pytest.param(completion_with(lambda body: body.pop("choices")), "no choices", id="choices missing"),
    pytest.param(completion_with(lambda body: body["choices"][0].pop("message")), "no choices[0].message",
                 id="no message"),
    pytest.param(completion_with(lambda body: body["choices"][0]["message"].update(content=5)),
                 "choices[0].message.content is a number, not text", id="content a number"),
    pytest.param(completion_with(lambda body: body["choices"][0]["message"].update(content=[{"text": "hi"}])),
                 "choices[0].message.content is a list, not text", id="content a list"),
]


@pytest.mark.parametrize(("reply", "problem"), ODD_REPLIES)
def test_a_reply_that_is_not_a_chat_completion_is_retried(reply, problem):
    answers = iter([(200, reply), (200, reply), (200, "at last")])
    with OpenAIServer(lambda body: next(answers)) as server:
        client = ChatClient("local", "m", base_url=server.url, max_retries=3)
        assert client.complete(MESSAGES) == "at last"
        assert len(server.requests) == 3
    usage = client.usage
    assert (usage.requests, usage.retries, usage.answered, usage.empty) == (1, 2, 1, 0)
    assert (usage.prompt_tokens, usage.completion_tokens) == (11, 7)  # the good reply's alone


@pytest.mark.parametrize(("reply", "problem"), ODD_REPLIES)
def test_odd_replies_until_retries_are_used_up_are_one_clear_error(reply, problem):
    with OpenAIServer(lambda body: (200, reply)) as server:
        client = ChatClient("local", "m", base_url=server.url, max_retries=2)
        with pytest.raises(LLMError) as error:
            client.complete(MESSAGES)
        assert len(server.requests) == 3 and client.usage.retries == 2
    message = str(error.value)
    assert message.startswith(f"--api=local at {server.url} (model 'm') answered with something that is not a chat "
                              f"completion ({problem}; 3 tries): ")
    assert repr(" ".join(str(reply).split())[:200] + ("..." if len(reply) > 200 else "")) in message
    assert "\n" not in message and len(message) < 400


def test_a_long_odd_page_is_quoted_on_one_line_and_cut_short():
    page = "<html>\n  <body>\n\n" + "Please sign in to the gateway. " * 40 + "THE END</body></html>"
    with OpenAIServer(lambda body: (200, Raw(page))) as server:
        client = ChatClient("local", "m", base_url=server.url, max_retries=0)
        with pytest.raises(LLMError) as error:
            client.complete(MESSAGES)
    message = str(error.value)
    assert "(the body is not JSON; 1 try): '<html> <body> Please sign in to the gateway. Please" in message
    assert message.endswith("...'") and "THE END" not in message and "\n" not in message


def test_odd_replies_back_off_as_a_5xx_does(monkeypatch):
    monkeypatch.setattr(llm, "MALFORMED_BACKOFF", (0.05, 0.1))
    answers = iter([(200, Raw("busy"), {"retry-after-ms": "soon"})] * 3 + [(200, "ok")])  # no usable Retry-After
    with OpenAIServer(lambda body: next(answers)) as server:
        client = ChatClient("local", "m", base_url=server.url, max_retries=3)
        start = time.monotonic()
        assert client.complete(MESSAGES) == "ok"
        assert time.monotonic() - start >= 0.05 + 0.1 + 0.1  # doubled each time, up to the most
    assert client.usage.retries == 3


def test_a_well_formed_reply_without_text_is_empty_not_odd():
    no_text = completion_with(lambda body: body["choices"][0]["message"].update(content=None))
    with OpenAIServer(lambda body: (200, no_text)) as server:
        client = ChatClient("local", "m", base_url=server.url, max_retries=3)
        assert client.complete(MESSAGES) is None
        assert len(server.requests) == 1
    assert (client.usage.empty, client.usage.retries) == (1, 0)


def test_odd_token_counts_do_not_spoil_a_good_answer():
    odd_usage = completion_with(lambda body: body.update(usage="lots"))
    with OpenAIServer(lambda body: (200, odd_usage)) as server:
        client = ChatClient("local", "m", base_url=server.url)
        assert client.complete(MESSAGES) == "never read"
    assert (client.usage.prompt_tokens, client.usage.completion_tokens, client.usage.retries) == (0, 0, 0)


# --- concurrency ---------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 3, 8])
def test_complete_many_keeps_order_and_the_concurrency_limit(limit):
    # The first `limit` requests are answered only once all of them are in flight (a fixed delay left this to
    # the scheduler: on a loaded machine 7 of 8 overlapped); a client that never sends that many breaks the wait.
    together = threading.Barrier(limit, timeout=30)
    first = itertools.count()

    def echo(body):
        if next(first) < limit:
            together.wait()
        return 200, "echo " + body["messages"][0]["content"]

    with OpenAIServer(echo, delay=0.05) as server:
        client = ChatClient("local", "m", base_url=server.url, max_concurrency=limit)
        chats = [[{"role": "user", "content": str(i)}] for i in range(16)]
        assert client.complete_many(chats) == [f"echo {i}" for i in range(16)]
        assert server.max_in_flight == limit
    assert client.usage.in_flight == 0 and client.usage.progress()["done"] == 16


def test_llm_max_tokens_caps_every_request(make_args):
    with OpenAIServer(lambda body: (200, "ok")) as server:
        client = make_client(make_args(api="local", base_url=server.url, llm_max_tokens=16))
        client.complete(MESSAGES, max_tokens=120)
        client.complete([{"role": "user", "content": "short"}], max_tokens=8)
        assert [r["body"]["max_tokens"] for r in server.requests] == [16, 8]


def test_requests_are_not_logged_line_by_line(caplog):
    with OpenAIServer(lambda body: (200, "ok")) as server, caplog.at_level(logging.INFO):
        ChatClient("local", "m", base_url=server.url).complete(MESSAGES)
    assert not [r for r in caplog.records if r.name.startswith("httpx")]  # they would break the progress bars


def test_api_openai_reads_openai_base_url_from_the_environment(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with OpenAIServer(lambda body: (200, "from the env's address")) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        client = ChatClient("openai", "gpt-4")
        assert client.endpoint == server.url and client.complete(MESSAGES) == "from the env's address"


def test_the_client_uses_the_http_library_of_the_installed_openai():
    """openai 1.x/2.x speak httpx, 3.x httpx2: the limits and the refused-connection check must be the
    library's the openai client is built on (and only that one is sure to be installed)."""
    import openai

    from utils import llm

    client = openai.DefaultHttpxClient(limits=llm.http.Limits(max_connections=2))
    assert isinstance(client, llm.http.Client)
    client.close()
