"""`tracejudge watch` (consumer/cli/watch.py), the real command over the embedded broker, reading records the real
results-topic writer wrote: `--once` lists the verdicts with their reasons and the counts, the filters narrow them,
an empty or missing topic and a broker that does not answer are one line each; live and piped, a new verdict is
appended as it arrives and Ctrl-C exits 0 without a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from tests.consumer.test_outputs import job, verdict
from tracejudge.consumer.embedded_broker import EmbeddedBroker, free_port
from tracejudge.consumer.emit import KafkaWriter
from tracejudge.consumer.emit.results_topic import ResultsTopic
from tracejudge.consumer.judging.judgement import Judgement, Retry
from tracejudge.metrics import MetricResult

ROOT = Path(__file__).resolve().parents[2]
METRICS = ["failure_rate", "conversational_flow"]


def watch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TRACEJUDGE_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "watch", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def judged(conversation: str, agent: str, labels: dict[str, str]) -> Judgement:
    results = []
    for metric, label in labels.items():
        result = verdict(metric, label, 0.0 if label == "hallucination" else 1.0)
        result.reason = f"{conversation}: why {label}"
        results.append(result)
    return Judgement(job(conversation, agent), "judged", results)


def write(writer: KafkaWriter, *judgements: Judgement) -> None:
    sink = ResultsTopic(writer, METRICS)
    events = [event for judgement in judgements for event in sink.emit(judgement)]
    assert all(event.wait(30) for event in events)


@pytest.fixture(scope="module")
def results(broker: EmbeddedBroker) -> str:
    """A results topic holding what the consumer writes: verdicts, a failure, a sampled-out conversation, one that
    was retrying and then judged (its newer record stands), and a shadow judge's verdict (never shown)."""
    topic = f"results-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 2)
    writer = KafkaWriter(broker.bootstrap_servers, topic, durable=True).start()
    try:
        failed = MetricResult(name="failure_rate", threshold=0.7, model="m")
        failed.error, failed.error_kind = "the judge answered 401", "auth"
        shadowed = judged("chat-1", "support-bot", {"failure_rate": "hallucination", "conversational_flow": "fully"})
        shadowed.shadow_results = [verdict("failure_rate", "stall", 0.0)]
        retry = Retry(attempt=1, reason="server_error", first_failed_at=1.7e9, until=1.8e9, next_at=1.75e9)
        write(
            writer,
            shadowed,
            judged("chat-2", "support-bot", {"failure_rate": "not_applicable", "conversational_flow": "fully"}),
            Judgement(job("chat-3", "billing"), "failed", [failed]),
            Judgement(job("chat-4", "billing"), "sampled_out", sample_rate=0.1),
            Judgement(job("chat-5", "billing"), "retrying", retry=retry),
        )
        write(writer, judged("chat-5", "billing", {"failure_rate": "honest_fallback"}))
    finally:
        writer.close(5)
    return topic


def test_once_lists_the_verdicts_with_reasons_and_counts(broker: EmbeddedBroker, results: str) -> None:
    done = watch("--once", "--bootstrap-servers", broker.bootstrap_servers, "--results-topic", results)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    rows = [line.split("  ")[2:] for line in lines if line.startswith("  ") and "chat-" in line]
    got = sorted(tuple(row[:4]) for row in rows)
    assert got == [
        ("chat-1", "support-bot", "conversational_flow", "fully"),
        ("chat-1", "support-bot", "failure_rate", "hallucination"),
        ("chat-2", "support-bot", "conversational_flow", "fully"),
        ("chat-2", "support-bot", "failure_rate", "not_applicable"),
        ("chat-3", "billing", "conversational_flow", "failed"),  # failed before its call: each metric has a record
        ("chat-3", "billing", "failure_rate", "failed"),
        ("chat-5", "billing", "failure_rate", "honest_fallback"),  # retrying, then judged: the verdict stands
    ], got
    by_conversation = {(row[0], row[2]): row[4] for row in rows}
    assert by_conversation[("chat-1", "failure_rate")] == "chat-1: why hallucination"
    assert by_conversation[("chat-3", "failure_rate")] == "auth: the judge answered 401"
    assert "stall" not in done.stdout  # the shadow judge's verdict is no production verdict
    assert "  by agent: support-bot 4, billing 3" in lines
    assert "  by judge: failure_rate 4, conversational_flow 3" in lines
    assert "  by verdict: failed 2, fully 2, hallucination 1, honest_fallback 1, not_applicable 1" in lines
    assert lines[-1] == "not verdicts: sampled_out 2"  # chat-4, one record per metric; chat-5's retrying is superseded
    assert lines[0].startswith(f"tracejudge watch: results topic {results!r}, ") and done.stderr == ""


def test_filters_narrow_the_verdicts_and_say_when_none_matches(broker: EmbeddedBroker, results: str) -> None:
    base = ("--once", "--bootstrap-servers", broker.bootstrap_servers, "--results-topic", results)
    done = watch(*base, "--verdict", "hallucination,failed", "--agent", "billing", "--metric", "failure_rate")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("  ") and "chat-" in line]
    assert len(rows) == 1 and "  chat-3  billing  failure_rate  failed  auth: the judge answered 401" in rows[0]
    assert "only --verdict failed,hallucination --metric failure_rate --agent billing" in done.stdout
    latest = watch(*base, "--latest", "2")
    assert latest.returncode == 0, latest.stderr
    assert len([line for line in latest.stdout.splitlines() if line.startswith("  2")]) == 2
    assert (
        "7 verdicts; the latest 2, newest last:" in latest.stdout
        and "  by agent: support-bot 4, billing 3" in latest.stdout
    )
    none = watch(*base, "--agent", "nobody")
    assert none.returncode == 0, none.stderr
    assert "no verdict matches --agent nobody (7 verdicts on the topic)" in none.stdout
    wrong = watch(*base, "--verdict", "halucination")
    assert wrong.returncode == 2 and wrong.stdout == ""
    (line,) = wrong.stderr.splitlines()
    assert line.startswith("tracejudge watch: --verdict: unknown halucination; known: ") and "hallucination" in line


def test_an_empty_topic_says_no_verdicts_yet_and_a_missing_one_names_the_group(broker: EmbeddedBroker) -> None:
    empty = f"results-{uuid.uuid4().hex[:8]}"
    broker.create_topic(empty, 1)
    done = watch("--once", "--bootstrap-servers", broker.bootstrap_servers, "--results-topic", empty)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].startswith("no verdicts yet") and done.stderr == ""
    group = f"nobody-{uuid.uuid4().hex[:6]}"
    missing = watch("--once", "--bootstrap-servers", broker.bootstrap_servers, "--group-id", group)
    assert missing.returncode == 1, missing.stderr
    (line,) = missing.stderr.splitlines()
    assert f"results topic '{group}-results' does not exist" in line and f"group {group!r}" in line


def test_a_broker_that_does_not_answer_is_one_line() -> None:
    done = watch(
        "--once", "--bootstrap-servers", f"127.0.0.1:{free_port()}", "--kafka-config", "bootstrap_timeout_ms=1000"
    )
    assert done.returncode == 69, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("tracejudge watch: cannot reach Kafka at 127.0.0.1:") and "Traceback" not in done.stderr


def test_live_and_piped_a_new_verdict_is_appended_and_ctrl_c_exits_0(broker: EmbeddedBroker, results: str) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TRACEJUDGE_")}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "tracejudge.consumer", "watch", "--bootstrap-servers", broker.bootstrap_servers]
    process = subprocess.Popen(
        [*command, "--results-topic", results],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[str] = []
    seen = threading.Condition()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            with seen:
                lines.append(line.rstrip("\n"))
                seen.notify_all()

    reader = threading.Thread(target=read, name="watch-output")
    reader.start()
    try:
        with seen:  # the view of what the topic holds, drawn once (piped: never redrawn)
            assert seen.wait_for(lambda: any(line.startswith("not verdicts:") for line in lines), timeout=120), lines
            drawn = len(lines)
        writer = KafkaWriter(broker.bootstrap_servers, results, durable=True).start()
        try:
            write(writer, judged("chat-live", "support-bot", {"failure_rate": "stall"}))
        finally:
            writer.close(5)
        with seen:
            assert seen.wait_for(lambda: any("chat-live" in line for line in lines[drawn:]), timeout=60), lines
            assert (
                lines[drawn:] == ["  " + lines[-1].strip()] and "failure_rate  stall  chat-live: why stall" in lines[-1]
            )
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
        assert process.stderr is not None and process.stderr.read() == ""  # quietly: no traceback
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        reader.join(10)
        if process.stderr is not None:
            process.stderr.close()


def test_the_view_holds_the_latest_verdicts_only_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A week of a busy results topic is not held whole: past MAX_ROWS the oldest verdicts go, and the view says how
    many it counts."""
    import json as _json

    from tracejudge.consumer.cli import watch

    monkeypatch.setattr(watch, "MAX_ROWS", 3)
    view = watch.View("t")
    for i in range(5):
        record = {"result_id": f"r{i}", "conversation_id": f"c{i}", "metric": "failure_rate", "agent": "a"}
        view.add(_json.dumps({**record, "outcome": "judged", "verdict": "hallucination", "reason": "x"}).encode())
    assert list(view.rows) == ["r2", "r3", "r4"] and view.forgotten == 2
    assert "counting the latest 3 verdicts (2 older ones not held)" in view.render()


def test_a_rubric_file_judge_is_watched_by_name_with_its_own_verdicts(broker: EmbeddedBroker) -> None:
    """`--metric` takes any judge name (a rubric file's: no fixed choices) and `--verdict` its labels; a verdict
    no built-in gives is still refused when only built-ins are named."""
    topic = f"results-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 1)
    writer = KafkaWriter(broker.bootstrap_servers, topic, durable=True).start()
    try:
        sink = ResultsTopic(writer, [*METRICS, "refund_policy"])
        events = []
        for conversation, label in (("chat-r1", "violation"), ("chat-r2", "compliant"), ("chat-r3", "violation")):
            result = verdict("refund_policy", label, 0.0 if label == "violation" else 1.0)
            result.reason = f"{conversation}: why {label}"
            events += sink.emit(Judgement(job(conversation, "refunds"), "judged", [result]))
        assert all(event.wait(30) for event in events)
    finally:
        writer.close(5)
    base = ("--once", "--bootstrap-servers", broker.bootstrap_servers, "--results-topic", topic)
    done = watch(*base, "--metric", "refund_policy", "--verdict", "violation")
    assert done.returncode == 0, done.stderr
    rows = sorted(
        line.split("  ")[2:6] for line in done.stdout.splitlines() if line.startswith("  ") and "chat-" in line
    )
    assert rows == [
        ["chat-r1", "refunds", "refund_policy", "violation"],
        ["chat-r3", "refunds", "refund_policy", "violation"],
    ], done.stdout
    wrong = watch(*base, "--metric", "failure_rate", "--verdict", "violation")
    assert wrong.returncode == 2 and wrong.stdout == ""
    (line,) = wrong.stderr.splitlines()
    assert line.startswith("tracejudge watch: --verdict: unknown violation; known: ")
    bad = watch(*base, "--metric", "Refund-Policy")
    assert bad.returncode == 2 and "is not a judge name" in bad.stderr and "Traceback" not in bad.stderr
