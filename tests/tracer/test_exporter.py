"""KafkaSpanExporter against a real Tansu broker; records read back with kafka-python and opentelemetry-proto."""

from __future__ import annotations

import threading
import time

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from tests.support.pipeline import read_records, spans_of
from tracejudge.consumer.embedded_broker import EmbeddedBroker, free_port
from tracejudge.tracer import KafkaSpanExporter, conversation, setup_tracing, traced_agent
from tracejudge.tracer.setup import exporter_stats


def attribute(span, key: str):
    for kv in span.attributes:
        if kv.key == key:
            value = kv.value
            return getattr(value, value.WhichOneof("value"))
    return None


def test_records_keyed_by_conversation(broker: EmbeddedBroker, topic: str) -> None:
    exporter = KafkaSpanExporter(broker.bootstrap_servers, topic)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    @traced_agent("kafka-bot", session_id_arg=None, tracer_provider=provider)
    def run(q: str) -> str:
        return f"re: {q}"

    with conversation("conv-a", end=True, tracer_provider=provider):
        run("hello a")
    with conversation("conv-b", end=True, tracer_provider=provider):
        run("hello b")
    tracer = provider.get_tracer("other")
    with tracer.start_as_current_span("no conversation") as plain:
        trace_hex = format(plain.get_span_context().trace_id, "032x")
    provider.shutdown()
    assert exporter.stats.spans_exported == 5 and exporter.stats.spans_dropped == 0

    records = read_records(broker.bootstrap_servers, topic, expected=5)
    keys = sorted(r.key.decode() for r in records)
    assert keys == sorted(["conv-a", "conv-a", "conv-b", "conv-b", trace_hex])
    by_key: dict[str, list] = {}
    for record in records:
        by_key.setdefault(record.key.decode(), []).extend(spans_of(record))
    names = sorted(s.name for s in by_key["conv-a"])
    assert names == ["end_conversation", "invoke_agent kafka-bot"]
    turn = next(s for s in by_key["conv-a"] if s.name.startswith("invoke"))
    assert attribute(turn, "gen_ai.conversation.id") == "conv-a"
    assert "hello a" in attribute(turn, "gen_ai.input.messages")
    partitions = {r.partition for r in records if r.key == b"conv-a"}
    assert len(partitions) == 1  # one conversation, one partition


def test_one_record_per_conversation_per_batch(broker: EmbeddedBroker, topic: str) -> None:
    exporter = KafkaSpanExporter(broker.bootstrap_servers, topic)
    provider = TracerProvider()
    spans = []
    tracer = provider.get_tracer("t")
    for conv in ("x", "y", "x", "x"):
        span = tracer.start_span("invoke_agent t", attributes={"gen_ai.conversation.id": conv})
        span.end()
        spans.append(span)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    records = read_records(broker.bootstrap_servers, topic, expected=2)
    assert sorted((r.key, len(spans_of(r))) for r in records) == [(b"x", 3), (b"y", 1)]


def test_broker_down_never_raises_and_counts_drops() -> None:
    exporter = KafkaSpanExporter(f"127.0.0.1:{free_port()}", "otlp_spans", reconnect_backoff_s=60)
    provider = TracerProvider()
    span = provider.get_tracer("t").start_span("s")
    span.end()
    assert exporter.export([span]) is SpanExportResult.FAILURE
    started = time.monotonic()
    assert exporter.export([span, span]) is SpanExportResult.FAILURE  # backing off: fails fast
    assert time.monotonic() - started < 0.5
    assert exporter.stats.spans_dropped == 3 and exporter.stats.export_failures == 2
    exporter.shutdown()
    exporter.shutdown()  # idempotent
    assert exporter.export([span]) is SpanExportResult.FAILURE
    assert exporter.force_flush() is True


# timing-sensitive: asserts how long it took, so it runs alone (tests/run_suite.py's serial phase)
@pytest.mark.serial
def test_application_unaffected_when_broker_is_down() -> None:
    """The app's thread never touches the network; the bounded queue drops and counts the overflow."""
    provider = setup_tracing(
        "down-app",
        kafka_bootstrap_servers=f"127.0.0.1:{free_port()}",
        schedule_delay_millis=50,
        max_queue_size=256,
        set_global=False,
    )

    @traced_agent("bot", tracer_provider=provider)
    def run(q: str, session_id: str) -> str:
        return q

    started = time.monotonic()
    for i in range(5_000):
        assert run(f"q{i}", session_id="down") == f"q{i}"
    elapsed = time.monotonic() - started
    stats = exporter_stats(provider)
    assert stats is not None
    assert elapsed < 10, f"decorated calls stalled: {elapsed:.1f}s for 5000 calls"
    assert stats.queue_full_drops > 0  # bounded memory: the queue never grew past 256
    assert stats.spans_dropped >= stats.queue_full_drops
    worker = threading.Thread(target=provider.shutdown, daemon=True)
    worker.start()
    worker.join(30)


def test_setup_tracing_reads_environment(monkeypatch: pytest.MonkeyPatch, broker: EmbeddedBroker, topic: str) -> None:
    monkeypatch.setenv("TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS", broker.bootstrap_servers)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "env-service")
    provider = setup_tracing(topic=topic, set_global=False, schedule_delay_millis=50)
    assert provider.resource.attributes["service.name"] == "env-service"

    @traced_agent("env-bot", tracer_provider=provider)
    def run(q: str, session_id: str) -> str:
        return q

    run("hi", session_id="env-1")
    provider.force_flush()
    provider.shutdown()
    records = read_records(broker.bootstrap_servers, topic, expected=1)
    assert [r.key for r in records] == [b"env-1"]
    request = ExportTraceServiceRequest()
    request.ParseFromString(records[0].value)
    resource = {kv.key: kv.value.string_value for kv in request.resource_spans[0].resource.attributes}
    assert resource["service.name"] == "env-service"


def test_producer_options_pass_through_and_bad_ones_fail_clearly() -> None:
    exporter = KafkaSpanExporter(
        "127.0.0.1:9",
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_plain_username="u",
        sasl_plain_password="p",
        compression_type="gzip",
        acks="all",
    )
    assert exporter.producer_config["security_protocol"] == "SASL_SSL"
    assert exporter.producer_config["acks"] == "all"
    with pytest.raises(ValueError, match="unknown Kafka client option"):
        KafkaSpanExporter("127.0.0.1:9", securty_protocol="SSL")
