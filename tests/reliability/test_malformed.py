"""Malformed input: fuzzed bytes and protobufs never crash decoding; 10,000 hostile records through the consumer are
all counted, the valid conversations among them still assembled, and memory stays bounded."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaProducer
from kafka.consumer.fetcher import ConsumerRecord
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from tests.support.pipeline import RunningConsumer, consumer_settings, wait_for
from tracejudge.consumer.app import build_app
from tracejudge.consumer.conversation.table import ConversationState
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.judging.judgement import Judgement
from tracejudge.consumer.judging.results import result_record
from tracejudge.consumer.settings import Settings
from tracejudge.consumer.streams import records as R
from tracejudge.consumer.streams.assembler import Assembler
from tracejudge.consumer.streams.task import Task
from tracejudge.metrics import MetricResult

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


_INGEST: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def _ingest_closed() -> Iterator[None]:
    """The module's one ingest path (shared by the property tests) is opened and closed with the module: its
    producer's thread does not outlive the tests that used it."""
    ingest()
    yield
    assembler = _INGEST.pop("assembler", None)
    _INGEST.clear()
    if assembler is not None:
        assembler.collector.producer.close(timeout=5)


def ingest() -> tuple[Assembler, Task]:
    """The real stream-thread ingest path, not started: the service's metrics and sampler, an Assembler over one
    partition (every event is applied locally: no repartition hop) and its task's ConversationTable. Its producer
    is real but has no broker: the one thing a record can make it send (a feedback event for the judge worker)
    fails at once and is counted, as it would be with the brokers down."""
    if "assembler" not in _INGEST:
        settings_ = Settings.from_options(
            bootstrap_servers="127.0.0.1:9",
            topic="fuzz",
            metrics="failure_rate",
            max_turns_per_conversation=5,
            no_results=True,  # no broker: the default results topic's writer would connect at build
        )
        service = build_app(settings_, registry=CollectorRegistry(), serve_metrics=False).service
        assembler = Assembler(
            settings_, service.prometheus, service.instruments, service.sampler.should_judge, partitions=1
        )
        assembler.collector.producer = KafkaProducer(
            bootstrap_servers="127.0.0.1:9", api_version=(3, 9), max_block_ms=0, reconnect_backoff_max_ms=60_000
        )
        task = Task(0, assembler.state.new_table(), restoring=False)
        assembler.tasks[0] = task
        _INGEST.update(assembler=assembler, task=task, offset=0)
    return _INGEST["assembler"], _INGEST["task"]


def counted(assembler: Assembler) -> float:
    records = assembler.prometheus.records
    return records.labels(outcome="ok")._value.get() + records.labels(outcome="malformed")._value.get()


def fold(value: bytes) -> None:
    """One record through the assembler's real ingest path; nothing may escape, and it is counted exactly once; what
    it completes is dispatched as the judge queue carries it and read back as the judge worker does, and gives a
    result record; its state survives the changelog's format."""
    assembler, task = ingest()
    _INGEST["offset"] += 1
    record = ConsumerRecord("fuzz", 0, -1, _INGEST["offset"], 0, 0, b"k", value, [], None, 1, len(value), 0)
    before = counted(assembler)
    assembler.processor.input(task, record)
    assert counted(assembler) == before + 1
    table = task.table
    now = int(time.time() * 1000)
    table.advance(now + 10**12)  # everything idle completes; what was judged before is forgotten (retention)
    for dispatch in table.take_dispatches():
        job = dispatch.job
        queued = R.loads(R.dumps(R.job_to_json(job, sampled=True, completed_ms=dispatch.completed_ms)))
        again, sampled, completed_ms = R.job_from_json(queued, key=job.key, partition=0)
        assert again == replace(job, partition=0, completed_ms=completed_ms) and sampled
        assert completed_ms == dispatch.completed_ms
        again.judgeable_exchanges  # noqa: B018
        result = MetricResult(name="failure_rate", threshold=0.5, model="m", score=1.0, verdict="honest_fallback")
        json.dumps(result_record(Judgement(again, "judged", [result]), result))
        table.verdict(job.conversation_id, job.content_id, "judged", now)
    changed, _removed = table.take_changes()
    for state in changed:  # the changelog record, written and restored
        assert ConversationState.from_json(R.loads(R.dumps(state.to_json()))) == state


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
        service = consumer.app.service
        assert consumer.value("tracejudge_records_total", outcome="malformed") >= 8_000 + (1 if big_accepted else 0)
        assert service.counts()["truncated_conversations"] >= 99  # the 100,000-turn conversation, in windows of 1,000
        assert service.assembler is not None
        kept = [state for task in list(service.assembler.tasks.values()) for state in list(task.table.states.values())]
        assert kept and all(len(state.spans) <= 1_000 for state in kept)
    growth_mb = current_rss_mb() - rss_before
    assert growth_mb < 800, f"memory grew by {growth_mb:.0f} MB"
    print(
        f"\nmalformed: {total} records counted, 10 MB record accepted by the broker: {big_accepted}, "
        f"RSS growth while consuming {growth_mb:.0f} MB"
    )


def otlp_json_turn(conversation: str, index: int, *, ended: bool = False, start_ns: Any = 1_700_000_000_000_000_000):
    """A valid OTLP/JSON export of one turn (and the end marker): the template every hostile record mutates."""

    def attr(key: str, value: dict) -> dict:
        return {"key": key, "value": value}

    attributes = [
        attr("gen_ai.conversation.id", {"stringValue": conversation}),
        attr("gen_ai.agent.name", {"stringValue": "poison"}),
        attr("gen_ai.operation.name", {"stringValue": "invoke_agent"}),
        attr("tracejudge.turn.index", {"intValue": str(index)}),
        attr(
            "gen_ai.input.messages",
            {"stringValue": json.dumps([{"role": "user", "parts": [{"type": "text", "content": f"q{index}"}]}])},
        ),
        attr(
            "gen_ai.output.messages",
            {"stringValue": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "a"}]}])},
        ),
    ]
    spans = [
        {
            "traceId": "5b8efff798038103d269b633813fc60c",
            "spanId": f"{index + 1:016x}",
            "name": "invoke_agent poison",
            "kind": 1,
            "startTimeUnixNano": start_ns,
            "endTimeUnixNano": start_ns,
            "attributes": attributes,
            "status": {"code": 0},
        }
    ]
    if ended:
        spans.append(
            {
                "traceId": "5b8efff798038103d269b633813fc60d",
                "spanId": "00000000000000ff",
                "name": "end_conversation",
                "startTimeUnixNano": start_ns,
                "endTimeUnixNano": start_ns,
                "attributes": [
                    attr("gen_ai.conversation.id", {"stringValue": conversation}),
                    attr("tracejudge.conversation.ended", {"boolValue": True}),
                ],
            }
        )
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [attr("service.name", {"stringValue": "poison-app"})]},
                "scopeSpans": [{"scope": {"name": "fuzz"}, "spans": spans}],
            }
        ]
    }


DEEP = 5_000


def deep_list(depth: int = DEEP) -> str:
    return "[" * depth + "]" * depth


def deep_dict(depth: int = DEEP) -> str:
    return '{"a":' * depth + "1" + "}" * depth


HOSTILE_VALUES: list[tuple[str, str]] = [
    ("null", "null"),
    ("true", "true"),
    ("zero", "0"),
    ("negative", "-1"),
    ("huge int", "1" + "0" * 400),
    ("too many digits", "9" * 5_000),
    ("huge float", "1e308"),
    ("overflowing float", "1e999"),
    ("NaN", "NaN"),
    ("Infinity", "Infinity"),
    ("-Infinity", "-Infinity"),
    ("empty string", '""'),
    ("oversized string", json.dumps("x" * 200_000)),
    ("lone surrogate", '"\\ud800"'),
    ("not hex", '"zz-not-hex-or-base64!"'),
    ("empty list", "[]"),
    ("empty object", "{}"),
    ("list of junk", '[1, "a", null, [], {}]'),
    ("deep list", deep_list()),
    ("deep object", deep_dict()),
]


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
    found = [path]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*path, index))
    return found


def _replace(node: Any, path: tuple, marker: str) -> Any:
    if not path:
        return marker
    copy = dict(node) if isinstance(node, dict) else list(node)
    copy[path[0]] = _replace(node[path[0]], path[1:], marker)
    return copy


def hostile_records() -> list[tuple[str, bytes]]:
    """Every node of a valid OTLP/JSON turn export (every level: the root, resourceSpans, a span, an attribute, a
    value, a timestamp) replaced by every hostile value; plus the issue's {"resourceSpans": [[[[…]]]]}."""
    template = otlp_json_turn("template", 0)
    marker = "\u0000HOSTILE\u0000"
    encoded_marker = json.dumps(marker)
    records = [
        ("resourceSpans nested thousands deep", ('{"resourceSpans": ' + deep_list(2_500) + "}").encode()),
        (
            "spans nested thousands deep",
            json.dumps(template)
            .replace('"spans": [', '"spans": ' + "[" * 3000 + "[", 1)
            .replace("}]}]}", "}]" + "]" * 3000 + "}]}", 1)
            .encode(),
        ),
    ]
    for path in _paths(template):
        text = json.dumps(_replace(template, path, marker))
        for label, value in HOSTILE_VALUES:
            records.append(
                (f"{'/'.join(map(str, path)) or 'root'} = {label}", text.replace(encoded_marker, value).encode())
            )
    return records


def test_hostile_records_through_the_ingest_path() -> None:
    """Each hostile record, one by one, through the service's ingest entry point: counted once, nothing escapes."""
    records = hostile_records()
    assembler, _task = ingest()
    malformed_records = assembler.prometheus.records.labels(outcome="malformed")
    malformed_before = malformed_records._value.get()
    for _label, value in records:
        fold(value)
    malformed = malformed_records._value.get() - malformed_before
    assert len(records) > 900 and malformed > 200
    fold(records[0][1])
    assert malformed_records._value.get() - malformed_before == malformed + 1


def test_poison_records_never_stop_the_consumer(broker: EmbeddedBroker, topic: str, judge_server) -> None:
    """The hostile records go through Kafka into the running consumer, then valid conversations (one with a
    startTimeUnixNano far past year 9999): the consumer stays alive, counts every record once, dead-letters the
    malformed ones, and judges the valid conversations after them."""
    from tests.consumer.test_pipeline import scripted_judge
    from tests.support.pipeline import read_all

    judge_server.responder = scripted_judge
    records = hostile_records()
    valid = [
        json.dumps(otlp_json_turn("after-poison", 0, ended=True)).encode(),
        json.dumps(otlp_json_turn("far-future", 0, ended=True, start_ns=10**30)).encode(),
    ]
    dead_letter, results = f"{topic}-dlq", f"{topic}-results"
    broker.create_topic(dead_letter, 1)
    broker.create_topic(results, 1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=20, max_request_size=8 * 1024 * 1024)
    for _label, value in records:
        producer.send(topic, key=b"poison", value=value)
    for value in valid:
        producer.send(topic, key=b"poison", value=value)  # the same partition, after every poison record
    producer.flush()
    producer.close()
    settings_ = consumer_settings(
        broker.bootstrap_servers,
        topic,
        metrics="failure_rate",
        dead_letter_topic=dead_letter,
        results_topic=results,
        max_record_bytes=8 * 1024 * 1024,
        session_idle_timeout=2.0,  # the template's own conversation (no end marker) completes soon
    )
    total = len(records) + len(valid)
    with RunningConsumer(settings_) as consumer:

        def counted() -> float:
            return consumer.value("tracejudge_records_total", outcome="ok") + consumer.value(
                "tracejudge_records_total", outcome="malformed"
            )

        wait_for(lambda: counted() == total, timeout=120, what=f"all {total} records counted")

        def judged_ids() -> set[str]:
            return {json.loads(r.value)["conversation_id"] for r in read_all(broker.bootstrap_servers, results)}

        wait_for(
            lambda: judged_ids() >= {"after-poison", "far-future"},
            timeout=60,
            what="the valid conversations after them judged",
        )
        assert consumer.thread.is_alive()
        malformed = consumer.value("tracejudge_records_total", outcome="malformed")
        worker = consumer.app.service.judge_worker
        assert worker is not None
        wait_for(lambda: worker.offsets.held() == 0, what="every conversation finished")
    # Committed past: a restart of the same group reads none of them again (no crash loop on a poison record).
    with RunningConsumer(settings_) as restarted:
        wait_for(lambda: restarted.app.service.assigned.is_set(), timeout=120, what="the partitions assigned")
        assembler = restarted.app.service.assembler
        assert assembler is not None and assembler.group is not None
        kafka = assembler.group
        wait_for(lambda: len(kafka.assignment()) == 3, what="the partitions assigned")
        lag = restarted.app.registry.get_sample_value
        # Barrier: every partition's position at its high watermark (the lag gauge at 0), so anything re-read
        # would have been counted by now.
        wait_for(
            lambda: all(lag("tracejudge_consumer_lag", {"partition": str(p)}) == 0 for p in range(3)),
            timeout=120,
            what="every partition read to its end",
        )
        reread = restarted.value("tracejudge_records_total", outcome="ok") + restarted.value(
            "tracejudge_records_total", outcome="malformed"
        )
    assert reread == 0, f"{reread:.0f} records read again after a restart"
    # The hostile records that decode hold conversations of their own ('-1', 'inf', ...), judged too: read the
    # whole results topic, not its first two records.
    written = [json.loads(r.value) for r in read_all(broker.bootstrap_servers, results)]
    by_id = {r["conversation_id"]: r for r in written}
    assert set(by_id) >= {"after-poison", "far-future"}
    assert by_id["far-future"]["conversation_started_at"].startswith("9999-12-31")
    dead = read_all(broker.bootstrap_servers, dead_letter)
    assert len(dead) == malformed
    print(
        f"\npoison: {len(records)} hostile records, {malformed:.0f} malformed and dead-lettered, consumer alive, "
        f"{len(valid)} valid conversations after them judged"
    )
