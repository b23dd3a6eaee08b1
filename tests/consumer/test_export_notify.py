"""From a verdict to action, through the real consumer and a judge server scripted per conversation.

30 conversations, 7 judged hallucination: `tracejudge export --verdict hallucination` (the real CLI) writes exactly
those 7 with their turns as the judge server saw them; the generated pytest file passes against a judge answering the
same verdicts and fails when one answer changes; a webhook receiver gets exactly 7 signed CloudEvents; a receiver
that refuses for a while still gets every event, late, while judging goes on.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_http_event

from tests.support.judge_server import JudgeServer, Reply, conversation_text, metric_of
from tests.support.pipeline import RunningConsumer, consumer_settings, play, result_records, traced_app, wait_for
from tests.support.webhook_receiver import WebhookReceiver
from tracejudge.consumer.cli import main
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit.notify import SIGNATURE_HEADER, verify
from tracejudge.metrics.dataset import load_conversations
from tracejudge.metrics.transcript import END, START

SECRET = "whsec-test"
COUNT, HALLUCINATED = 30, (1, 4, 9, 13, 17, 22, 28)


def conversations() -> dict[str, list[tuple[str, str]]]:
    """Two turns each; the first carries an e-mail address the redactor replaces before the judge sees it."""
    return {
        f"conv-{i:02d}": [
            (f"conv-{i:02d}: my mail is user{i}@example.com, where is order {i}?", f"Order {i} ships tomorrow."),
            (f"conv-{i:02d}: and the refund?", "Refunds take 5 days." if i not in HALLUCINATED else "Refunded: $1M."),
        ]
        for i in range(COUNT)
    }


def conversation_of(request: dict[str, Any]) -> str:
    match = re.search(r"conv-\d\d", conversation_text(request))
    assert match, "a judge request without a conversation id"
    return match.group(0)


def scripted(overrides: dict[str, str] | None = None) -> Any:
    """hallucination for the HALLUCINATED conversations, honest_fallback for the rest; `overrides` per id."""

    def respond(request: dict[str, Any]) -> Reply:
        assert metric_of(request) == "failure_rate"
        conversation = conversation_of(request)
        label = "hallucination" if int(conversation[-2:]) in HALLUCINATED else "honest_fallback"
        label = (overrides or {}).get(conversation, label)
        return Reply(content=json.dumps({"verdict": label, "evidence": ["$1M"], "reason": f"scripted {label}"}))

    return respond


def judged_turns(request: dict[str, Any]) -> list[dict[str, str]]:
    """The turns the judge server was sent: the JSON array between the conversation markers."""
    text = conversation_text(request)
    body = text[text.index(START) + len(START) : text.rindex(END)]
    return [
        {"input": t["user"], "actual_output": t["assistant"]}
        for t in json.loads(body)
        if isinstance(t, dict) and "turn" in t
    ]


def run_suite(test_file: Path, judge_server: JudgeServer) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-local"}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(test_file),
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(test_file.parent),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=test_file.parent,
    )


@pytest.mark.timeout(900)  # a real consumer, and the generated suite run twice in a subprocess
def test_export_regression_suite_and_signed_notifications(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = scripted()
    results = f"{topic}-results"
    broker.create_topic(results, 1)
    settings = consumer_settings(
        broker.bootstrap_servers,
        topic,
        metrics="failure_rate",
        judge_timeout=30.0,
        results_topic=results,
        results_transcript=True,
        notify_url=[],
        notify_secret=SECRET,
        trace_url_template="http://tempo.local:3200/trace/{trace_id}",
    )
    hallucinated = {f"conv-{i:02d}" for i in HALLUCINATED}
    with WebhookReceiver() as receiver:
        settings = settings.model_copy(update={"notify_url": [receiver.url]})
        with RunningConsumer(settings) as consumer:
            play(traced_app(broker.bootstrap_servers, topic), conversations())
            wait_for(lambda: consumer.sessions("judged") == COUNT, what="30 judged conversations", timeout=180)
            wait_for(lambda: len(receiver.accepted()) >= len(hallucinated), what="7 notifications", timeout=120)
            wait_for(lambda: consumer.value("tracejudge_notifications_total", outcome="delivered") == 7, what="count")
        records = result_records(broker, results, COUNT)
    seen_by_judge = {conversation_of(r): judged_turns(r) for r in judge_server.requests}
    assert len(seen_by_judge) == COUNT
    # Exactly 7 CloudEvents, each signed, one per hallucination result id, the link built from the template.
    by_id = {r["result_id"]: r for r in records if r["verdict"] == "hallucination"}
    assert {r["conversation_id"] for r in by_id.values()} == hallucinated
    events = []
    for delivery in receiver.accepted():
        assert verify(SECRET, delivery.body, delivery.headers[SIGNATURE_HEADER.lower()])
        assert delivery.headers["content-type"].startswith("application/cloudevents+json")
        events.append(from_http_event(HTTPMessage(delivery.headers, delivery.body)))
    assert len(events) == 7 and {e.get_id() for e in events} == set(by_id)
    for event in events:
        record = by_id[event.get_id()]
        assert event.get_specversion() == "1.0" and event.get_type() == "dev.tracejudge.verdict"
        assert event.get_subject() == record["conversation_id"]
        data = event.get_data()
        assert isinstance(data, dict) and data["result"]["verdict"] == "hallucination"
        assert data["trace_url"] == f"http://tempo.local:3200/trace/{record['trace_id']}"
        assert "transcript" not in data["result"]  # conversation text never leaves in a notification

    # The export: exactly the 7, their turns as the judge server saw them (redacted: no address left).
    dataset, suite = tmp_path / "hallucinations.jsonl", tmp_path / "test_hallucinations.py"
    argv = ["export", "--bootstrap-servers", broker.bootstrap_servers, "--results-topic", results]
    assert main([*argv, "--verdict", "hallucination", "--output", str(dataset), "--pytest", str(suite)]) == 0
    lines = [json.loads(line) for line in dataset.read_text().splitlines()]
    assert sorted(line["conversation_id"] for line in lines) == sorted(hallucinated)
    for line in lines:
        assert line["turns"] == seen_by_judge[line["name"]]
        assert "@example.com" not in json.dumps(line["turns"]) and len(line["turns"]) == 2
        record = by_id[line["result_id"]]
        assert (line["verdict"], line["reason"], line["evidence"]) == (
            "hallucination",
            "scripted hallucination",
            ["$1M"],
        )
        assert (line["model"], line["rubric_version"], line["trace_id"]) == (
            record["model"], record["rubric_version"], record["trace_id"]
        )  # fmt: skip
    cases = load_conversations(dataset)  # the documented call
    assert [c.name for c in cases] == [line["name"] for line in lines] and cases[0].turns[0].input

    # The regression suite: passes while the judge answers as it did, the same transcripts sent again; one changed
    # answer fails exactly that conversation.
    judge_server.requests.clear()
    passed = run_suite(suite, judge_server)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "7 passed" in passed.stdout
    assert {conversation_of(r): judged_turns(r) for r in judge_server.requests} == {
        c: seen_by_judge[c] for c in hallucinated
    }
    judge_server.responder = scripted({"conv-13": "stall"})
    failed = run_suite(suite, judge_server)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "1 failed, 6 passed" in failed.stdout and "conv-13" in failed.stdout


def test_export_without_transcripts_says_what_to_switch_on_and_writes_nothing(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path, capsys: Any
) -> None:
    """The consumer as the quickstart runs it (no results flag: `<group>-results`, no transcript); export finds the
    topic from --group-id alone, and with nothing to export says in one line what to switch on (exit 2), never an
    empty file."""
    judge_server.responder = scripted()
    settings = consumer_settings(broker.bootstrap_servers, topic, metrics="failure_rate")
    assert settings.results_topic is None and not settings.results_transcript
    with RunningConsumer(settings) as consumer:
        play(traced_app(broker.bootstrap_servers, topic), dict(list(conversations().items())[:5]))
        wait_for(lambda: consumer.sessions("judged") == 5, what="5 judged conversations", timeout=120)
    dataset, suite = tmp_path / "out.jsonl", tmp_path / "test_out.py"
    argv = ["export", "--bootstrap-servers", broker.bootstrap_servers, "--group-id", settings.group_id]
    capsys.readouterr()
    assert main([*argv, "--verdict", "hallucination", "--output", str(dataset), "--pytest", str(suite)]) == 2
    assert not dataset.exists() and not suite.exists()
    out, err = capsys.readouterr()
    (line,) = err.strip().splitlines()
    assert out == "" and line.startswith("tracejudge export: 2 matching results carry no transcript"), line
    assert "`tracejudge consume` with --results-transcript (TRACEJUDGE_RESULTS_TRANSCRIPT=true)" in line
    # Every verdict is there to read, with its reason, from the group id alone: what matched is only the transcript.
    assert main([*argv, "--output", str(dataset)]) == 2 and "5 matching results" in capsys.readouterr().err


@pytest.mark.timeout(900)  # a real consumer, and the generated suite run twice in a subprocess
def test_a_refusing_endpoint_gets_every_event_late_and_slows_no_judgement(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    judge_server.responder = scripted()
    with WebhookReceiver(status=500) as receiver:
        settings = consumer_settings(
            broker.bootstrap_servers, topic, metrics="failure_rate", notify_url=[receiver.url], notify_retry_for=300.0
        )
        with RunningConsumer(settings) as consumer:
            play(traced_app(broker.bootstrap_servers, topic), conversations())
            # Every conversation is judged while the endpoint refuses: a failing endpoint never holds up judging.
            wait_for(
                lambda: consumer.sessions("judged") == COUNT, what="30 judged while the endpoint fails", timeout=180
            )
            wait_for(lambda: receiver.refused() >= 14, what="each notification refused and retried")
            # The receiver counts a refusal before the consumer has read the 500 back: wait for the counter too.
            wait_for(
                lambda: consumer.value("tracejudge_output_errors_total", output="notify") >= 14,
                what="each refusal counted as an output error",
            )
            assert receiver.accepted() == []
            assert consumer.value("tracejudge_notifications_pending") == 7
            receiver.status = 200
            wait_for(lambda: consumer.value("tracejudge_notifications_total", outcome="delivered") == 7, what="late")
        ids = [json.loads(d.body)["id"] for d in receiver.accepted()]
        assert len(ids) == 7 and len(set(ids)) == 7
        assert consumer.value("tracejudge_notifications_total", outcome="given_up") == 0


@pytest.mark.timeout(900)  # a real consumer, and the generated suite run twice in a subprocess
def test_a_restart_that_replays_the_judged_conversations_notifies_none_twice(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    """Real `tracejudge consume` processes. No commit is made (--commit-interval 3600) and the first is killed -9
    after its 7 deliveries: the second replays every judge job, re-judges it (the same result ids), and the
    delivered ids it read back from `<group>-notifications` keep it from notifying any of them again."""
    from tests.reliability.test_state_windows import Replica

    judge_server.responder = scripted()
    results, group = f"{topic}-results", f"tj-{topic}"
    broker.create_topic(results, 1)
    with WebhookReceiver() as receiver:
        env = {
            "TRACEJUDGE_NOTIFY_URL": receiver.url,
            "TRACEJUDGE_NOTIFY_SECRET": SECRET,
            "TRACEJUDGE_COMMIT_INTERVAL": "3600",
            "TRACEJUDGE_SESSION_IDLE_TIMEOUT": "30",
        }
        first = Replica(broker, topic, group, results, tmp_path / "first.log", **env)
        try:
            first.ready()
            play(traced_app(broker.bootstrap_servers, topic), conversations())
            wait_for(lambda: first.metric("tracejudge_notifications_total", outcome="delivered") == 7, 240, "7 sent")
            # The 7 hallucinations can be delivered before the last clean conversations are judged.
            wait_for(lambda: first.metric("tracejudge_sessions_total", outcome="judged") == COUNT, 240, "all judged")
        finally:
            first.stop("kill")
        judged_before = len(judge_server.requests)
        second = Replica(broker, topic, group, results, tmp_path / "second.log", **env)
        try:
            wait_for(
                lambda: second.metric("tracejudge_notifications_total", outcome="duplicate") == 7,
                300,
                "the replayed hallucinations recognised as delivered",
            )
            # As in the first run, the 7 hallucinations can be recognised before the clean conversations are judged.
            wait_for(lambda: second.metric("tracejudge_sessions_total", outcome="judged") == COUNT, 240, "all rejudged")
            assert len(judge_server.requests) >= judged_before + COUNT  # the replay was judged again
            assert second.metric("tracejudge_notifications_total", outcome="delivered") == 0
        finally:
            second.stop()
    ids = [json.loads(d.body)["id"] for d in receiver.accepted()]
    assert len(ids) == 7 and len(set(ids)) == 7
    assert all(verify(SECRET, d.body, d.headers[SIGNATURE_HEADER.lower()]) for d in receiver.accepted())


def _first_offsets_of(bootstrap: str, topic: str, conversations: set[str]) -> dict[int, int]:
    """Per partition, the offset of the first record naming one of `conversations` (in its key or value), else the
    partition's high watermark: where a consumer holding those uncommitted commits to."""
    from kafka import KafkaConsumer, TopicPartition

    from tracejudge.consumer.kafka.reader import records_to_end

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        first: dict[int, int] = {}
        for record in records_to_end(consumer, partitions, what=topic, stall_s=30):
            named = (record.key or b"") + b"\x00" + (record.value or b"")
            if record.partition not in first and any(c.encode() in named for c in conversations):
                first[record.partition] = record.offset
        return {tp.partition: first.get(tp.partition, consumer.highwater(tp) or 0) for tp in partitions}
    finally:
        consumer.close()


def _committed(bootstrap: str, topic: str, group: str, partitions: list[int]) -> dict[int, int]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return {p: consumer.committed(TopicPartition(topic, p)) or 0 for p in partitions}
    finally:
        consumer.close()


@pytest.mark.timeout(600)
def test_notifications_still_failing_at_a_stop_keep_their_conversations_uncommitted_and_a_restart_sends_them(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    """At least once across a stop: the endpoint refuses (500) until the consumer stops; the consumer commits up to
    the first record of a conversation whose notification is pending, never past it; the restart, the endpoint
    healthy, sends all 7."""
    judge_server.responder = scripted()
    with WebhookReceiver(status=500) as receiver:
        settings = consumer_settings(
            broker.bootstrap_servers, topic, metrics="failure_rate", notify_url=[receiver.url], notify_retry_for=300.0
        )
        with RunningConsumer(settings) as first:
            play(traced_app(broker.bootstrap_servers, topic), conversations())
            wait_for(lambda: first.sessions("judged") == COUNT, what="30 judged", timeout=180)
            wait_for(lambda: receiver.refused() >= 7, what="refused")
            pending = {f"conv-{i:02d}" for i in HALLUCINATED}
            group, queue, judges = settings.group_id, f"{settings.group_id}-judge-queue", f"{settings.group_id}-judges"
            # The barrier: every input record committed (state and jobs durable), and the judge queue committed up to
            # the first job of a conversation whose notification is pending, every job before it committed.
            inputs = _first_offsets_of(broker.bootstrap_servers, topic, set())  # the high watermarks
            expected = _first_offsets_of(broker.bootstrap_servers, queue, pending)
            seen: list[tuple[dict[int, int], dict[int, int]]] = []

            def committed_up_to_the_pending() -> bool:
                seen.append(
                    (
                        _committed(broker.bootstrap_servers, topic, group, list(inputs)),
                        _committed(broker.bootstrap_servers, queue, judges, list(expected)),
                    )
                )
                return seen[-1] == (inputs, expected)

            try:
                wait_for(committed_up_to_the_pending, what="committed up to the pending conversations", timeout=90)
            except AssertionError:
                raise AssertionError(f"committed {seen[-1]}, expected {(inputs, expected)}") from None
            assert first.value("tracejudge_notifications_pending") == 7
        assert _committed(broker.bootstrap_servers, queue, judges, list(expected)) == expected  # nothing more at stop
        receiver.status = 200
        with RunningConsumer(settings):
            wait_for(
                lambda: len({json.loads(d.body)["id"] for d in receiver.accepted()}) == len(HALLUCINATED),
                what="all 7 delivered after the restart",
                timeout=240,
            )
    ids = [json.loads(d.body)["id"] for d in receiver.accepted()]
    assert len(set(ids)) == len(HALLUCINATED)
