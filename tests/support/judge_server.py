"""A real OpenAI-compatible HTTP server on 127.0.0.1 with scripted answers, for tests and benchmarks.

LiteLLM talks to it over real HTTP exactly as it would talk to OpenAI; the script decides each answer from the
request (or from a queue), so every judge label, fault and delay can be produced on demand.

Structured outputs: a `json_schema` response_format is checked like a provider would (strict, the verdict an enum of
exactly the metric's labels from the seeds' spec); `reject_json_schema` / `reject_json_object` make it answer 400 as
OpenAI does for a model without that mode; `constrain` imitates constrained decoding (a schema-bound model cannot
emit prose or an unknown label; JSON mode cannot emit non-JSON; an empty answer, like a refusal, still happens).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support.batch_api import BatchAPI
from tests.support.loopback import LoopbackHTTPServer, QuietHandler


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


# The seeds' label sets (the contract the schema's enum must match exactly).
SEED_LABELS = {
    "failure_rate": frozenset(
        {"hallucination", "stall", "mixed", "honest_fallback", "alternative_proposed", "not_applicable"}
    ),
    "conversational_flow": frozenset({"fully", "mostly", "partial", "minor", "none"}),
}


def verdict(label: str, reason: str = "scripted", evidence: list[str] | None = None) -> Reply:
    return Reply(content=json.dumps({"verdict": label, "evidence": evidence or [], "reason": reason}))


FAULTS = ("429", "500", "timeout", "hang", "garbage", "unknown", "empty")


def fault_reply(fault: str, label: str) -> Reply:
    """One of the FAULTS a judge endpoint shows: rate limited, server error, a `label` verdict too slow, no answer,
    not JSON, a verdict outside the labels, empty content."""
    return {
        "429": Reply(status=429, headers={"retry-after": "0.05"}, content="slow down"),
        "500": Reply(status=500, content="internal error"),
        "timeout": Reply(content=json.dumps({"verdict": label}), delay_s=3.0),
        "hang": Reply(hang=True),
        "garbage": Reply(content="¯\\_(ツ)_/¯ not json"),
        "unknown": Reply(content=json.dumps({"verdict": "excellent", "reason": "made up"})),
        "empty": Reply(content=""),
    }[fault]


Responder = Callable[[dict[str, Any]], Reply]


class JudgeServer:
    """Start with `start()`, point OPENAI_BASE_URL at `base_url`, read `requests` afterwards."""

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        default: Reply | None = None,
        reject_json_schema: bool = False,
        reject_json_object: bool = False,
        constrain: bool = False,
        flex_refuse: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        self.responder = responder
        # The flex tier: a request with service_tier=flex is refused for capacity (429 resource_unavailable, as
        # OpenAI answers) when `flex_refuse(body)` says so; `flex_requests` counts flex requests, refused or not.
        self.flex_refuse = flex_refuse
        self.flex_requests = 0
        self.flex_refused = 0
        self.batch = BatchAPI(self._answer_line)
        self.default = default or verdict("not_applicable")
        # Failing on command (`fail`, `recover`): while set, every judgement request gets this answer and is recorded
        # in `refused` (with its time), not in `requests`: an outage, a revoked key.
        self.failing: Reply | None = None
        self.refused: list[tuple[float, dict[str, Any]]] = []
        self.queue: list[Reply] = []
        self.requests: list[dict[str, Any]] = []
        self.request_times: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.in_flight = 0
        self.max_in_flight = 0
        self.reject_json_schema = reject_json_schema
        self.reject_json_object = reject_json_object
        self.constrain = constrain
        self.schema_problems: list[str] = []
        # The commands' startup check (one cheap call before any record): answered here, apart from `requests`,
        # so scripts and request counts see only judgements; a test of the check sets its own reply.
        self.check_reply = Reply(content="OK")
        self.check_responder: Responder | None = None  # when set, the check's reply from its request (by model)
        self.checks: list[dict[str, Any]] = []
        server = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers go out in small writes: Nagle + delayed ACK would add ~40 ms

            def _batch_api(self, method: str) -> bool:
                if not server.batch.handles(self.path):
                    return False
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, payload, content_type = server.batch.route(method, self.path, self.headers, raw)
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return True

            def do_GET(self) -> None:
                if not self._batch_api("GET"):
                    self.send_error(404)

            def do_POST(self) -> None:
                if self._batch_api("POST"):
                    return
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                flex_refusal = server._flex(body)
                if flex_refusal is not None:
                    reply = flex_refusal
                elif is_judge_check(body):
                    with server._lock:
                        server.checks.append(body)
                    reply = server.check_responder(body) if server.check_responder else server.check_reply
                else:
                    reply = server._refusal(body) or server._constrained(body, server._next(body))
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

        self._http = LoopbackHTTPServer(Handler, name="judge-server")

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def base_url(self) -> str:
        return f"{self._http.url}/v1"

    def start(self) -> JudgeServer:
        self._http.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.batch.stop()
        self._http.stop()

    def __enter__(self) -> JudgeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def fail(self, reply: Reply) -> None:
        """From now on every judgement request is answered `reply` (e.g. `Reply(status=503)`), until `recover()`."""
        with self._lock:
            self.failing = reply

    def recover(self) -> None:
        with self._lock:
            self.failing = None

    def enqueue(self, *replies: Reply) -> None:
        with self._lock:
            self.queue.extend(replies)

    def response_modes(self) -> list[str]:
        """The response_format type of every request received, in order (`text` when none was sent)."""
        with self._lock:
            return [mode_of(r) for r in self.requests]

    def _flex(self, body: dict[str, Any]) -> Reply | None:
        """A flex request refused for capacity (not recorded as a judgement: the caller makes it again)."""
        if body.get("service_tier") != "flex":
            return None
        with self._lock:
            self.flex_requests += 1
            refuse = self.flex_refuse is not None and self.flex_refuse(body)
            self.flex_refused += refuse
        if not refuse:
            return None
        error = {
            "message": "Resource Unavailable: flex capacity is not available right now, try again later.",
            "type": "invalid_request_error",
            "code": "resource_unavailable",
        }
        return Reply(status=429, raw_body=json.dumps({"error": error}).encode())

    def _answer_line(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """One line of a batch: answered as the chat endpoint answers the same body (the same script)."""
        reply = self._refusal(body) or self._constrained(body, self._next(body))
        payload = reply.raw_body if reply.raw_body is not None else self._completion(body, reply)
        try:
            parsed = json.loads(payload)
        except ValueError:
            parsed = {"error": {"message": payload.decode("utf-8", "replace")}}
        return reply.status, parsed

    def _refusal(self, body: dict[str, Any]) -> Reply | None:
        """A 400 for a response format this "model" lacks, or for a schema that is not exactly the labels."""
        mode = mode_of(body)
        if (mode == "json_schema" and self.reject_json_schema) or (mode == "json_object" and self.reject_json_object):
            with self._lock:
                self.requests.append(body)
                self.request_times.append(time.time())
            message = f"Invalid parameter: 'response_format' of type '{mode}' is not supported with this model."
            error = {"message": message, "type": "invalid_request_error", "param": "response_format", "code": None}
            return Reply(status=400, raw_body=json.dumps({"error": error}).encode())
        if mode == "json_schema":
            problem = schema_problem(body)
            if problem:
                with self._lock:
                    self.schema_problems.append(problem)
                    self.requests.append(body)
                    self.request_times.append(time.time())
                error = {"message": f"judge_server: {problem}", "type": "invalid_request_error", "code": None}
                return Reply(status=400, raw_body=json.dumps({"error": error}).encode())
        return None

    def _constrained(self, body: dict[str, Any], reply: Reply) -> Reply:
        """With `constrain`, what a provider's constrained decoding lets through of the scripted answer."""
        mode = mode_of(body)
        if not self.constrain or mode == "text" or reply.status != 200 or reply.raw_body is not None:
            return reply
        if not reply.content:  # a refusal or an empty answer is possible in every mode
            return reply
        labels = sorted(labels_of(body))
        try:
            answer = json.loads(reply.content)
        except ValueError:
            answer = None
        if mode == "json_object" and isinstance(answer, dict):
            return reply
        if mode == "json_schema" and isinstance(answer, dict) and answer.get("verdict") in labels:
            return reply
        # The model had to pick a valid token sequence: a label it would have chosen (stable per answer).
        label = labels[int(hashlib.sha256(reply.content.encode()).hexdigest(), 16) % len(labels)]
        evidence_key = "key_issues" if metric_of(body) == "conversational_flow" else "evidence"  # a file: evidence
        content = json.dumps({"verdict": label, evidence_key: [], "reason": "constrained"})
        return Reply(content=content, delay_s=reply.delay_s, hang=reply.hang)

    def _next(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            if self.failing is not None:
                self.refused.append((time.time(), body))
                return self.failing
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
                "service_tier": request.get("service_tier") or "default",
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


def is_judge_check(request: dict[str, Any]) -> bool:
    """The startup check's request (tracejudge.metrics.judge_check.JUDGE_CHECK_PROMPT), not a judgement."""
    return any("tracejudge judge check" in str(m.get("content", "")) for m in request.get("messages", []))


def conversation_text(request: dict[str, Any]) -> str:
    """The user message of a judge request: where the conversation travels."""
    return next((m["content"] for m in request.get("messages", []) if m.get("role") == "user"), "")


def mode_of(request: dict[str, Any]) -> str:
    """`json_schema`, `json_object` or `text`: how the request asked for its answer."""
    response_format = request.get("response_format")
    return response_format.get("type", "text") if isinstance(response_format, dict) else "text"


def schema_problem(request: dict[str, Any]) -> str | None:
    """Why a json_schema response_format is not the strict schema of the metric's labels (None when it is)."""
    spec = request["response_format"].get("json_schema") or {}
    schema = spec.get("schema") or {}
    properties = schema.get("properties") or {}
    enum = (properties.get("verdict") or {}).get("enum")
    labels = labels_of(request)
    if spec.get("strict") is not True:
        return "the schema is not strict"
    if not isinstance(enum, list) or len(enum) != len(set(enum)) or set(enum) != labels:
        return f"the verdict enum {enum} is not exactly the labels {sorted(labels)}"
    if schema.get("additionalProperties") is not False or set(schema.get("required") or []) != set(properties):
        return "strict schemas need every property required and additionalProperties false"
    return None


def metric_of(request: dict[str, Any]) -> str:
    """Which judge sent the request: its strict schema's name (`{judge}_verdict`), else its static system prompt."""
    response_format = request.get("response_format")
    if isinstance(response_format, dict):
        name = str((response_format.get("json_schema") or {}).get("name") or "")
        if name.endswith("_verdict"):
            return name.removesuffix("_verdict")
    system = next((m["content"] for m in request.get("messages", []) if m.get("role") == "system"), "")
    return "conversational_flow" if '"fully"' in system else "failure_rate"


def labels_of(request: dict[str, Any]) -> frozenset[str]:
    """The judge's labels: the seeds' for a built-in; a rubric file's judge, those its prompt lists (`- "label"`)."""
    metric = metric_of(request)
    if metric in SEED_LABELS:
        return SEED_LABELS[metric]
    system = next((m["content"] for m in request.get("messages", []) if m.get("role") == "system"), "")
    listed = system.partition("## Labels (choose exactly one)")[2].partition("\n\n## ")[0]
    return frozenset(re.findall(r'^- "([a-z][a-z0-9_]*)"', listed, re.M))


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
