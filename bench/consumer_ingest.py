"""Consumer ingest: turn spans in Tansu, read by the real ConsumerService (the durable-state runtime: routing, state
tables, changelog at each commit, completed conversations to the judge queue) against a bare kafka-python loop
reading the same records, rounds alternating, with the stages between them: the bare loop that also parses each
record's protobuf (the floor of any consumer that reads spans), and the bare loop that also turns each record into
conversation events (`read_events`). Three inputs, one record per turn (a turn span; the last turn's record also
holds the end marker), as a live app exports them:

- conversation-keyed: records keyed by conversation id (our exporter), so every event is applied where it is read;
- trace-keyed: one trace per turn, records keyed by trace id (the OTel Collector's Kafka exporter), so most events
  take the repartition hop to their conversation's owner;
- a Collector firehose: trace-keyed too, and 9 of 10 records are an application's HTTP or database span (nothing
  for a conversation), as the Collector forwards every span of every trace.

`read_events` per record is also timed alone (CPU µs, best of rounds) on the bench's turn record, on a firehose
record and on a Collector batch of both kinds, beside the protobuf parse of the same bytes.

The tracejudge figure runs from its first record to the barrier: `tracejudge_conversations_completed_total` reaching
the number of conversations (role `assemble`), or every conversation's outcome (`tracejudge_sessions_total`, sampled
out) for role `all` with sample rate 0. It includes what completion waits for: trace-keyed end markers wait
`end_grace` (set to END_GRACE_S here) and the other partitions' routed watermarks (broadcast every 0.5 s)."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kafka import KafkaConsumer, KafkaProducer
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from bench._stats import Figure, alternate
from tracejudge.consumer._gc import collect_less
from tracejudge.consumer.conversation.reading import read_events
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.service import ConsumerService
from tracejudge.consumer.settings import Settings

TURNS_PER_CONVERSATION = 3
PARTITIONS = 3
END_GRACE_S = 0.5
MAX_RECORD_BYTES = Settings.model_fields["max_record_bytes"].default
KEYINGS = ("conversation", "trace", "firehose")
FIREHOSE_OTHERS = 9  # non-GenAI records per turn record in the firehose
FIREHOSE_SHARE = 5  # the firehose has 1/5 of the conversations (and 10 records a turn)
BARE = "bare kafka-python loop"
PARSE = "bare loop + protobuf parse only"
DECODE = "bare loop + read_events"
ASSEMBLE = "tracejudge consume --role assemble"
ALL = "tracejudge consume --role all (sample rate 0)"
# The same runs as ALL, clocked at the last input record read and routed (`tracejudge_records_total`): ALL less the
# completion tail (end markers waiting `end_grace` and the routed watermarks, the sampled-out outcomes' round trip),
# which a finite input pays once and a live stream never waits for.
ALL_READ = "same runs, to the last record read and routed"
# ALL with `--producer-client librdkafka`: the internal topics written by librdkafka (if confluent-kafka is here).
ALL_RDK = "consume --role all, librdkafka producer"
ALL_RDK_READ = "same runs (librdkafka producer), to the last record read"


def turn_batch(tracer: Any, cid: str, t: int) -> list[Any]:
    """One turn span (a root span: its own trace, as one turn per trace is with the Collector); the last turn's
    batch also holds the end marker."""
    span = tracer.start_span(
        "invoke_agent bench",
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "bench",
            "gen_ai.conversation.id": cid,
            "tracejudge.turn.index": t,
            "gen_ai.input.messages": json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": f"question {t} of {cid} " * 5}]}]
            ),
            "gen_ai.output.messages": json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": "an answer " * 20}]}]
            ),
        },
    )
    span.end()
    batch = [span]
    if t == TURNS_PER_CONVERSATION - 1:
        marker = tracer.start_span(
            "end_conversation",
            attributes={"gen_ai.conversation.id": cid, "tracejudge.conversation.ended": True},
        )
        marker.end()
        batch.append(marker)
    return batch


def other_span(tracer: Any, i: int) -> Any:
    """An application's own span, as the Collector forwards it: an HTTP client call or a database query."""
    if i % 2:
        attributes: dict[str, Any] = {
            "http.request.method": "GET",
            "url.full": f"http://orders.internal:8080/api/orders/{i}?expand=items",
            "http.response.status_code": 200,
            "server.address": "orders.internal",
            "server.port": 8080,
            "network.protocol.version": "1.1",
            "user_agent.original": "python-httpx/0.27.0",
        }
        name = "GET /api/orders/{id}"
    else:
        attributes = {
            "db.system.name": "postgresql",
            "db.namespace": "shop",
            "db.operation.name": "SELECT",
            "db.query.text": "SELECT id, status, total FROM orders WHERE customer_id = $1 ORDER BY created_at DESC",
            "server.address": "db.internal",
            "server.port": 5432,
        }
        name = "SELECT shop.orders"
    span = tracer.start_span(name, attributes=attributes)
    span.end()
    return span


def produce(bootstrap: str, topic: str, conversations: int, keyed_by: str) -> int:
    """One record per turn (and, for the firehose, FIREHOSE_OTHERS non-GenAI records per turn); returns the number
    of records."""
    return send_all(bootstrap, topic, build(conversations, keyed_by))


def build(conversations: int, keyed_by: str) -> list[tuple[bytes, bytes]]:
    """The records `produce` sends, (key, value) in order, built ahead (the SDK's spans cost more than a send)."""
    tracer = TracerProvider().get_tracer("bench")
    records: list[tuple[bytes, bytes]] = []
    for c in range(conversations):
        cid = f"bench-{keyed_by}-{c}"
        for t in range(TURNS_PER_CONVERSATION):
            batch = turn_batch(tracer, cid, t)
            trace_key = f"{batch[0].get_span_context().trace_id:032x}".encode()
            key = cid.encode() if keyed_by == "conversation" else trace_key
            records.append((key, encode_spans(batch).SerializeToString()))
            if keyed_by == "firehose":
                base = len(records)
                for i in range(FIREHOSE_OTHERS):
                    other = other_span(tracer, base + i)
                    other_key = f"{other.get_span_context().trace_id:032x}".encode()
                    records.append((other_key, encode_spans([other]).SerializeToString()))
    return records


def send_all(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> int:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20, max_request_size=1 << 24)
    for key, value in records:
        producer.send(topic, key=key, value=value)
    producer.flush()
    producer.close()
    return len(records)


def per_record_us(rounds: int, calls: int = 5_000) -> dict[str, dict[str, float]]:
    """CPU µs per record, best of `rounds`: the protobuf parse and `read_events` of the bench's turn record (the
    middle turn: no end marker), of a firehose record (an HTTP span) and of the turn batched with nine HTTP and
    database spans of other traces."""
    tracer = TracerProvider().get_tracer("bench")
    turn = turn_batch(tracer, "bench-conversation-0", 1)
    values = {
        "turn record": encode_spans(turn).SerializeToString(),
        "firehose record (HTTP span)": encode_spans([other_span(tracer, 1)]).SerializeToString(),
        # The Collector without per-trace partitioning: one record holds a batch of many traces' spans.
        "Collector batch (the turn and 9 HTTP/DB spans of other traces)": encode_spans(
            turn + [other_span(tracer, i) for i in range(FIREHOSE_OTHERS)]
        ).SerializeToString(),
    }
    stages: dict[str, Callable[[bytes], Any]] = {
        "protobuf parse": ExportTraceServiceRequest.FromString,
        "read_events": lambda value: read_events(value, max_bytes=MAX_RECORD_BYTES),
    }
    out: dict[str, dict[str, float]] = {}
    for label, value in values.items():
        out[label] = {"bytes": len(value)}
        for stage, run in stages.items():
            best = float("inf")
            for _ in range(rounds):
                start = time.process_time()
                for _ in range(calls):
                    run(value)
                best = min(best, (time.process_time() - start) / calls * 1e6)
            out[label][stage] = best
    return out


def bare_loop(bootstrap: str, topic: str, records: int, *, stage: str | None = None) -> float:
    """The bare consumer loop; with a `stage`, it also parses every record's protobuf (PARSE) or turns every record
    into conversation events as the consumer does (DECODE: `read_events`)."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"bare-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        max_poll_records=500,
        # kafka-python sends no fetch to a broker while one is pending: a fetch of partitions read to their end is
        # held for fetch_max_wait_ms while the others' records wait, which put 0.5 s steps into the firehose's bare
        # loop (0.9-2.9 s for the same records); the loop is the client's best, so it waits 50 ms at most.
        fetch_max_wait_ms=50,
    )
    seen, first = 0, None
    while seen < records:
        for batch in consumer.poll(timeout_ms=200, max_records=500).values():
            if first is None:
                first = time.perf_counter()
            seen += len(batch)
            if stage == PARSE:
                for record in batch:
                    ExportTraceServiceRequest.FromString(record.value)
            elif stage == DECODE:
                for record in batch:
                    read_events(record.value, max_bytes=MAX_RECORD_BYTES)
    elapsed = time.perf_counter() - (first or time.perf_counter())
    consumer.close()
    return elapsed


def _total(metric: Any, **labels: str) -> float:
    """One metric's samples summed (its own collect(): cheap, unlike the whole registry's)."""
    return sum(
        sample.value
        for family in metric.collect()
        for sample in family.samples
        if sample.name.endswith("_total") and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def tracejudge_consumer(
    bootstrap: str,
    topic: str,
    conversations: int,
    role: str,
    timeout_s: float = 600,
    *,
    reads: tuple[int, list[float]] | None = None,
    producer_client: str = "kafka-python",
) -> float:
    """Seconds from the first record to the barrier; `reads` (records, times): the time at which that many input
    records were read and routed is appended to times."""
    settings = Settings.from_options(
        bootstrap_servers=bootstrap,
        topic=topic,
        group_id=f"tj-{uuid.uuid4().hex[:6]}",
        start_from="earliest",
        role=role,
        sample_rate=0.0,
        session_idle_timeout=600,
        end_grace=END_GRACE_S,
        kafka_config={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
        producer_client=producer_client,
    )
    service = ConsumerService(settings, [], ConsumerInstruments(CollectorRegistry()))
    thread = threading.Thread(target=service.run, name="bench-consumer", daemon=True)
    thread.start()
    records = service.prometheus.records
    if role == "all":
        done: Callable[[], float] = lambda: _total(service.prometheus.conversations, outcome="sampled_out")  # noqa: E731
    else:
        done = lambda: _total(service.instruments.completed)  # noqa: E731
    first = read = None
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if first is None and _total(records):
                first = time.perf_counter()
            if first is not None and reads is not None and read is None and _total(records) >= reads[0]:
                read = time.perf_counter() - first
            if first is not None and done() >= conversations:
                break
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"{role}: {done():.0f} of {conversations} conversations done by the deadline")
            # Fine-grained until the first record (the clock starts there), then every 25 ms: each look collects a
            # metric under the GIL, and at 5 ms the harness took a fifth of the stream thread's GIL time.
            time.sleep(0.005 if first is None else 0.025)
        elapsed = time.perf_counter() - first
        if reads is not None:
            reads[1].append(elapsed if read is None else read)
        return elapsed
    finally:
        service.request_stop()
        thread.join(60)


def run(conversations: int = 20_000, rounds: int = 5, with_assemble: bool = False) -> dict[str, Any]:
    collect_less()  # the collector's policy of `tracejudge consume` (consumer/_gc.py), for every variant alike
    out: dict[str, Any] = {
        "conversations": conversations,
        "turns_per_conversation": TURNS_PER_CONVERSATION,
        "partitions": PARTITIONS,
        "end_grace_s": END_GRACE_S,
        "per_record_us": per_record_us(rounds),
        "inputs": {},
    }
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        for keyed_by in KEYINGS:
            count = conversations // FIREHOSE_SHARE if keyed_by == "firehose" else conversations
            topic = f"ingest-{keyed_by}-{uuid.uuid4().hex[:6]}"
            broker.create_topic(topic, PARTITIONS)
            records = produce(bootstrap, topic, count, keyed_by)
            variants: dict[str, Callable[[], float]] = {
                BARE: lambda t=topic, n=records: bare_loop(bootstrap, t, n),  # type: ignore[misc]
                PARSE: lambda t=topic, n=records: bare_loop(bootstrap, t, n, stage=PARSE),  # type: ignore[misc]
                DECODE: lambda t=topic, n=records: bare_loop(bootstrap, t, n, stage=DECODE),  # type: ignore[misc]
            }
            if with_assemble:
                variants[ASSEMBLE] = lambda t=topic, c=count: tracejudge_consumer(bootstrap, t, c, "assemble")  # type: ignore[misc]
            read_times: list[float] = []
            variants[ALL] = lambda t=topic, c=count, n=records, r=read_times: tracejudge_consumer(  # type: ignore[misc]
                bootstrap, t, c, "all", reads=(n, r)
            )
            rdk_read_times: list[float] = []
            if importlib.util.find_spec("confluent_kafka") is not None:
                variants[ALL_RDK] = lambda t=topic, c=count, n=records, r=rdk_read_times: tracejudge_consumer(  # type: ignore[misc]
                    bootstrap, t, c, "all", reads=(n, r), producer_client="librdkafka"
                )
            figures = alternate(variants, rounds)
            figures[ALL_READ] = Figure(ALL_READ, read_times, "s")
            if rdk_read_times:
                figures[ALL_RDK_READ] = Figure(ALL_RDK_READ, rdk_read_times, "s")
            bare = figures[BARE].median
            spans = records + count  # the records' spans and the end markers
            out["inputs"][keyed_by] = {
                "conversations": count,
                "records": records,
                "spans": spans,
                "figures": {name: f.as_dict() for name, f in figures.items()},
                "records_per_s": {name: records / f.median for name, f in figures.items()},
                "spans_per_s": {name: spans / f.median for name, f in figures.items()},
                "vs_bare": {name: bare / f.median for name, f in figures.items()},
                "vs_decode": {name: figures[DECODE].median / f.median for name, f in figures.items()},
            }
    goals = {  # issue 31
        "conversation": 0.5,
        "trace": 0.3,
        "firehose": 0.7,
    }
    out["goal"] = (
        "consume --role all vs the bare loop: conversation-keyed >= 0.5x, trace-keyed >= 0.3x, firehose >= 0.7x; "
        "read_events <= 15 us per turn record"
    )
    out["goal_met"] = {
        **{keyed_by: out["inputs"][keyed_by]["vs_bare"][ALL] >= goal for keyed_by, goal in goals.items()},
        "read_events": out["per_record_us"]["turn record"]["read_events"] <= 15,
    }
    return out


if __name__ == "__main__":
    print(json.dumps(run(conversations=2_000, rounds=1), indent=2))
