"""A real HTTP server on 127.0.0.1 speaking the Anthropic Messages API (`POST /v1/messages`), with a prompt cache.

LiteLLM reaches it with `api_base=` exactly as it reaches api.anthropic.com. The cache behaves like Anthropic's: the
prefix up to the last block marked `cache_control` is written once (`cache_creation_input_tokens`) when it reaches
the minimum length, then read (`cache_read_input_tokens`); unmarked requests are never cached. Tokens are counted as
one per four characters of each block's JSON, which is all the tests need: the same text, the same count.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from typing import Any

from tests.support.loopback import LoopbackHTTPServer, QuietHandler

Answer = Callable[[dict[str, Any]], str]


def _tokens(value: Any) -> int:
    return max(1, len(json.dumps(value, sort_keys=True)) // 4)


def _blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's prompt in Anthropic's cache order: tools, system, then messages, as content blocks."""
    blocks: list[dict[str, Any]] = list(body.get("tools") or [])
    system = body.get("system")
    if isinstance(system, str):
        blocks.append({"type": "text", "text": system})
    elif isinstance(system, list):
        blocks.extend(system)
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            blocks.append({"type": "text", "text": content, "role": message.get("role")})
        else:
            blocks.extend({**block, "role": message.get("role")} for block in content or [])
    return blocks


def _invalid(body: dict[str, Any], headers: Any) -> tuple[int, str, str] | None:
    """What the real API refuses before judging anything: no key or version header, no `max_tokens`, a role other
    than user/assistant in `messages` (the system prompt goes in `system`), more than 4 breakpoints, or structured
    output without its beta header."""
    if not headers.get("x-api-key"):
        return 401, "authentication_error", "x-api-key header is required"
    if not headers.get("anthropic-version"):
        return 400, "invalid_request_error", "anthropic-version header is required"
    if not isinstance(body.get("max_tokens"), int) or not body.get("model"):
        return 400, "invalid_request_error", "model and max_tokens are required"
    roles = {message.get("role") for message in body.get("messages") or [{}]}
    if not roles <= {"user", "assistant"}:
        return 400, "invalid_request_error", f"messages: unexpected role(s) {sorted(map(str, roles))}"
    if sum(1 for block in _blocks(body) if isinstance(block, dict) and block.get("cache_control")) > 4:
        return 400, "invalid_request_error", "A maximum of 4 blocks with cache_control may be provided"
    if "output_format" in body and "structured-outputs" not in (headers.get("anthropic-beta") or ""):
        return 400, "invalid_request_error", "output_format: requires the structured-outputs beta header"
    return None


class AnthropicServer:
    """Start with `start()`, pass `base_url` as LiteLLM's `api_base`, read `requests` afterwards."""

    def __init__(self, answer: Answer, *, minimum_cacheable_tokens: int = 1024, output_tokens: int = 40) -> None:
        self.answer = answer
        self.minimum_cacheable_tokens = minimum_cacheable_tokens
        self.output_tokens = output_tokens
        self.requests: list[dict[str, Any]] = []
        self.usages: list[dict[str, int]] = []
        self.rejected: list[str] = []  # why each refused request was refused (the real API's checks, see `_invalid`)
        self._cache: set[str] = set()
        self._lock = threading.Lock()
        server = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path.rstrip("/") != "/v1/messages":
                    self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}})
                    return
                problem = _invalid(body, self.headers)
                if problem is not None:
                    status, kind, message = problem
                    server.rejected.append(message)
                    self._send(status, {"type": "error", "error": {"type": kind, "message": message}})
                    return
                self._send(200, server._message(body))

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._http = LoopbackHTTPServer(Handler)

    @property
    def base_url(self) -> str:
        return self._http.url

    def start(self) -> AnthropicServer:
        self._http.start()
        return self

    def stop(self) -> None:
        self._http.stop()

    def _usage(self, body: dict[str, Any]) -> dict[str, int]:
        blocks = _blocks(body)
        total = sum(_tokens(block) for block in blocks)
        marked = [i for i, block in enumerate(blocks) if isinstance(block, dict) and block.get("cache_control")]
        read = written = 0
        if marked:
            prefix = blocks[: marked[-1] + 1]
            size = sum(_tokens(block) for block in prefix)
            key = hashlib.sha256(json.dumps([body.get("model"), prefix], sort_keys=True).encode()).hexdigest()
            with self._lock:
                if key in self._cache:
                    read = size
                elif size >= self.minimum_cacheable_tokens:
                    self._cache.add(key)
                    written = size
        return {
            "input_tokens": total - read - written,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
            "output_tokens": self.output_tokens,
        }

    def _message(self, body: dict[str, Any]) -> dict[str, Any]:
        usage = self._usage(body)
        with self._lock:
            self.requests.append(body)
            self.usages.append(usage)
            number = len(self.requests)
        return {
            "id": f"msg_{number:08d}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", ""),
            "content": [{"type": "text", "text": self.answer(body)}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }
