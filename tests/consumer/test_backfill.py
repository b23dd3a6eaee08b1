"""`tracejudge backfill`: exactly the conversations inside the range; a second run judges nothing new; --rejudge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kafka import KafkaProducer
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider

from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer, conversation_text
from tracejudge.consumer.embedded_broker import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[2]
HOUR_MS = 3_600_000


def conversation_record(tracer, conversation: str, turns: int, *, ended: bool) -> bytes:
    spans = []
    for index in range(turns):
        span = tracer.start_span(
            "invoke_agent support",
            attributes={
                "gen_ai.conversation.id": conversation,
                "gen_ai.agent.name": "support",
                "gen_ai.operation.name": "invoke_agent",
                "tracejudge.turn.index": index,
                "gen_ai.input.messages": json.dumps(
                    [{"role": "user", "parts": [{"type": "text", "content": f"{conversation} q{index}"}]}]
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
