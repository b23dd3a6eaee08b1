"""A real OpenAI-compatible HTTP server on 127.0.0.1 with scripted answers, for tests and benchmarks.

LiteLLM talks to it over real HTTP exactly as it would talk to OpenAI; the script decides each answer from the
request (or from a queue), so every judge label, fault and delay can be produced on demand.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer: model content, or a fault (status, raw body, delay, hang)."""

    content: str | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    raw_body: bytes | None = None
    delay_s: float = 0.0
    hang: bool = False
    prompt_tokens: int | None = None
    cached_tokens: int = 0


def verdict(label: str, reason: str = "scripted", evidence: list[str] | None = None) -> Reply:
    return Reply(content=json.dumps({"verdict": label, "evidence": evidence or [], "reason": reason}))


Responder = Callable[[dict[str, Any]], Reply]


class JudgeServer:
    """Start with `start()`, point OPENAI_BASE_URL at `base_url`, read `requests` afterwards."""

    def __init__(self, responder: Responder | None = None, *, default: Reply | None = None) -> None:
        self.responder = responder
        self.default = default or verdict("not_applicable")
        self.queue: list[Reply] = []
        self.requests: list[dict[str, Any]] = []
        self.request_times: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.in_flight = 0
        self.max_in_flight = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers go out in small writes: Nagle + delayed ACK would add ~40 ms

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                reply = server._next(body)
                with server._lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    if reply.hang:
                        server._stop.wait(3600)
                        return
                    if reply.delay_s:
                        server._stop.wait(reply.delay_s)
                    payload = reply.raw_body if reply.raw_body is not None else server._completion(body, reply)
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with server._lock:
                        server.in_flight -= 1

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="judge-server", daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> JudgeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> JudgeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def enqueue(self, *replies: Reply) -> None:
        with self._lock:
            self.queue.extend(replies)

    def _next(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(body)
            self.request_times.append(time.time())
            if self.queue:
                return self.queue.pop(0)
        if self.responder is not None:
            return self.responder(body)
        return self.default

    @staticmethod
    def _completion(request: dict[str, Any], reply: Reply) -> bytes:
        prompt_chars = sum(len(str(m.get("content", ""))) for m in request.get("messages", []))
        prompt_tokens = reply.prompt_tokens if reply.prompt_tokens is not None else max(1, prompt_chars // 4)
        completion_tokens = max(1, len(reply.content or "") // 4)
        return json.dumps(
            {
                "id": f"chatcmpl-{time.time_ns()}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": request.get("model", "scripted"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": reply.content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                    "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
                },
            }
        ).encode()


def conversation_text(request: dict[str, Any]) -> str:
    """The user message of a judge request: where the conversation travels."""
    return next((m["content"] for m in request.get("messages", []) if m.get("role") == "user"), "")


def metric_of(request: dict[str, Any]) -> str:
    """Which judge sent the request, read from its static system prompt."""
    system = next((m["content"] for m in request.get("messages", []) if m.get("role") == "system"), "")
    return "conversational_flow" if '"fully"' in system else "failure_rate"


def _serve_forever() -> None:
    """`python -m tests.support.judge_server DELAY`: a separate process, so its CPU does not share our GIL."""
    import sys

    delay = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0

    def respond(request: dict[str, Any]) -> Reply:
        label = "mostly" if metric_of(request) == "conversational_flow" else "honest_fallback"
        return Reply(content=json.dumps({"verdict": label, "evidence": [], "reason": "bench"}), delay_s=delay)

    server = JudgeServer(responder=respond).start()
    print(server.base_url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    _serve_forever()
