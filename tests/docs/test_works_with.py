"""docs/works-with.md's copy-paste blocks, one per route, checked as the README's snippet is.

Every block compiles, ends its conversations, and imports only names that exist (each module that is installed here
is imported; `openinference` is not, so the instrumentor route is compiled and its tracejudge names imported, not
run). The own-TracerProvider route and the Collector route run as a user's program next to a real consumer with the
default 300 s idle timeout, their conversations judged at once; the Collector route through a stand-in Collector (an
OTLP/HTTP receiver writing one `otlp_proto` record per trace, keyed by trace id, as its Kafka exporter does).
"""

from __future__ import annotations

import ast
import gzip
import importlib
import importlib.util
import re
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.docs.test_quickstart import judge_answer
from tests.support.judge_server import JudgeServer, conversation_text
from tracejudge.consumer.embedded_broker import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "works-with.md"
ROUTES = ("instrumentor", "provider", "collector", "collector-run")
NOT_INSTALLED_HERE = {"openinference"}  # the instrumentor route's library: compiled, not run
# What a user's program defines before the block: their instrumented agent (here traced by tracejudge's decorator,
# standing in for any instrumentation that makes a span per call on the global provider).
AGENT = """from tracejudge.tracer import traced_agent


@traced_agent("support-bot", session_id_arg=None)
def my_instrumented_agent(question: str) -> str:
    return "Your parcel left our warehouse yesterday."


"""


def blocks() -> dict[str, tuple[str, str]]:
    """Each `<!-- works-with:NAME -->` marker's following block: its language and its text."""
    found: dict[str, tuple[str, str]] = {}
    for match in re.finditer(r"<!-- works-with:([\w-]+) -->\n```(\w+)\n(.*?)\n```", PAGE.read_text(), re.S):
        assert match.group(1) not in found, f"two blocks named {match.group(1)}"
        found[match.group(1)] = (match.group(2), match.group(3))
    return found


def test_one_block_per_route_each_ending_its_conversations() -> None:
    found = blocks()
    assert tuple(found) == ROUTES
    for name, (language, text) in found.items():
        if language != "python":
            continue
        compile(text, f"works-with:{name}", "exec")
        assert "end_conversation(" in text or "end=True" in text, name
        assert "provider.shutdown()" in text, name  # a short program's last batch is not lost at exit
    assert "(docs/works-with.md)" in (ROOT / "README.md").read_text()  # linked from the README
    page = " ".join(PAGE.read_text().split())
    assert "300 s by default" in page and "end_conversation(id)" in page


def test_every_name_the_blocks_import_exists() -> None:
    skipped = set()
    for name, (language, text) in blocks().items():
        if language != "python":
            continue
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ImportFrom) or node.module is None:
                continue
            top = node.module.split(".")[0]
            if importlib.util.find_spec(top) is None:
                assert top in NOT_INSTALLED_HERE, f"{name}: {node.module} is not installed here"
                skipped.add(top)
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{name}: {node.module} has no {alias.name}"
    assert skipped <= NOT_INSTALLED_HERE


def test_the_collector_block_runs_the_example_config_with_the_pinned_image() -> None:
    _language, command = blocks()["collector-run"]
    example = ROOT / "examples" / "otel-collector-to-kafka.yaml"
    assert f"$PWD/{example.relative_to(ROOT)}:" in command
    pinned = re.search(r"otel/opentelemetry-collector-contrib:[\d.]+", example.read_text())
    assert pinned is not None and command.endswith(pinned.group(0))


class StandInCollector:
    """An OTLP/HTTP (protobuf) receiver writing one record per trace keyed by its trace id, as the Collector's Kafka
    exporter does with `encoding: otlp_proto` and `partition_traces_by_id: true`."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        from tracejudge.consumer.kafka import KafkaClients

        self.producer = KafkaClients(bootstrap).producer("stand-in-collector", linger_ms=0)
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                for trace_id, part in collector.by_trace(request).items():
                    collector.producer.send(topic, key=trace_id.encode(), value=part.SerializeToString())
                collector.producer.flush()
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="stand-in-collector")

    @staticmethod
    def by_trace(request: Any) -> dict[str, Any]:
        parts: dict[str, Any] = {}
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    part = parts.setdefault(span.trace_id.hex(), type(request)())
                    rs = part.resource_spans.add(resource=resource_spans.resource)
                    rs.scope_spans.add(scope=scope_spans.scope).spans.append(span)
        return parts

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/v1/traces"

    def __enter__(self) -> StandInCollector:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)
        self.producer.close()


def run_route(
    broker: EmbeddedBroker, judge_server: JudgeServer, tmp_path: Path, program: str, topic: str, conversation: str
) -> float:
    """The program next to a consumer of `topic` with the default idle timeout; seconds until its conversation was
    judged, counted from the program's start."""
    from tests.support.pipeline import RunningConsumer, consumer_settings, last_outcome, wait_for

    judge_server.responder = judge_answer
    settings = consumer_settings(broker.bootstrap_servers, topic, session_idle_timeout=300.0)
    with RunningConsumer(settings) as consumer:
        script = tmp_path / "my_app.py"
        script.write_text(program)
        started = time.monotonic()
        subprocess.run([sys.executable, str(script)], check=True, timeout=120, cwd=tmp_path)
        wait_for(
            lambda: last_outcome(consumer.app.service, conversation) == "judged",
            timeout=120,
            what=f"{conversation} judged",
        )
        took = time.monotonic() - started
    assert took < settings.session_idle_timeout / 2, took
    asked = [conversation_text(request) for request in judge_server.requests]
    assert any("Where is my parcel?" in text for text in asked), asked
    return took


# timing-sensitive: asserts how long it took, so it runs alone (tests/run_suite.py's serial phase)
@pytest.mark.serial
def test_the_own_provider_block_is_judged_at_once(
    broker: EmbeddedBroker, judge_server: JudgeServer, tmp_path: Path
) -> None:
    _language, block = blocks()["provider"]
    assert block.count('KafkaSpanExporter("kafka:9092", "otlp_spans")') == 1
    (conversation,) = re.findall(r'conversation\("([^"]+)"', block)
    topic = f"spans-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 3)
    program = AGENT + block.replace('"kafka:9092", "otlp_spans"', f"{broker.bootstrap_servers!r}, {topic!r}")
    took = run_route(broker, judge_server, tmp_path, program, topic, conversation)
    asked = [conversation_text(request) for request in judge_server.requests]
    assert any("Where is my parcel?" in text and "Thanks, that's all." in text for text in asked), asked
    print(f"\nthe own-provider route's conversation judged {took:.1f} s after the program started")


@pytest.mark.serial
def test_the_collector_block_is_judged_at_once_through_a_trace_keyed_topic(
    broker: EmbeddedBroker, judge_server: JudgeServer, tmp_path: Path
) -> None:
    _language, block = blocks()["collector"]
    endpoint = 'OTLPSpanExporter(endpoint="http://otel-collector:4318/v1/traces")'
    assert block.count(endpoint) == 1
    (conversation,) = re.findall(r'conversation\("([^"]+)"', block)
    topic = f"spans-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 3)
    with StandInCollector(broker.bootstrap_servers, topic) as collector:
        program = AGENT + block.replace(endpoint, f"OTLPSpanExporter(endpoint={collector.url!r})")
        took = run_route(broker, judge_server, tmp_path, program, topic, conversation)
    print(f"\nthe Collector route's conversation judged {took:.1f} s after the program started")
