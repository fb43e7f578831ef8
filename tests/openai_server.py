"""A small OpenAI-compatible HTTP server on 127.0.0.1 for tests of the API backends.

Each request to ``/v1/chat/completions`` (or ``.../openai/deployments/<d>/chat/completions``
for Azure) is answered by ``responder(body)``: ``(status, text_or_error)`` or
``(status, text_or_error, headers)``. A :class:`Raw` text is sent as it is, not as a chat
completion (:func:`json_body`: any JSON value). Every request is recorded in ``server.requests``;
``delay`` seconds are spent on each answer, ``max_in_flight`` records how many were being
answered at once, and ``first_request_at``/``last_answer_at`` (``time.monotonic()``) when
requests began and ended.
"""

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Raw(str):
    """A response body sent verbatim as ``kind`` (text/html: a proxy's error page, say)."""

    def __new__(cls, text: str, kind: str = "text/html"):
        raw = super().__new__(cls, text)
        raw.kind = kind
        return raw


def json_body(value) -> Raw:
    """``value`` sent as the JSON body of the answer, whatever its shape."""
    return Raw(json.dumps(value), "application/json")


def chat_completion(text: str, model: str, number: int) -> dict:
    return {
        "id": f"chatcmpl-{number}", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


class OpenAIServer:
    def __init__(self, responder: Callable[[dict], tuple], delay: float = 0.0):
        self.responder = responder
        self.delay = delay
        self.requests: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.first_request_at: float | None = None
        self.last_answer_at: float | None = None
        lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real servers do

            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    owner.requests.append({"path": self.path, "body": body,
                                           "headers": {k.lower(): v for k, v in self.headers.items()}})
                    owner.in_flight += 1
                    owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
                    number = len(owner.requests)
                    if owner.first_request_at is None:
                        owner.first_request_at = time.monotonic()
                try:
                    time.sleep(owner.delay)
                    status, text, *extra = owner.responder(body)
                finally:
                    with lock:
                        owner.in_flight -= 1
                        owner.last_answer_at = time.monotonic()
                headers = {"retry-after-ms": "1", **(extra[0] if extra else {})}
                if isinstance(text, Raw):
                    data, kind = text.encode(), text.kind
                elif status == 200:
                    data, kind = json.dumps(chat_completion(text, body.get("model", "test"), number)).encode(), \
                        "application/json"
                else:
                    data = json.dumps({"error": {"message": text, "type": "test_error", "code": status}}).encode()
                    kind = "application/json"
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128  # many clients connecting at once (the concurrency benchmark)

        self._server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "OpenAIServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def serve_in_background(self) -> "OpenAIServer":
        """Start serving (for use outside a ``with`` block, e.g. by a benchmark)."""
        return self.__enter__()
