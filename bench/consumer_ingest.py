"""Consumer ingest: turn spans in Tansu, read by the real ConsumerService (the durable-state runtime: routing, state
tables, changelog at each commit, completed conversations to the judge queue) against a bare kafka-python loop
reading the same records, rounds alternating. Two inputs, one record per turn (a turn span; the last turn's record
also holds the end marker), as a live app exports them:

- conversation-keyed: records keyed by conversation id (our exporter), so every event is applied where it is read;
- trace-keyed: one trace per turn, records keyed by trace id (the OTel Collector's Kafka exporter), so most events
  take the repartition hop to their conversation's owner.

The tracejudge figure runs from its first record to the barrier: `tracejudge_conversations_completed_total` reaching
the number of conversations (role `assemble`), or every conversation's outcome (`tracejudge_sessions_total`, sampled
out) for role `all` with sample rate 0. It includes what completion waits for: trace-keyed end markers wait
`end_grace` (set to END_GRACE_S here) and the other partitions' routed watermarks (broadcast every 0.5 s)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kafka import KafkaConsumer, KafkaProducer
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from bench._stats import alternate
from tracejudge.consumer.conversation.reading import read_events
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.service import ConsumerService
from tracejudge.consumer.settings import Settings

TURNS_PER_CONVERSATION = 3
PARTITIONS = 3
END_GRACE_S = 0.5
MAX_RECORD_BYTES = Settings.model_fields["max_record_bytes"].default
KEYINGS = ("conversation", "trace")
BARE = "bare kafka-python loop"
DECODE = "bare loop + OTLP decode (read_events)"
ASSEMBLE = "tracejudge consume --role assemble"
ALL = "tracejudge consume --role all (sample rate 0)"


def produce(bootstrap: str, topic: str, conversations: int, keyed_by: str) -> int:
    """One record per turn; returns the number of records."""
    tracer = TracerProvider().get_tracer("bench")
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20, max_request_size=1 << 24)
    records = 0
    for c in range(conversations):
        cid = f"bench-{keyed_by}-{c}"
        for t in range(TURNS_PER_CONVERSATION):
            span = tracer.start_span(  # a root span: its own trace, as one turn per trace is with the Collector
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
            key = cid.encode() if keyed_by == "conversation" else f"{span.get_span_context().trace_id:032x}".encode()
            producer.send(topic, key=key, value=encode_spans(batch).SerializeToString())
            records += 1
    producer.flush()
    producer.close()
    return records


def bare_loop(bootstrap: str, topic: str, records: int, *, decode: bool = False) -> float:
    """The bare consumer loop; with `decode`, it also turns every record into conversation events as the consumer
    does (OTLP protobuf decode and turn extraction), the floor of any consumer that reads the spans."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"bare-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        max_poll_records=500,
    )
    seen, first = 0, None
    while seen < records:
        for batch in consumer.poll(timeout_ms=200, max_records=500).values():
            if first is None:
                first = time.perf_counter()
            seen += len(batch)
            if decode:
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


def tracejudge_consumer(bootstrap: str, topic: str, conversations: int, role: str, timeout_s: float = 600) -> float:
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
    )
    service = ConsumerService(settings, [], ConsumerInstruments(CollectorRegistry()))
    thread = threading.Thread(target=service.run, name="bench-consumer", daemon=True)
    thread.start()
    records = service.prometheus.records
    if role == "all":
        done: Callable[[], float] = lambda: _total(service.prometheus.conversations, outcome="sampled_out")  # noqa: E731
    else:
        done = lambda: _total(service.instruments.completed)  # noqa: E731
    first = None
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if first is None and _total(records):
                first = time.perf_counter()
            if first is not None and done() >= conversations:
                break
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"{role}: {done():.0f} of {conversations} conversations done by the deadline")
            time.sleep(0.005)
        return time.perf_counter() - first
    finally:
        service.request_stop()
        thread.join(60)


def run(conversations: int = 20_000, rounds: int = 5, with_all: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "conversations": conversations,
        "turns_per_conversation": TURNS_PER_CONVERSATION,
        "partitions": PARTITIONS,
        "end_grace_s": END_GRACE_S,
        "inputs": {},
    }
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        for keyed_by in KEYINGS:
            topic = f"ingest-{keyed_by}-{uuid.uuid4().hex[:6]}"
            broker.create_topic(topic, PARTITIONS)
            records = produce(bootstrap, topic, conversations, keyed_by)
            variants: dict[str, Callable[[], float]] = {
                BARE: lambda t=topic, n=records: bare_loop(bootstrap, t, n),  # type: ignore[misc]
                DECODE: lambda t=topic, n=records: bare_loop(bootstrap, t, n, decode=True),  # type: ignore[misc]
                ASSEMBLE: lambda t=topic: tracejudge_consumer(bootstrap, t, conversations, "assemble"),  # type: ignore[misc]
            }
            if with_all:
                variants[ALL] = lambda t=topic: tracejudge_consumer(bootstrap, t, conversations, "all")  # type: ignore[misc]
            figures = alternate(variants, rounds)
            bare = figures[BARE].median
            spans = records + conversations  # the turns and the end markers
            out["inputs"][keyed_by] = {
                "records": records,
                "spans": spans,
                "figures": {name: f.as_dict() for name, f in figures.items()},
                "records_per_s": {name: records / f.median for name, f in figures.items()},
                "spans_per_s": {name: spans / f.median for name, f in figures.items()},
                "vs_bare": {name: bare / f.median for name, f in figures.items()},
                "vs_decode": {name: figures[DECODE].median / f.median for name, f in figures.items()},
            }
    ratio = out["inputs"]["conversation"]["vs_bare"][ASSEMBLE]
    out["goal"] = "conversation-keyed input: role assemble at least 0.9x the bare loop"
    out["goal_met"] = ratio >= 0.9
    return out


if __name__ == "__main__":
    print(json.dumps(run(conversations=2_000, rounds=1), indent=2))
