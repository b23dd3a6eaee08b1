"""`tracejudge backfill`: exactly the conversations inside the range; a second run judges nothing new; --rejudge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider

from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer, conversation_text
from tracejudge.consumer.embedded_broker import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[2]
HOUR_MS = 3_600_000


def conversation_record(tracer, conversation: str, turns: int, *, ended: bool, first: int = 0, text: str = "") -> bytes:
    """`turns` turns of a conversation (turn indexes from `first`), with its end marker when `ended`; `text` is
    added to each question."""
    spans = []
    for index in range(first, first + turns):
        span = tracer.start_span(
            "invoke_agent support",
            attributes={
                "gen_ai.conversation.id": conversation,
                "gen_ai.agent.name": "support",
                "gen_ai.operation.name": "invoke_agent",
                "tracejudge.turn.index": index,
                "gen_ai.input.messages": json.dumps(
                    [{"role": "user", "parts": [{"type": "text", "content": f"{conversation} q{index}{text}"}]}]
                ),
                "gen_ai.output.messages": json.dumps(
                    [{"role": "assistant", "parts": [{"type": "text", "content": "a"}]}]
                ),
            },
        )
        span.end()
        spans.append(span)
    if ended:
        marker = tracer.start_span(
            "end_conversation",
            attributes={"gen_ai.conversation.id": conversation, "tracejudge.conversation.ended": True},
        )
        marker.end()
        spans.append(marker)
    return encode_spans(spans).SerializeToString()


def backfill(
    broker: EmbeddedBroker, topic: str, results: str, start_ms: int, end_ms: int, tmp: Path, *extra: str
) -> dict:
    summary = tmp / f"summary-{time.monotonic_ns()}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACEJUDGE_BACKFILL_SUMMARY": str(summary)}
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tracejudge.consumer",
            "backfill",
            "--from",
            str(start_ms / 1000),
            "--to",
            str(end_ms / 1000),
            "--bootstrap-servers",
            broker.bootstrap_servers,
            "--topic",
            topic,
            "--results-topic",
            results,
            "--metrics",
            "failure_rate",
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
    assert "backfill" in completed.stdout
    return json.loads(summary.read_text())


def test_backfill_judges_exactly_the_range(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = scripted_judge
    results = f"{topic}-results"
    broker.create_topic(results, 1)
    tracer = TracerProvider().get_tracer("backfill")
    now_ms = int(time.time() * 1000)
    start_ms, end_ms = now_ms - 3 * HOUR_MS, now_ms - 1 * HOUR_MS
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    plan = {
        **{f"before-{i}": start_ms - HOUR_MS for i in range(3)},
        **{f"inside-{i}": start_ms + 30 * 60_000 + i * 1000 for i in range(5)},
    }
    for conversation, stamp in plan.items():
        producer.send(
            topic,
            key=conversation.encode(),
            value=conversation_record(tracer, conversation, 2, ended=True),
            timestamp_ms=stamp,
        )
    producer.send(
        topic,
        key=b"open-at-to",
        value=conversation_record(tracer, "open-at-to", 1, ended=False),
        timestamp_ms=end_ms - 60_000,
    )
    producer.send(topic, key=b"agent-x", value=b"\x00garbage", timestamp_ms=start_ms + 1000)
    for i in range(3):
        producer.send(
            topic,
            key=f"after-{i}".encode(),
            value=conversation_record(tracer, f"after-{i}", 2, ended=True),
            timestamp_ms=end_ms + 10 * 60_000,
        )
    producer.flush()
    producer.close()

    first = backfill(broker, topic, results, start_ms, end_ms, tmp_path)
    inside = sorted(c for c in plan if c.startswith("inside"))
    assert first["judged_ids"] == inside and first["judged"] == 5
    assert first["still_open"] == ["open-at-to"] and first["malformed"] == 1
    judged_texts = [conversation_text(r) for r in judge_server.requests]
    assert len(judged_texts) == 5 and all("inside-" in t for t in judged_texts)

    second = backfill(broker, topic, results, start_ms, end_ms, tmp_path)
    assert second["judged"] == 0 and second["skipped_existing"] == 5
    assert len(judge_server.requests) == 5

    third = backfill(broker, topic, results, start_ms, end_ms, tmp_path, "--rejudge")
    assert third["judged"] == 5 and len(judge_server.requests) == 10


def test_backfill_bad_arguments_exit_2() -> None:
    for args in (["--from", "2026-11-30", "--to", "2026-11-29"], ["--from", "yesterday-ish", "--to", "2026-11-29"]):
        completed = subprocess.run(
            [sys.executable, "-m", "tracejudge.consumer", "backfill", *args], capture_output=True, text=True, timeout=60
        )
        assert completed.returncode == 2, completed.stderr
        assert completed.stderr.startswith("tracejudge backfill:")


# Windows for a backfill partition, each tested: records in the range (read to the end: the range tests above);
# no record at or after --from (nothing to read, nothing scanned); a partition that never delivers (reading stops after
# the reader's stall bound, the partition is reported, exit 1); a judgement whose result sink raises (counted, the
# backfill still finishes).


def backfill_args(broker: EmbeddedBroker, topic: str, start_ms: int, end_ms: int) -> list[str]:
    return [
        "backfill",
        "--from",
        str(start_ms / 1000),
        "--to",
        str(end_ms / 1000),
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--topic",
        topic,
        "--metrics",
        "failure_rate",
    ]


def run_in_process(argv: list[str], summary: Path, timeout_s: float = 90.0) -> tuple[int | None, dict]:
    """run_backfill in a thread: a hang shows as a timeout instead of blocking the suite."""
    from tracejudge.consumer.cli.backfill import run_backfill
    from tracejudge.consumer.cli.parser import build_parser

    outcome: list[int] = []
    namespace = build_parser().parse_args(argv)
    worker = threading.Thread(target=lambda: outcome.append(run_backfill(namespace)), daemon=True)
    worker.start()
    worker.join(timeout_s)
    assert not worker.is_alive(), f"backfill still running after {timeout_s} s"
    return (outcome[0] if outcome else None), json.loads(summary.read_text())


def test_backfill_reads_nothing_when_nothing_is_after_from(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = scripted_judge
    results = f"{topic}-results"
    broker.create_topic(results, 1)
    tracer = TracerProvider().get_tracer("backfill")
    now_ms = int(time.time() * 1000)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    for i in range(30):  # all of them before the range, on every partition
        value = conversation_record(tracer, f"old-{i}", 1, ended=True)
        producer.send(topic, key=f"old-{i}".encode(), value=value, timestamp_ms=now_ms - HOUR_MS)
    producer.flush()
    producer.close()
    summary = tmp_path / "summary.json"
    env_before = os.environ.get("TRACEJUDGE_BACKFILL_SUMMARY")
    os.environ["TRACEJUDGE_BACKFILL_SUMMARY"] = str(summary)
    try:
        started = time.monotonic()
        # The range is after every record (by any clock: create or append time), so there is nothing to read.
        args = [*backfill_args(broker, topic, now_ms + HOUR_MS, now_ms + 2 * HOUR_MS), "--results-topic", results]
        code, report = run_in_process(args, summary)
        took = time.monotonic() - started
    finally:
        if env_before is None:
            os.environ.pop("TRACEJUDGE_BACKFILL_SUMMARY", None)
        else:
            os.environ["TRACEJUDGE_BACKFILL_SUMMARY"] = env_before
    assert code == 0 and report["scanned"] == 0 and report["records"] == 0 and report["unread_partitions"] == []
    assert judge_server.requests == []
    print(f"\nbackfill, nothing after --from: 30 records on the topic, {report['scanned']} scanned, {took:.1f} s")


class RaisingSink:
    def __init__(self) -> None:
        self.calls = 0

    def emit(self, judgement: object) -> None:
        self.calls += 1
        raise RuntimeError("the warehouse is down")


class StuckPartitionConsumer(KafkaConsumer):
    """A real consumer whose partition 2 never delivers (as when its leader does not answer)."""

    def assign(self, partitions):  # type: ignore[no-untyped-def]
        super().assign(partitions)
        stuck = [tp for tp in partitions if tp.partition == 2]
        if stuck:
            self.pause(*stuck)


def test_backfill_finishes_when_a_sink_raises_and_reports_unread_partitions(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path, monkeypatch
) -> None:
    from tracejudge.consumer import app
    from tracejudge.consumer.cli import backfill
    from tracejudge.consumer.kafka import clients, reader

    judge_server.responder = scripted_judge
    tracer = TracerProvider().get_tracer("backfill")
    now_ms = int(time.time() * 1000)
    start_ms, end_ms = now_ms - 3 * HOUR_MS, now_ms - HOUR_MS
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    for partition in range(3):
        for i in range(2):
            name = f"in-{partition}-{i}"
            value = conversation_record(tracer, name, 1, ended=True)
            producer.send(topic, value=value, partition=partition, timestamp_ms=start_ms + 60_000)
    producer.flush()
    producer.close()
    sink = RaisingSink()
    monkeypatch.setattr(app, "build_outputs", lambda *a, **k: app.Outputs([sink]))
    monkeypatch.setattr(clients, "KafkaConsumer", StuckPartitionConsumer)
    monkeypatch.setattr(reader, "MIN_STALL_S", 1.5)
    monkeypatch.setattr(reader, "REQUEST_TIMEOUT_MS", 500)
    summary = tmp_path / "summary.json"
    monkeypatch.setenv("TRACEJUDGE_BACKFILL_SUMMARY", str(summary))
    results = f"{topic}-results"  # backfill refuses to judge without an output (the sink here replaces it)
    broker.create_topic(results, 1)
    code, report = run_in_process(
        [*backfill_args(broker, topic, start_ms, end_ms), "--results-topic", results], summary
    )
    assert code == backfill.EXIT_INCOMPLETE == 1
    assert report["unread_partitions"] == [2]
    assert report["judged"] == 4 and sink.calls == 4 and report["sink_errors"] == 4
    unread = report["unread_partitions"]
    print(f"\nbackfill: a sink raised on all {sink.calls} judgements, finished; unread {unread}, exit {code}")


# One state machine: backfill runs the live consumer's tables, judges and outputs, with record timestamps as its clock.


def test_backfill_gives_the_live_result_ids_and_versions(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path, monkeypatch
) -> None:
    """The same stream judged live and by backfill: identical result ids and versions, also for a conversation with
    an idle gap longer than the idle timeout between its turns (live: judged at the gap as version 1, then again as
    version 2; backfill sees the gap in the record timestamps). A second backfill into the live results topic judges
    nothing: every result id is already there."""
    from tests.support.pipeline import RunningConsumer, consumer_settings, result_records, wait_for

    judge_server.responder = scripted_judge
    # Margins both ways on a loaded machine: the gap is twice the idle timeout, and the turns that must stay one
    # version are sent back to back (their CreateTimes microseconds apart, read in one poll).
    idle_s, gap_s = 2.5, 5.0
    live_results, backfill_results = f"{topic}-live", f"{topic}-backfill"
    broker.create_topic(live_results, 1)
    broker.create_topic(backfill_results, 1)
    tracer = TracerProvider().get_tracer("backfill")
    start_ms = int(time.time() * 1000) - 60_000
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)

    def send(conversation: str, *values: bytes) -> None:
        for value in values:
            producer.send(topic, key=conversation.encode(), value=value)  # CreateTime: the producer's wall clock
        producer.flush()

    settings = consumer_settings(
        broker.bootstrap_servers,
        topic,
        metrics="failure_rate",
        results_topic=live_results,
        session_idle_timeout=idle_s,
    )
    with RunningConsumer(settings) as live:
        send("gap", conversation_record(tracer, "gap", 1, first=0, ended=False))
        for name in ("plain-0", "plain-1"):
            send(
                name,
                conversation_record(tracer, name, 1, first=0, ended=False),
                conversation_record(tracer, name, 1, first=1, ended=True),
            )
        gap_started = time.monotonic()
        wait_for(lambda: live.sessions("judged") == 3, what="the gap conversation judged when it went idle")
        time.sleep(max(0.0, gap_s - (time.monotonic() - gap_started)))
        send("gap", conversation_record(tracer, "gap", 1, first=1, ended=True))
        wait_for(lambda: live.sessions("judged") == 4, what="the gap conversation judged again after the gap")
        live_records = result_records(broker, live_results, 4)
    producer.close()
    end_ms = int(time.time() * 1000) + 60_000
    assert sorted((r["conversation_id"], r["version"]) for r in live_records) == [
        ("gap", 1),
        ("gap", 2),
        ("plain-0", 2),
        ("plain-1", 2),
    ]

    summary = tmp_path / "summary.json"
    monkeypatch.setenv("TRACEJUDGE_BACKFILL_SUMMARY", str(summary))
    args = [*backfill_args(broker, topic, start_ms, end_ms), "--session-idle-timeout", str(idle_s)]
    code, report = run_in_process([*args, "--results-topic", backfill_results], summary)
    assert code == 0 and report["judged"] == 4 and report["still_open"] == []
    backfilled = result_records(broker, backfill_results, 4)
    assert sorted((r["result_id"], r["version"]) for r in backfilled) == sorted(
        (r["result_id"], r["version"]) for r in live_records
    )

    code, again = run_in_process([*args, "--results-topic", live_results], summary)
    assert code == 0 and again["judged"] == 0 and again["skipped_existing"] == 4
    print(f"\nlive and backfill: {len(backfilled)} identical result ids, versions {[r['version'] for r in backfilled]}")
