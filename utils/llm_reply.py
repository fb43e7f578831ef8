"""What an OpenAI-compatible server sent back, read for :class:`utils.llm.ChatClient`: a raw response's chat
completion (its text and tokens) or why it is not one (:class:`Malformed`), the reason an error response gives,
and how long a response asks the client to wait before a retry."""

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice


class Malformed(Exception):
    """A reply that is not a chat completion of the API's shape (its message says what is wrong)."""


def error_reason(error: openai.APIStatusError) -> str:
    """The status code and the server's own explanation of an error response."""
    body, message = error.body, None
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") or inner.get("detail") if isinstance(inner, dict) else inner
        message = message or body.get("detail") or body.get("message")
    if message is None:
        try:
            message = error.response.text.strip() or error.message
        except Exception:  # a streamed body that cannot be read any more
            message = error.message
    return f"HTTP {error.status_code}: {' '.join(str(message).split())[:300]}"


def retry_after(headers, default: float = 0.5, most: float = 60.0) -> float:
    """Seconds a response's headers ask to wait before a retry (``retry-after-ms`` or ``retry-after``)."""
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        try:
            return min(most, max(0.0, float(headers[name]) * scale))
        except (KeyError, ValueError):
            continue
    return default


def read_completion(reply) -> tuple[str, int, int]:
    """The text of a raw response's chat completion ("" when the model wrote none) and its prompt and completion
    tokens; :class:`Malformed` if it is not one. The openai client builds its models without validating them, so
    ``choices`` may come back a string and ``content`` a number."""
    try:
        completion = reply.parse()
    except Exception:  # parsing only decodes the body: any error means it is not JSON
        raise Malformed("the body is not JSON") from None
    if isinstance(completion, str) and completion == reply.text:  # a body that is not JSON comes back as its text
        raise Malformed("the body is not JSON")
    if not isinstance(completion, ChatCompletion):
        raise Malformed(f"the body is {_shape(completion)}, not a JSON object")
    choices = completion.choices
    if not choices:
        raise Malformed("no choices")
    if not isinstance(choices, list):
        raise Malformed(f"choices is {_shape(choices)}, not a list")
    if not isinstance(choices[0], Choice):
        raise Malformed(f"choices[0] is {_shape(choices[0])}, not an object")
    message = choices[0].message
    if not isinstance(message, ChatCompletionMessage):
        raise Malformed("no choices[0].message" if message is None else
                        f"choices[0].message is {_shape(message)}, not an object")
    if message.content is not None and not isinstance(message.content, str):
        raise Malformed(f"choices[0].message.content is {_shape(message.content)}, not text")
    usage = completion.usage  # a server may leave it out, or fill it oddly: then nothing is counted

    def tokens(name: str) -> int:
        value = getattr(usage, name, None)
        return value if isinstance(value, int) else 0

    return message.content or "", tokens("prompt_tokens"), tokens("completion_tokens")


def _shape(value) -> str:
    """What kind of JSON value ``value`` is, for a message."""
    kinds = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "a list", dict: "an object"}
    return kinds.get(type(value), type(value).__name__)


def excerpt(text: str, most: int = 200) -> str:
    """``text`` on one line, cut at ``most`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= most else text[:most] + "..."
