"""Consumer ingest: turn spans in Tansu, decoded and assembled by the consumer (judging off: every conversation
sampled out), against a bare kafka-python loop reading the same records. Both measured from first to last record."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

from kafka import KafkaConsumer, KafkaProducer
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from bench._stats import alternate
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit.prometheus import ConsumerMetrics
from tracejudge.consumer.service import ConsumerService
from tracejudge.consumer.settings import Settings

TURNS_PER_CONVERSATION = 10


def produce(bootstrap: str, topic: str, spans: int) -> int:
    """One record per conversation: its turns and its end marker, as our exporter would batch them."""
    tracer = TracerProvider().get_tracer("bench")
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20, max_request_size=1 << 24)
    conversations = spans // TURNS_PER_CONVERSATION
    for c in range(conversations):
        cid = f"bench-{c}"
        batch = []
        for t in range(TURNS_PER_CONVERSATION):
            span = tracer.start_span(
                "invoke_agent bench",
                attributes={
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": "bench",
                    "gen_ai.conversation.id": cid,
                    "tracejudge.turn.index": t,
                    "gen_ai.input.messages": json.dumps(
                        [{"role": "user", "parts": [{"type": "text", "content": f"question {t} of {cid} " * 4}]}]
                    ),
                    "gen_ai.output.messages": json.dumps(
                        [{"role": "assistant", "parts": [{"type": "text", "content": "an answer " * 12}]}]
                    ),
                },
            )
            span.end()
            batch.append(span)
        marker = tracer.start_span(
            "end_conversation", attributes={"gen_ai.conversation.id": cid, "tracejudge.conversation.ended": True}
        )
        marker.end()
        batch.append(marker)
        producer.send(topic, key=cid.encode(), value=encode_spans(batch).SerializeToString())
    producer.flush()
    producer.close()
    return conversations


def bare_loop(bootstrap: str, topic: str, records: int) -> float:
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
    elapsed = time.perf_counter() - (first or time.perf_counter())
    consumer.close()
    return elapsed


def tracejudge_consumer(bootstrap: str, topic: str, records: int) -> float:
    settings = Settings.from_options(
        bootstrap_servers=bootstrap,
        topic=topic,
        group_id=f"tj-{uuid.uuid4().hex[:6]}",
        start_from="earliest",
        sample_rate=0.0,
        session_idle_timeout=600,
        kafka_config={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
    )
    service = ConsumerService(settings, [], ConsumerMetrics(CollectorRegistry()))
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    first = None
    while True:
        consumed = sum(service.offsets.positions().values())
        if consumed and first is None:
            first = time.perf_counter()
        if consumed >= records:
            break
        time.sleep(0.005)
    elapsed = time.perf_counter() - (first or time.perf_counter())
    service.request_stop()
    thread.join(30)
    return elapsed


def run(spans: int = 100_000, rounds: int = 5) -> dict[str, Any]:
    with EmbeddedBroker() as broker:
        topic = f"ingest-{uuid.uuid4().hex[:6]}"
        broker.create_topic(topic, 3)
        records = produce(broker.bootstrap_servers, topic, spans)
        figures = alternate(
            {
                "bare kafka-python loop": lambda: bare_loop(broker.bootstrap_servers, topic, records),
                "tracejudge consumer (decode + assemble)": lambda: tracejudge_consumer(
                    broker.bootstrap_servers, topic, records
                ),
            },
            rounds,
        )
    bare = figures["bare kafka-python loop"].median
    ours = figures["tracejudge consumer (decode + assemble)"].median
    return {
        "records": records,
        "spans": records * (TURNS_PER_CONVERSATION + 1),
        "figures": {name: f.as_dict() for name, f in figures.items()},
        "records_per_s": {"bare": records / bare, "tracejudge": records / ours},
        "spans_per_s": {
            "bare": records * (TURNS_PER_CONVERSATION + 1) / bare,
            "tracejudge": records * (TURNS_PER_CONVERSATION + 1) / ours,
        },
        "ours_vs_bare": bare / ours,
        "goal": "at least 0.5x the bare loop",
        "goal_met": bare / ours >= 0.5,
    }


if __name__ == "__main__":
    print(json.dumps(run(spans=20_000, rounds=3), indent=2))
