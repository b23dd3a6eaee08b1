"""Malformed input: fuzzed bytes and protobufs never crash decoding; 10,000 hostile records through the consumer are
all counted, the valid conversations among them still assembled, and memory stays bounded."""

from __future__ import annotations

import json
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaProducer
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.trace import TracerProvider

from tests.support.pipeline import RunningConsumer, consumer_settings, wait_for
from tracejudge.consumer.adapters import extract
from tracejudge.consumer.decode import MalformedRecord, decode_record
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.sessions import SessionStore

KEYS = [
    "gen_ai.conversation.id",
    "gen_ai.agent.name",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.operation.name",
    "tracejudge.turn.index",
    "tracejudge.conversation.ended",
    "tracejudge.feedback.score",
    "session.id",
    "input.value",
    "output.value",
    "llm.input_messages.0.message.content",
    "traceloop.association.properties.session_id",
    "gen_ai.prompt.0.content",
    "gen_ai.completion.0.content",
]
any_value = st.one_of(
    st.text(max_size=200).map(lambda s: AnyValue(string_value=s)),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(lambda i: AnyValue(int_value=i)),
    st.booleans().map(lambda b: AnyValue(bool_value=b)),
    st.floats(allow_nan=True).map(lambda f: AnyValue(double_value=f)),
    st.binary(max_size=50).map(lambda b: AnyValue(bytes_value=b)),
    st.just(AnyValue()),
    st.sampled_from(['[{"role": "user", "parts": 5}]', "[null, 1, {}]", '{"role": "assistant"}', "[[[]]]"]).map(
        lambda s: AnyValue(string_value=s)
    ),
)


def fold(value: bytes) -> None:
    """What the consumer does with one record: decode, adapt, assemble. Only MalformedRecord may escape."""
    store = SessionStore(max_turns=5)
    try:
        spans = decode_record(value)
    except MalformedRecord:
        return
    for span in spans:
        event = extract(span)
        if event is not None:
            store.apply(event, 0, 0, 0.0)
    store.expire_idle(1e9)
    for job in store.take_ready():
        job.judgeable_turns  # noqa: B018 - must not raise


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2_000))
def test_random_bytes(value: bytes) -> None:
    fold(value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.sampled_from(KEYS), any_value), max_size=12),
    st.binary(min_size=0, max_size=20),
    st.binary(min_size=0, max_size=10),
    st.integers(min_value=0, max_value=2),
)
def test_protobuf_with_wrong_or_missing_attributes(attributes, trace_id, span_id, status) -> None:
    span = Span(
        trace_id=trace_id, span_id=span_id, name="x", attributes=[KeyValue(key=k, value=v) for k, v in attributes]
    )
    span.status.code = status
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])])
    payload = request.SerializeToString()
    fold(payload)
    fold(payload[: len(payload) // 2])  # truncated


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=30),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
        max_leaves=30,
    )
)
def test_otlp_json_shapes(document) -> None:
    fold(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [document]}]}]}).encode())
    fold(json.dumps(document).encode())


def current_rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def turn_spans(tracer, conversation: str, count: int, start: int = 0) -> list:
    spans = []
    for index in range(start, start + count):
        span = tracer.start_span(
            "invoke_agent fuzz",
            attributes={
                "gen_ai.conversation.id": conversation,
                "gen_ai.agent.name": "fuzz",
                "gen_ai.operation.name": "invoke_agent",
                "tracejudge.turn.index": index,
                "gen_ai.input.messages": json.dumps(
                    [{"role": "user", "parts": [{"type": "text", "content": f"q{index}"}]}]
                ),
                "gen_ai.output.messages": json.dumps(
                    [{"role": "assistant", "parts": [{"type": "text", "content": "a"}]}]
                ),
            },
        )
        span.end()
        spans.append(span)
    return spans


def test_ten_thousand_hostile_records(broker: EmbeddedBroker, topic: str) -> None:
    rng = random.Random(1234)
    tracer = TracerProvider().get_tracer("fuzz")
    valid = encode_spans(turn_spans(tracer, "template", 2)).SerializeToString()
    records: list[bytes] = []
    for i in range(10_000):
        kind = i % 5
        if kind == 0:
            records.append(rng.randbytes(rng.randint(1, 300)))
        elif kind == 1:
            records.append(valid[: rng.randint(1, len(valid) - 1)])
        elif kind == 2:
            records.append(b'{"resourceSpans": [\xff\xfe invalid utf-8 ' + rng.randbytes(20))
        elif kind == 3:
            records.append(b"")
        else:
            bad = Span(
                trace_id=rng.randbytes(16),
                span_id=rng.randbytes(8),
                name="bad",
                attributes=[
                    KeyValue(key="gen_ai.conversation.id", value=AnyValue(int_value=i)),
                    KeyValue(key="gen_ai.input.messages", value=AnyValue(string_value="{not json")),
                ],
            )
            records.append(
                ExportTraceServiceRequest(
                    resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[bad])])]
                ).SerializeToString()
            )
    big = encode_spans(turn_spans(tracer, "huge-record", 1)).SerializeToString() + b"\x00" * (10 * 1024 * 1024)
    long_conversation = [
        encode_spans(turn_spans(tracer, "hundred-thousand-turns", 1_000, start=chunk * 1_000)).SerializeToString()
        for chunk in range(100)
    ]
    good = [encode_spans(turn_spans(tracer, f"good-{i}", 2)).SerializeToString() for i in range(50)]
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap_servers, linger_ms=20, max_request_size=32 * 1024 * 1024
    )
    for value in records:
        producer.send(topic, key=b"fuzz", value=value)
    big_sent = producer.send(topic, key=b"big", value=big)
    for value in long_conversation:
        producer.send(topic, key=b"hundred-thousand-turns", value=value)
    for i, value in enumerate(good):
        producer.send(topic, key=f"good-{i}".encode(), value=value)
    producer.flush()
    big_accepted = big_sent.succeeded()
    producer.close()
    total = len(records) + len(long_conversation) + len(good) + (1 if big_accepted else 0)
    del records, long_conversation, big
    rss_before = current_rss_mb()
    settings_ = consumer_settings(
        broker.bootstrap_servers,
        topic,
        sample_rate=0.0,
        session_idle_timeout=1.0,
        metrics="failure_rate",
        max_turns_per_conversation=1_000,
    )
    with RunningConsumer(settings_) as consumer:

        def counted() -> float:
            return consumer.value("tracejudge_records_total", outcome="ok") + consumer.value(
                "tracejudge_records_total", outcome="malformed"
            )

        wait_for(lambda: counted() == total, timeout=240, what=f"all {total} records counted")
        wait_for(lambda: consumer.sessions("sampled_out") >= 50 + 100, timeout=60, what="conversations completed")
        store = consumer.app.service.store
        assert consumer.value("tracejudge_records_total", outcome="malformed") >= 8_000 + (1 if big_accepted else 0)
        assert store.counts.truncated_conversations >= 99  # the 100,000-turn conversation, in windows of 1,000
        assert all(len(c.turns) <= 1_000 for c in [*store.open.values(), *store.done.values()])
    growth_mb = current_rss_mb() - rss_before
    assert growth_mb < 800, f"memory grew by {growth_mb:.0f} MB"
    print(
        f"\nmalformed: {total} records counted, 10 MB record accepted by the broker: {big_accepted}, "
        f"RSS growth while consuming {growth_mb:.0f} MB"
    )
