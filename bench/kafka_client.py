"""What a C Kafka client would change (issue 31's "what would reach it", measured): the ingest bench's three inputs
read by kafka-python and by confluent-kafka (librdkafka) in the same run, rounds alternating, each bare and with every
record turned into conversation events (`read_events`, as the consumer does).

The consumer's throughput goals are ratios to the bare kafka-python loop; its stream thread spends a quarter of its
time in kafka-python's poll (its record parsing is Python) and shares the interpreter lock with kafka-python's IO and
sender threads. This bench shows how much of the bare loop's cost a C client removes, and what is left for our own
work at the goals: `C loop + read_events` against the bare kafka-python loop is the ceiling of a consumer that reads
through librdkafka and does nothing past `read_events`. confluent-kafka is in the `bench` extra only; without it the
bench says so and measures nothing.
"""

from __future__ import annotations

import uuid
from typing import Any

from bench._stats import alternate
from bench.consumer_ingest import (
    BARE,
    DECODE,
    FIREHOSE_SHARE,
    KEYINGS,
    MAX_RECORD_BYTES,
    PARTITIONS,
    bare_loop,
    produce,
)
from tracejudge.consumer._gc import collect_less
from tracejudge.consumer.conversation.reading import read_events
from tracejudge.consumer.embedded_broker import EmbeddedBroker

C_BARE = "bare confluent-kafka loop"
C_DECODE = "confluent-kafka loop + read_events"


def c_loop(bootstrap: str, topic: str, records: int, *, decode: bool = False) -> float:
    """The bare loop through librdkafka: a group member from the earliest offset, batches of up to 500 records, the
    clock from the first record (as `consumer_ingest.bare_loop`)."""
    import time

    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"c-bare-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "check.crcs": True,  # as kafka-python does by default (librdkafka does not): the same work per batch
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
        }
    )
    consumer.subscribe([topic])
    seen, first = 0, None
    try:
        while seen < records:
            for message in consumer.consume(num_messages=500, timeout=0.2):
                if message.error() is not None:
                    continue
                if first is None:
                    first = time.perf_counter()
                seen += 1
                if decode:
                    read_events(message.value(), max_bytes=MAX_RECORD_BYTES)
        return time.perf_counter() - (first or time.perf_counter())
    finally:
        consumer.close()


def run(conversations: int = 20_000, rounds: int = 5) -> dict[str, Any]:
    try:
        import confluent_kafka
    except ImportError:
        return {"skipped": "confluent-kafka is not installed (pip install -e '.[bench]')"}
    collect_less()
    version = confluent_kafka.version()  # a string; (string, number) in older releases
    out: dict[str, Any] = {
        "confluent_kafka": version[0] if isinstance(version, tuple) else version,
        "librdkafka": confluent_kafka.libversion()[0],
        "conversations": conversations,
        "inputs": {},
    }
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        for keyed_by in KEYINGS:
            count = conversations // FIREHOSE_SHARE if keyed_by == "firehose" else conversations
            topic = f"client-{keyed_by}-{uuid.uuid4().hex[:6]}"
            broker.create_topic(topic, PARTITIONS)
            records = produce(bootstrap, topic, count, keyed_by)
            figures = alternate(
                {
                    BARE: lambda t=topic, n=records: bare_loop(bootstrap, t, n),  # type: ignore[misc]
                    DECODE: lambda t=topic, n=records: bare_loop(bootstrap, t, n, stage=DECODE),  # type: ignore[misc]
                    C_BARE: lambda t=topic, n=records: c_loop(bootstrap, t, n),  # type: ignore[misc]
                    C_DECODE: lambda t=topic, n=records: c_loop(bootstrap, t, n, decode=True),  # type: ignore[misc]
                },
                rounds,
            )
            bare = figures[BARE].median
            out["inputs"][keyed_by] = {
                "records": records,
                "figures": {name: f.as_dict() for name, f in figures.items()},
                "records_per_s": {name: records / f.median for name, f in figures.items()},
                "vs_bare": {name: bare / f.median for name, f in figures.items()},
            }
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(run(conversations=2_000, rounds=1), indent=2))
