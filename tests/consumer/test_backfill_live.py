"""One state machine for live and backfill (issue 32): a real `tracejudge consume` process judges a range, then
`tracejudge backfill` reads the same range into the same table, rules and content ids.

The range holds what the two used to cut differently: a conversation over the byte bound (--max-conversation-bytes:
the table keeps its newest turns, marked truncated), one past the turn cap (--max-turns-per-conversation: judged in
windows), one with an idle gap longer than the idle timeout in record time (two versions), and one whose record is not
keyed by its conversation id, on another partition than its own (routed live through the repartition topic, its end
marker waiting --end-grace), next to plain ones. Every conversation ends inside the range, so nothing depends on
when the live consumer read it.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

from kafka import KafkaProducer
from opentelemetry.sdk.trace import TracerProvider

from tests.consumer.test_backfill import HOUR_MS, backfill, conversation_record
from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer
from tests.support.pipeline import consumer_process, result_records
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.kafka.partitioner import state_partition

IDLE_S = 60
MAX_BYTES = 4_000  # --max-conversation-bytes: "big" has 5 turns of 1,500 characters, so it keeps its newest 2
MAX_TURNS = 6
BOUNDS = {
    "TRACEJUDGE_SESSION_IDLE_TIMEOUT": str(IDLE_S),
    "TRACEJUDGE_MAX_CONVERSATION_BYTES": str(MAX_BYTES),
    "TRACEJUDGE_MAX_TURNS_PER_CONVERSATION": str(MAX_TURNS),
}
FLAGS = (
    "--session-idle-timeout",
    str(IDLE_S),
    "--max-conversation-bytes",
    str(MAX_BYTES),
    "--max-turns-per-conversation",
    str(MAX_TURNS),
)


def produce_range(broker: EmbeddedBroker, topic: str, start_ms: int) -> int:
    """The conversations above, stamped inside the range; returns how many judgements live makes of them."""
    tracer = TracerProvider().get_tracer("one-state-machine")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    at = start_ms + 10 * 60_000

    def send(conversation: str, value: bytes, ms: int, *, keyed: bool = True) -> None:
        if keyed:
            producer.send(topic, key=conversation.encode(), value=value, timestamp_ms=ms)
        else:  # as the Collector sends: not keyed by conversation, on a partition that does not own it
            other = (state_partition(conversation, 3) + 1) % 3
            producer.send(topic, value=value, partition=other, timestamp_ms=ms)
        producer.flush()

    for i in range(3):
        send(f"plain-{i}", conversation_record(tracer, f"plain-{i}", 2, ended=True), at + i * 1000)
    send("big", conversation_record(tracer, "big", 5, text=" " + "x" * 1_500, ended=True), at + 5_000)
    send("capped", conversation_record(tracer, "capped", MAX_TURNS + 2, ended=True), at + 6_000)
    send("gap", conversation_record(tracer, "gap", 1, ended=False), at + 7_000)
    send("routed", conversation_record(tracer, "routed", 2, ended=True), at + 8_000, keyed=False)
    send("gap", conversation_record(tracer, "gap", 1, first=1, ended=True), at + 7_000 + 2 * IDLE_S * 1000)
    producer.close()
    return 3 + 1 + 2 + 2 + 1  # plain, big, capped (two windows), gap (two versions), routed


def test_backfill_skips_what_live_judged_and_alone_gives_the_live_result_ids(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = scripted_judge
    live_results, alone_results = f"{topic}-live", f"{topic}-alone"
    broker.create_topic(live_results, 1)
    broker.create_topic(alone_results, 1)
    now_ms = int(time.time() * 1000)
    start_ms, end_ms = now_ms - 3 * HOUR_MS, now_ms - HOUR_MS
    expected = produce_range(broker, topic, start_ms)

    live = consumer_process(
        broker, topic, f"live-{uuid.uuid4().hex[:6]}", live_results, log=tmp_path / "live.log", **BOUNDS
    )
    try:
        records = result_records(broker, live_results, expected, timeout_s=120)
    finally:
        live.send_signal(signal.SIGTERM)
        live.wait(60)
    log = (tmp_path / "live.log").read_text()
    assert len(records) == expected, log[-3000:]
    live_ids = sorted(r["result_id"] for r in records)
    assert len(set(live_ids)) == expected
    by_conversation: dict[str, list[dict]] = {}
    for r in records:
        by_conversation.setdefault(r["conversation_id"], []).append(r)
    (big,) = by_conversation["big"]
    assert big["truncated"]  # the byte bound cut it (live): its oldest turns are not in the judged transcript
    assert len(by_conversation["capped"]) == 2 and by_conversation["capped"][0]["truncated"]
    assert len(by_conversation["gap"]) == 2 and len(by_conversation["routed"]) == 1
    calls_live = len(judge_server.requests)
    assert calls_live == expected

    # Over the range live judged: every result id is found, no judge is called.
    again = backfill(broker, topic, live_results, start_ms, end_ms, tmp_path, *FLAGS)
    assert again["judged"] == 0 and again["skipped_existing"] == expected and again["still_open"] == []
    assert len(judge_server.requests) == calls_live
    assert sorted(again["result_ids"]) == live_ids

    # Alone (an empty results topic): it judges the same transcripts under the same result ids.
    alone = backfill(broker, topic, alone_results, start_ms, end_ms, tmp_path, *FLAGS)
    assert alone["judged"] == expected and len(judge_server.requests) == calls_live + expected
    assert sorted(r["result_id"] for r in result_records(broker, alone_results, expected)) == live_ids
    print(
        f"\nlive judged {expected} conversations ({calls_live} judge calls); backfill over the same range: "
        f"{again['skipped_existing']} already judged, 0 calls; backfill alone: the same {expected} result ids"
    )
