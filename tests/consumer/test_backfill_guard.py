"""`tracejudge backfill` without an output refuses before reading anything (exit 2); `--dry-run` reads the range,
calls no judge (the judge server counts 0 requests) and prints what it would judge and an estimated cost; its
`--help` lists only what applies to backfill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kafka import KafkaProducer
from opentelemetry.sdk.trace import TracerProvider

from tests.consumer.test_backfill import HOUR_MS, conversation_record
from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer
from tracejudge.consumer.embedded_broker import EmbeddedBroker, free_port

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, summary: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    if summary is not None:
        env["TRACEJUDGE_BACKFILL_SUMMARY"] = str(summary)
    return subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", *args], capture_output=True, text=True, env=env, timeout=240
    )


def test_backfill_without_an_output_exits_2_before_reading(judge_server: JudgeServer) -> None:
    # The broker address is a closed port: had it tried to read, it would fail to connect (exit 69), not exit 2.
    completed = run(
        "backfill", "--from", "2026-11-01", "--to", "2026-11-02", "--bootstrap-servers", f"127.0.0.1:{free_port()}"
    )
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in completed.stderr, completed.stderr
    assert lines[0].startswith("tracejudge backfill: no output for the verdicts")
    assert "--results-topic" in lines[0] and "--otlp-endpoint" in lines[0] and "--dry-run" in lines[0]
    assert judge_server.requests == []


def test_dry_run_reads_the_range_calls_no_judge_and_estimates_the_cost(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = scripted_judge
    tracer = TracerProvider().get_tracer("dry-run")
    now_ms = int(time.time() * 1000)
    start_ms, end_ms = now_ms - 3 * HOUR_MS, now_ms - HOUR_MS
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    for i in range(4):
        name = f"inside-{i}"
        value = conversation_record(tracer, name, 3, ended=True)
        producer.send(topic, key=name.encode(), value=value, timestamp_ms=start_ms + 60_000 + i)
    producer.send(
        topic,
        key=b"before",
        value=conversation_record(tracer, "before", 2, ended=True),
        timestamp_ms=start_ms - HOUR_MS,
    )
    producer.flush()
    producer.close()
    summary = tmp_path / "summary.json"
    completed = run(
        "backfill",
        "--dry-run",
        "--from",
        str(start_ms / 1000),
        "--to",
        str(end_ms / 1000),
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--topic",
        topic,
        "--judge-model",
        "gpt-4o-mini",
        summary=summary,
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
    assert judge_server.requests == []  # not one judge call
    report = json.loads(summary.read_text())
    assert report["dry_run"] is True and report["selected"] == 4 and report["judged"] == 0
    assert report["records"] == 4  # the one before --from is not in the range
    calls = 4 * 2  # both metrics by default
    # Every call's prompt holds a rubric of over a thousand tokens and a three-turn transcript.
    assert report["estimated_input_tokens"] > 1_000 * calls
    assert report["estimated_output_tokens"] == 200 * calls
    assert 0 < report["estimated_cost_usd"] < 0.05  # gpt-4o-mini: a fraction of a cent per call
    stdout = " ".join(completed.stdout.split())
    assert "would judge 4 conversations (8 judge calls with gpt-4o-mini)" in stdout
    assert f"estimated judge cost: ${report['estimated_cost_usd']:.4f}" in stdout
    assert "an estimate" in stdout and "No judge was called" in stdout
    print(
        f"\ndry run: 4 conversations, {report['estimated_input_tokens']} prompt tokens, "
        f"~${report['estimated_cost_usd']:.4f} estimated, {len(judge_server.requests)} judge calls"
    )


def test_dry_run_with_a_model_without_a_price_says_so(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    tracer = TracerProvider().get_tracer("dry-run")
    now_ms = int(time.time() * 1000)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    producer.send(topic, value=conversation_record(tracer, "c", 1, ended=True), timestamp_ms=now_ms - HOUR_MS)
    producer.flush()
    producer.close()
    summary = tmp_path / "summary.json"
    completed = run(
        "backfill",
        "--dry-run",
        "--from",
        str((now_ms - 2 * HOUR_MS) / 1000),
        "--to",
        str(now_ms / 1000),
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--topic",
        topic,
        "--metrics",
        "failure_rate",
        "--judge-model",
        "openai/house-model-without-a-price",
        summary=summary,
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
    report = json.loads(summary.read_text())
    assert report["selected"] == 1 and report["estimated_cost_usd"] is None and report["estimated_input_tokens"] > 0
    assert "estimated judge cost: unknown: LiteLLM has no price for" in " ".join(completed.stdout.split())
    assert judge_server.requests == []


def test_backfill_help_lists_only_flags_that_apply() -> None:
    completed = run("backfill", "--help")
    assert completed.returncode == 0
    text = completed.stdout
    for flag in ("--dry-run", "--from", "--to", "--results-topic", "--otlp-endpoint", "--judge-model", "--rejudge"):
        assert flag in text, flag
    # The options backfill defines (a help text may name another command's flag: --metrics says it is not the
    # Prometheus endpoint, --metrics-host / --metrics-port).
    defined = {line.split()[0].rstrip(",") for line in text.splitlines() if line.lstrip().startswith("--")}
    text = " ".join(sorted(defined))
    for flag in (
        "--group-id",
        "--start-from",
        "--metrics-host",
        "--metrics-port",
        "--max-agents",
        "--window-sessions",
        "--window-seconds",
        "--max-open-conversations",
        "--commit-interval",
        "--calibration",
    ):
        assert flag not in text, flag
