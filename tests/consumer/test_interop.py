"""Spans recorded from the real instrumentation libraries reach the judge as the conversation the user really had.

Every fixture under tests/fixtures/interop/<setup>/ (records.jsonl: what KafkaSpanExporter wrote; expected.json: the
conversation) is produced, as recorded and all fixtures at once, to one Tansu topic read by ONE real consumer; the
transcript the local judge server receives over HTTP must equal the expected turns exactly. Each judgement belongs to
its fixture by conversation id (every fixture has its own), each judge request to its judgement by a token in the
scripted reason; a request or judgement no fixture names is a stray, and the whole-replay test counts it.

The Collector route: the same records re-cut as the OpenTelemetry Collector's Kafka exporter writes them
(`partition_traces_by_id`: one OTLP request per trace, keyed by the trace id in hex), all fixtures at once into a
3-partition topic read by 3 replicas; each judge request is tied to its judgement by a token in the scripted reason.
"""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from tests.consumer.test_interop_frameworks import STATE_MARKERS, fake_server
from tests.consumer.test_pipeline import Collect
from tests.support.judge_server import JudgeServer, Reply, conversation_text, verdict
from tests.support.pipeline import RunningConsumer, consumer_settings, wait_for
from tracejudge.consumer.decode import _any_value
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.kafka.topics import InternalTopics
from tracejudge.metrics.transcript import END, START
from tracejudge.tracer import KafkaSpanExporter

FIXTURES_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "interop"
SETUPS = (
    sorted(p.name for p in FIXTURES_DIR.iterdir() if (p / "expected.json").is_file()) if FIXTURES_DIR.is_dir() else []
)
IDLE_S = 1.0
ALL = "*"
# What must never reach the judge: API bodies and wrapped-argument JSON.
BODY_MARKERS = ('"choices"', "chatcmpl-", '"messages"', '"args"', '"kwargs"', '"output_text"', '"role"', '"usage"')
FAKE = fake_server()  # the scripted tool results and system prompt


def expected(setup: str) -> dict[str, Any]:
    return json.loads((FIXTURES_DIR / setup / "expected.json").read_text())


def records(setup: str) -> list[tuple[bytes | None, bytes]]:
    lines = (FIXTURES_DIR / setup / "records.jsonl").read_text().splitlines()
    out = []
    for line in lines:
        record = json.loads(line)
        key = record.get("key")
        out.append((key.encode() if key is not None else None, base64.b64decode(record["value_b64"])))
    return out


def transcript(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The turns between the conversation markers of a judge request's user message."""
    text = conversation_text(request)
    assert text.count(START) == 1 and text.count(END) == 1, text
    return json.loads(text.split(START, 1)[1].split(END, 1)[0])


@dataclass
class Replay:
    judgements: list = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    shares: list[int] = field(default_factory=list)  # judgements per replica


@pytest.fixture(scope="module")
def judge() -> Iterator[JudgeServer]:
    server = JudgeServer(default=verdict("honest_fallback")).start()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENAI_BASE_URL", server.base_url)
        patch.setenv("OPENAI_API_BASE", server.base_url)
        patch.setenv("OPENAI_API_KEY", "sk-test-local")
        yield server
    server.stop()


@pytest.fixture(scope="module")
def replayed(broker: EmbeddedBroker, judge: JudgeServer) -> dict[str, Replay]:
    """Every fixture as recorded, all at once, through one broker and one consumer."""
    if not SETUPS:
        pytest.skip("no interop fixtures recorded")
    topic = f"interop-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, partitions=3)
    settings = consumer_settings(broker.bootstrap_servers, topic, metrics="failure_rate", session_idle_timeout=IDLE_S)
    recorded = [(key, value) for setup in SETUPS for key, value in records(setup)]
    return replay(broker, judge, topic, settings, 1, recorded)


def test_one_judgement_per_fixture_in_all(replayed: dict[str, Replay]) -> None:
    strays = replayed[ALL]
    assert not strays.judgements, [(j.job.conversation_id, len(j.job.exchanges)) for j in strays.judgements]
    assert not strays.requests, [transcript(r) for r in strays.requests]
    silent = [s for s in SETUPS if expected(s).get("content_on_spans") is False]
    assert sum(len(replayed[s].judgements) for s in SETUPS) == len(SETUPS)
    assert sum(len(replayed[s].requests) for s in SETUPS) == len(SETUPS) - len(silent)


@pytest.mark.parametrize("setup", SETUPS)
def test_the_judge_receives_the_real_conversation(replayed: dict[str, Replay], setup: str) -> None:
    assert_the_real_conversation(setup, replayed[setup])


def assert_the_real_conversation(setup: str, replay: Replay) -> None:
    """The judgement and the judge request a fixture produced: the expected conversation, exactly."""
    want = expected(setup)
    assert len(replay.judgements) == 1, [(len(j.job.exchanges), j.job.completed_by) for j in replay.judgements]
    judgement = replay.judgements[0]
    job = judgement.job
    assert job.conversation_id == want["conversation_id"]
    assert job.agent == want["agent"]
    assert job.version == len(want["turns"]) == len(job.exchanges)
    if want.get("content_on_spans") is False:
        # The library kept the text off the spans: the turns are counted, no judge is asked, no score is made up.
        assert judgement.outcome == "failed" and not replay.requests
        assert [r.error_kind for r in judgement.results] == ["empty_conversation"]
        return
    assert judgement.outcome == "judged"
    assert len(replay.requests) == 1
    turns = transcript(replay.requests[0])
    assert [(t["user"], t["assistant"]) for t in turns] == [(t["user"], t["assistant"]) for t in want["turns"]]
    assert [t["turn"] for t in turns] == list(range(1, len(want["turns"]) + 1))
    sent = conversation_text(replay.requests[0])
    assert not [marker for marker in BODY_MARKERS if marker in sent.split(START, 1)[1].replace('\\"', '"')]
    # Agent frameworks: no framework state, no tool output as an answer, no system prompt as a user turn.
    said = sent.split(START, 1)[1]
    assert not [marker for marker in STATE_MARKERS if marker in said]
    assert not [result for result in FAKE.TOOL_RESULTS.values() for t in turns if result in t["assistant"]]
    assert not [t for t in turns if FAKE.SYSTEM_PROMPT in t["user"]]


def readable_spans(value: bytes) -> list[ReadableSpan]:
    """The spans of a recorded OTLP record as the SDK hands them to an exporter, to export them again."""
    request = ExportTraceServiceRequest.FromString(value)
    spans = []
    for resource_spans in request.resource_spans:
        resource = Resource({kv.key: _any_value(kv.value) for kv in resource_spans.resource.attributes})
        for scope_spans in resource_spans.scope_spans:
            scope = InstrumentationScope(scope_spans.scope.name, scope_spans.scope.version or None)
            for span in scope_spans.spans:
                trace_id = int.from_bytes(span.trace_id, "big")
                context = SpanContext(trace_id, int.from_bytes(span.span_id, "big"), False, TraceFlags(1))
                parent = (
                    SpanContext(trace_id, int.from_bytes(span.parent_span_id, "big"), False, TraceFlags(1))
                    if span.parent_span_id
                    else None
                )
                spans.append(
                    ReadableSpan(
                        name=span.name,
                        context=context,
                        parent=parent,
                        resource=resource,
                        attributes={kv.key: _any_value(kv.value) for kv in span.attributes},
                        events=[
                            Event(e.name, {kv.key: _any_value(kv.value) for kv in e.attributes}, e.time_unix_nano)
                            for e in span.events
                        ],
                        kind=SpanKind(max(0, span.kind - 1)),
                        status=Status(StatusCode.ERROR if span.status.code == 2 else StatusCode.UNSET),
                        start_time=span.start_time_unix_nano,
                        end_time=span.end_time_unix_nano,
                        instrumentation_scope=scope,
                    )
                )
    return spans


def test_two_replicas_judge_each_exported_conversation_once_whole(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    """KafkaSpanExporter keys every recorded conversation to one partition: two replicas never split one."""
    if not SETUPS:
        pytest.skip("no interop fixtures recorded")
    first, second = Collect(), Collect()
    group = f"interop-{uuid.uuid4().hex[:6]}"
    settings = consumer_settings(
        broker.bootstrap_servers, topic, group_id=group, metrics="failure_rate", session_idle_timeout=IDLE_S
    )
    exporter = KafkaSpanExporter(broker.bootstrap_servers, topic)
    with RunningConsumer(settings, extra_sinks=[first]) as a, RunningConsumer(settings, extra_sinks=[second]) as b:
        wait_for(lambda: a.app.service.assigned.is_set() and b.app.service.assigned.is_set(), what="service ready")
        wait_for(
            lambda: all(
                s.assembler.group.assignment() and s.judge_worker.consumer.assignment()  # type: ignore[union-attr]
                for s in (a.app.service, b.app.service)
            ),
            what="both members assigned, in both groups",
        )
        for setup in SETUPS:
            for _, value in records(setup):  # each record the library's batch, exported again by our exporter
                assert exporter.export(readable_spans(value)).name == "SUCCESS"
        wait_for(lambda: len(first.judgements) + len(second.judgements) >= len(SETUPS), what="every fixture judged")
        ids = [expected(setup)["conversation_id"] for setup in SETUPS]

        def settled() -> bool:
            """Every conversation completed, its outcome back at its owner; a split would show as an open remainder
            or as a second snapshot (two content ids)."""
            states = [a.app.service.conversation(c) or b.app.service.conversation(c) for c in ids]
            return a.app.service.open_conversations() == b.app.service.open_conversations() == 0 and all(
                s is not None and s.dispatched and None not in s.dispatched.values() for s in states
            )

        wait_for(settled, timeout=120, what="every conversation completed and its verdict acknowledged")
        for cid in ids:
            state = a.app.service.conversation(cid) or b.app.service.conversation(cid)
            assert len(state.dispatched) == 1, (cid, state.dispatched)
    exporter.shutdown()
    judged = {j.job.conversation_id: j.job for j in first.judgements + second.judgements}
    assert len(first.judgements) + len(second.judgements) == len(SETUPS) == len(judged)
    assert first.judgements and second.judgements  # both replicas took a share: a split would have shown
    for setup in SETUPS:
        want = expected(setup)
        job = judged[want["conversation_id"]]
        assert job.version == len(job.exchanges) == len(want["turns"])
        if want.get("content_on_spans") is not False:
            assert [(t.input, t.output) for t in job.exchanges] == [(t["user"], t["assistant"]) for t in want["turns"]]


# -- the Collector route ------------------------------------------------------------------------------------------

REPLICAS = 3
# Longer than the 1 s above: a partition counts as caught up by the high watermark of its last fetch, so its clock
# can run ahead of records still in the broker by a fetch round trip (seconds on a loaded machine); conversations
# without an end marker complete by idle, and those with one by the default --end-grace (2 s).
COLLECTOR_IDLE_S = 8.0


def collector_records(value: bytes) -> list[tuple[bytes, bytes]]:
    """One recorded batch as the Collector's Kafka exporter writes it with `partition_traces_by_id`: one
    ExportTraceServiceRequest per trace (resource and scope kept), keyed by the trace id in lowercase hex."""
    request = ExportTraceServiceRequest.FromString(value)
    per_trace: dict[bytes, ExportTraceServiceRequest] = {}
    slots: dict[tuple[bytes, int, int | None], Any] = {}  # (trace, resource index, scope index) → its message
    for r, resource_spans in enumerate(request.resource_spans):
        for s, scope_spans in enumerate(resource_spans.scope_spans):
            for span in scope_spans.spans:
                out = per_trace.setdefault(span.trace_id, ExportTraceServiceRequest())
                if (span.trace_id, r, None) not in slots:
                    target = out.resource_spans.add()
                    target.resource.CopyFrom(resource_spans.resource)
                    target.schema_url = resource_spans.schema_url
                    slots[(span.trace_id, r, None)] = target
                if (span.trace_id, r, s) not in slots:
                    scope = slots[(span.trace_id, r, None)].scope_spans.add()
                    scope.scope.CopyFrom(scope_spans.scope)
                    scope.schema_url = scope_spans.schema_url
                    slots[(span.trace_id, r, s)] = scope
                slots[(span.trace_id, r, s)].spans.add().CopyFrom(span)
    return [(trace_id.hex().encode(), out.SerializeToString()) for trace_id, out in per_trace.items()]


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    reader = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        ends = reader.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        reader.close()


@pytest.fixture(scope="module")
def collector_replayed(broker: EmbeddedBroker, judge: JudgeServer) -> dict[str, Replay]:
    """Every fixture re-cut per trace, all at once, through 3 replicas of one group."""
    if not SETUPS:
        pytest.skip("no interop fixtures recorded")
    topic = f"interop-collector-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, partitions=3)
    group = f"interop-collector-{uuid.uuid4().hex[:6]}"
    settings = consumer_settings(
        broker.bootstrap_servers, topic, group_id=group, metrics="failure_rate", session_idle_timeout=COLLECTOR_IDLE_S
    )
    cuts = [cut for setup in SETUPS for _, value in records(setup) for cut in collector_records(value)]
    return replay(broker, judge, topic, settings, REPLICAS, cuts)


def replay(
    broker: EmbeddedBroker,
    judge: JudgeServer,
    topic: str,
    settings: Any,
    replicas: int,
    messages: list[tuple[bytes | None, bytes]],
) -> dict[str, Replay]:
    """`messages` through `replicas` consumers of one group, once every replica owns input partitions; returns each
    fixture's judgements and judge requests (by conversation id and reason token), the rest under ALL."""
    asked: dict[str, dict[str, Any]] = {}  # token in the verdict's reason → the judge request that answered it

    def tagged(request: dict[str, Any]) -> Reply:
        token = f"request-{uuid.uuid4().hex}"
        asked[token] = request
        return verdict("honest_fallback", reason=token)

    judge.responder = tagged
    collects = [Collect() for _ in range(replicas)]
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=5)
    ids = {expected(setup)["conversation_id"]: setup for setup in SETUPS}
    try:
        with contextlib.ExitStack() as stack:
            consumers = [stack.enter_context(RunningConsumer(settings, extra_sinks=[c])) for c in collects]
            services = [r.app.service for r in consumers]
            wait_for(lambda: all(s.assigned.is_set() for s in services), what="replicas ready")
            wait_for(
                lambda: all(s.assembler.group.assignment() for s in services),  # type: ignore[union-attr]
                what="every replica assigned input partitions",
            )
            for key, value in messages:
                producer.send(topic, key=key, value=value)
            producer.flush()
            inputs = end_offsets(broker.bootstrap_servers, topic, 3)

            def tasks() -> dict[int, Any]:
                return {p: t for s in services for p, t in list(s.assembler.tasks.items())}  # type: ignore[union-attr]

            def read_and_committed() -> bool:
                owned = tasks()
                return len(owned) == 3 and all((owned[p].committed_input or 0) >= inputs[p] for p in range(3))

            wait_for(read_and_committed, timeout=120, what="every input record read and committed (routed)")
            routed = end_offsets(broker.bootstrap_servers, InternalTopics(settings.group_id).repartition, 3)

            def settled() -> bool:
                """Every routed event applied, every conversation completed and its verdict acknowledged."""
                owned = tasks()
                states = [next((x for x in (s.conversation(c) for s in services) if x is not None), None) for c in ids]
                return (
                    all(owned[p].repartition_position >= routed[p] for p in range(3))
                    and sum(s.open_conversations() for s in services) == 0
                    and all(s is not None and s.dispatched and None not in s.dispatched.values() for s in states)
                )

            wait_for(settled, timeout=120, what="every conversation completed and its verdict acknowledged")
            # What was judged by the barrier. The replicas' stop that follows (three at once, partitions moving
            # between members that are leaving) is not what these tests check: under CI load it was seen to judge
            # up to ten conversations again whose judge-queue offsets a leaving member had not committed
            # (at-least-once); tests/reliability/test_restarts.py checks graceful stops.
            judged = [list(c.judgements) for c in collects]
            shares = [len(j) for j in judged]
    finally:
        judge.responder = None
        producer.close()
    results = {setup: Replay() for setup in SETUPS}
    results[ALL] = Replay()
    seen: set[tuple[str, float]] = set()
    for judgement in (j for replica in judged for j in replica):
        # Two copies with one judge-queue key and one judged_at count once (seen once under CI load, for ten
        # conversations at once, not explained yet); a second judging with its own judged_at counts.
        if (judgement.job.key, judgement.judged_at) in seen:
            continue
        seen.add((judgement.job.key, judgement.judged_at))
        replay = results[ids.get(judgement.job.conversation_id, ALL)]
        replay.judgements.append(judgement)
        replay.requests.extend(asked.pop(r.reason) for r in judgement.results if r.reason in asked)
    results[ALL].requests.extend(asked.values())  # asked, but no judgement names them
    results[ALL].shares = shares
    return results


def test_the_collector_route_judges_each_conversation_once_across_replicas(
    collector_replayed: dict[str, Replay],
) -> None:
    strays = collector_replayed[ALL]
    assert not strays.judgements, [(j.job.conversation_id, len(j.job.exchanges)) for j in strays.judgements]
    assert not strays.requests, [transcript(r) for r in strays.requests]
    shares = strays.shares
    assert sum(shares) == len(SETUPS) and sum(1 for n in shares if n) >= 2, shares  # the replicas shared the work


@pytest.mark.parametrize("setup", SETUPS)
def test_the_collector_route_reaches_the_judge_as_the_real_conversation(
    collector_replayed: dict[str, Replay], setup: str
) -> None:
    assert_the_real_conversation(setup, collector_replayed[setup])
