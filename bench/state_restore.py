"""State restore: how long a fresh consumer takes to rebuild its conversations from the changelog before it processes
a record (what a restart, a rebalance or a scale-out costs a partition that moves).

The changelog is written in the real format (consumer/streams/records.py: `encode_state`, MessagePack with the
`state.msgpack` kind header) to the group's compacted `<group>-conversations-changelog` on Tansu: conversations of
three turns of ~300 characters each, completed by their end marker and dispatched, as a live table leaves them. A fresh
ConsumerService (role `assemble`) then joins the group; the figure runs from its partitions' assignment to
`service.assigned` (every partition restored, the "ready" log line); `tracejudge_state_restore_seconds` is reported
too (per partition; partitions restore side by side through one consumer). Each round restores on a fresh disk (an
empty --state-dir: the whole changelog), then again on the same disk (a restart: the local store from its
checkpoint, no changelog tail), and the same conversations written as JSON (the format before MessagePack, still
read) on a fresh disk: side by side in one run."""

from __future__ import annotations

import json
import tempfile
import threading
import time
import uuid
from typing import Any

from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient
from prometheus_client import CollectorRegistry

from tracejudge.consumer.adapters import ConversationEvent, Turn
from tracejudge.consumer.conversation.table import ConversationTable
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.kafka.partitioner import state_partition
from tracejudge.consumer.kafka.topics import InternalTopics, ensure_internal_topics
from tracejudge.consumer.service import ConsumerService
from tracejudge.consumer.settings import Settings
from tracejudge.consumer.streams import records as R

PARTITIONS = 3
TURNS = 3
PER = 100_000


def states(count: int, chunk: int = 1_000, *, packed: bool = True) -> Any:
    """(conversation id, changelog value) for `count` conversations, each folded through a real ConversationTable."""
    for start in range(0, count, chunk):
        table = ConversationTable(idle_timeout_s=600)
        ts = 1_700_000_000_000
        for c in range(start, min(start + chunk, count)):
            cid = f"restore-{c}"
            for t in range(TURNS):
                turn = Turn(
                    span_id=f"{c:012x}{t:04x}",
                    trace_id=f"{c:028x}{t:04x}",
                    parent_span_id="",
                    start_ns=ts * 1_000_000 + t,
                    end_ns=ts * 1_000_000 + t + 1,
                    input=f"question {t} of {cid}: " + "what does the invoice say about the refund? " * 2,
                    output="the invoice says the refund was issued on the third and arrives within a week. " * 2,
                    index=t,
                )
                event = ConversationEvent(conversation_id=cid, agent="bench", turn=turn, ended=t == TURNS - 1)
                table.apply(event, ts + t)
        table.take_dispatches()
        changed, _removed = table.take_changes()
        for state in changed:
            yield state.id, R.encode_state(state) if packed else (R.STATE, R.dumps(state.to_json()))


def write_changelog(bootstrap: str, group: str, count: int, *, packed: bool = True) -> tuple[int, int]:
    """The group's internal topics (created as the consumer creates them) and `count` states; (records, bytes)."""
    topics = InternalTopics(group)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="bench-admin")
    try:
        ensure_internal_topics(admin, topics, PARTITIONS)
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20, acks="all")
    written = size = 0
    for cid, (kind, value) in states(count, packed=packed):
        producer.send(
            topics.changelog,
            key=cid.encode(),
            value=value,
            headers=R.header(kind),
            partition=state_partition(cid, PARTITIONS),
        )
        written += 1
        size += len(value)
    producer.flush()
    producer.close()
    return written, size


def restore_once(
    bootstrap: str, topic: str, group: str, count: int, state_dir: str, timeout_s: float = 600
) -> dict[str, float]:
    settings = Settings.from_options(
        state_dir=state_dir,
        bootstrap_servers=bootstrap,
        topic=topic,
        group_id=group,
        start_from="earliest",
        role="assemble",
        sample_rate=0.0,
        session_idle_timeout=600,
        kafka_config={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
    )
    service = ConsumerService(settings, [], ConsumerInstruments(CollectorRegistry()))
    thread = threading.Thread(target=service.run, name="bench-restore", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    try:
        assigned_at = None
        while not service.assigned.is_set():
            if assigned_at is None and service.assembler is not None and service.assembler.tasks:
                assigned_at = time.perf_counter()
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the consumer did not restore its partitions by the deadline")
            time.sleep(0.002)
        elapsed = time.perf_counter() - (assigned_at or time.perf_counter())
        assert service.assembler is not None
        held = sum(len(task.table) for task in service.assembler.tasks.values())
        assert held == count, f"restored {held} of {count} conversations"
        histogram = {
            s.name: s.value for family in service.instruments.restore_seconds.collect() for s in family.samples
        }
        return {
            "seconds": elapsed,
            "partition_seconds_sum": histogram["tracejudge_state_restore_seconds_sum"],
            "partitions": histogram["tracejudge_state_restore_seconds_count"],
            "state_bytes": float(service.assembler.memory.used),
        }
    finally:
        service.request_stop()
        thread.join(60)


def run(conversations: int = PER, rounds: int = 3) -> dict[str, Any]:
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        topic = f"restore-{uuid.uuid4().hex[:6]}"
        broker.create_topic(topic, PARTITIONS)
        group, json_group = f"restore-{uuid.uuid4().hex[:6]}", f"restore-json-{uuid.uuid4().hex[:6]}"
        records, size = write_changelog(bootstrap, group, conversations)
        _, json_size = write_changelog(bootstrap, json_group, conversations, packed=False)
        runs, json_runs, local_runs = [], [], []
        with tempfile.TemporaryDirectory(prefix="bench-state-") as disks:
            for n in range(rounds):  # interleaved: the variants see the same machine
                fresh, again = f"{disks}/{n}", f"{disks}/json-{n}"
                runs.append(restore_once(bootstrap, topic, group, conversations, fresh))
                local_runs.append(restore_once(bootstrap, topic, group, conversations, fresh))  # same disk
                json_runs.append(restore_once(bootstrap, topic, json_group, conversations, again))
    local_median = sorted(r["seconds"] for r in local_runs)[len(local_runs) // 2]
    seconds = sorted(r["seconds"] for r in runs)
    median = seconds[len(seconds) // 2]
    json_median = sorted(r["seconds"] for r in json_runs)[len(json_runs) // 2]
    return {
        "same_disk_runs": local_runs,
        "same_disk_median_s": local_median,
        "same_disk_seconds_per_100k": local_median * PER / conversations,
        "json_changelog_bytes": json_size,
        "json_runs": json_runs,
        "json_median_s": json_median,
        "json_seconds_per_100k": json_median * PER / conversations,
        "ratio_to_json": median / json_median,
        "conversations": conversations,
        "partitions": PARTITIONS,
        "turns_each": TURNS,
        "changelog_records": records,
        "changelog_bytes": size,
        "runs": runs,
        "median_s": median,
        "min_s": seconds[0],
        "max_s": seconds[-1],
        "seconds_per_100k": median * PER / conversations,
        "records_per_s": records / median,
        "mib_per_s": size / 2**20 / median,
        "state_bytes_per_conversation": runs[-1]["state_bytes"] / conversations,
    }


if __name__ == "__main__":
    print(json.dumps(run(conversations=5_000, rounds=1), indent=2))
