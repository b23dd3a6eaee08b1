"""`tracejudge explain`: a judged, a sampled-out, a failed, a retrying, a continued and an unknown conversation, told
from what Kafka holds by the real command, checked against what the judge server answered."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.judge_server import JudgeServer, Reply, conversation_text, verdict
from tests.support.pipeline import (
    ROOT,
    RunningConsumer,
    consumer_process,
    consumer_settings,
    play,
    read_all,
    traced_app,
    wait_for,
)
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.judging.sampling import sample_point


def respond(request: dict[str, Any]) -> Reply:
    text = conversation_text(request)
    if "exp fail" in text:
        return Reply(status=401, content="invalid api key")
    if "exp retry" in text:
        return Reply(status=503, content="down")
    label = "hallucination" if "exp judged" in text else "honest_fallback"
    first = "exp judged" if "exp judged" in text else "exp cont"
    return verdict(label, reason=f"scripted for {first}", evidence=[f"turn 1: {first}"])


def explain(bootstrap: str, group: str, results: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "TRACEJUDGE_GROUP_ID": group,
        "TRACEJUDGE_RESULTS_TOPIC": results,
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "explain", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def story(bootstrap: str, group: str, results: str, conversation_id: str) -> dict[str, Any]:
    done = explain(bootstrap, group, results, conversation_id, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def outcomes(broker: EmbeddedBroker, topic: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for record in read_all(broker.bootstrap_servers, topic, timeout_s=20):
        value = json.loads(record.value)
        found.setdefault(value["conversation_id"], []).append(value["outcome"])
    return found


def last(entry: dict[str, Any]) -> dict[str, Any]:
    return entry["metrics"]["failure_rate"][-1]


@pytest.mark.timeout(900)  # a real consumer and seven `tracejudge explain` processes
def test_explain_tells_each_conversations_story(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = respond
    results, group = f"{topic}-results", f"explain-{uuid.uuid4().hex[:6]}"
    broker.create_topic(results, 1)
    provider = traced_app(broker.bootstrap_servers, topic)
    log = tmp_path / "consume.log"
    process = consumer_process(
        broker,
        topic,
        group,
        results,
        log=log,
        TRACEJUDGE_AGENT_SAMPLE_RATES="sampled=0",
        TRACEJUDGE_JUDGE_RETRIES="0",
        TRACEJUDGE_JUDGE_RETRY_BACKOFF="10m",  # the retrying conversation stays retrying while we look
    )
    bootstrap = broker.bootstrap_servers
    try:
        play(provider, {"exp-judged": [("exp judged q0.", "a0"), ("exp judged q1.", "a1")]})
        play(provider, {"exp-sampled": [("exp sampled q0.", "a0")]}, agent="sampled")
        play(provider, {"exp-fail": [("exp fail q0.", "a0")], "exp-retry": [("exp retry q0.", "a0")]})
        play(provider, {"exp-cont": [("exp cont q0.", "a0")]})
        wanted = {
            "exp-judged": "judged",
            "exp-sampled": "sampled_out",
            "exp-fail": "failed",
            "exp-retry": "retrying",
            "exp-cont": "judged",
        }
        wait_for(
            lambda: all(want in outcomes(broker, results).get(cid, []) for cid, want in wanted.items()),
            timeout=180,
            what="every conversation's outcome on the results topic",
        )
        play(provider, {"exp-cont": [("exp cont q1, later.", "a1")]})  # the conversation goes on: a continuation
        wait_for(lambda: outcomes(broker, results)["exp-cont"].count("judged") == 2, timeout=120, what="continued")

        judged = story(bootstrap, group, results, "exp-judged")
        assert [t["input"] for t in judged["turns"]] == ["exp judged q0.", "exp judged q1."]
        assert judged["completed_by"] == "end_marker" and judged["agent"] == "support" and judged["trace_ids"]
        assert judged["sampling"]["sampled_in"] is True and not judged["continued"]
        (entry,) = judged["judgements"]
        final = last(entry)
        answered = [r for r in judge_server.requests if "exp judged" in conversation_text(r)]
        assert len(answered) == 1  # what the server was asked once, and answered: the story's verdict
        assert final["outcome"] == "judged" and final["verdict"] == "hallucination"
        assert final["reason"] == "scripted for exp judged" and final["evidence"] == ["turn 1: exp judged"]
        assert final["model"] == "gpt-4o-mini" and final["rubric_version"].startswith("failure_rate@")
        assert len(final["result_id"]) == 32 and final["delay_s"] >= 0
        text = explain(bootstrap, group, results, "exp-judged")
        assert text.returncode == 0 and "judged hallucination" in text.stdout and "end_marker" in text.stdout

        sampled = story(bootstrap, group, results, "exp-sampled")
        assert sampled["sampling"] == {
            "sample_point": round(sample_point("exp-sampled"), 6),
            "sampled_in": False,
            "rate": 0.0,
        }
        assert last(sampled["judgements"][0])["outcome"] == "sampled_out"
        assert not any("exp sampled" in conversation_text(r) for r in judge_server.requests)

        failed = story(bootstrap, group, results, "exp-fail")
        assert last(failed["judgements"][0])["outcome"] == "failed"
        assert last(failed["judgements"][0])["error_kind"] == "auth"

        retrying = story(bootstrap, group, results, "exp-retry")
        attempt = last(retrying["judgements"][0])
        assert attempt["outcome"] == "retrying" and attempt["retry_reason"] == "server_error"
        assert attempt["attempt"] == 1 and attempt["next_attempt_at"] < attempt["retry_until"]
        assert any("exp retry" in conversation_text(r) for r in judge_server.requests)  # answered 503

        continued = story(bootstrap, group, results, "exp-cont")
        assert continued["continued"] and len(continued["judgements"]) == 2
        assert [last(e)["outcome"] for e in continued["judgements"]] == ["judged", "judged"]
        assert len({last(e)["result_id"] for e in continued["judgements"]}) == 2
        assert len(continued["turns"]) == 2
        assert sum("exp cont" in conversation_text(r) for r in judge_server.requests) == 2

        unknown = explain(bootstrap, group, results, "no-such-conversation")
        assert unknown.returncode == 1 and unknown.stdout == ""
        assert len(unknown.stderr.strip().splitlines()) == 1 and "no-such-conversation" in unknown.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
            print(log.read_text()[-20000:])
    provider.shutdown()


@pytest.mark.timeout(600)  # a consumer and one `tracejudge explain` process
def test_explain_shows_the_verdict_reason_and_evidence_in_the_quickstart_as_written(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    """The consumer with no results flag writes `<group>-results`; `explain` with --group-id alone (no results flag,
    no variable) finds it and shows each judgement's verdict, reason and evidence, and no unknown field as `None`."""
    judge_server.responder = respond
    settings = consumer_settings(broker.bootstrap_servers, topic, metrics="failure_rate")
    assert settings.results_topic is None
    with RunningConsumer(settings) as consumer:
        play(traced_app(broker.bootstrap_servers, topic), {"exp-judged": [("exp judged q0.", "a0")]})
        wait_for(lambda: consumer.sessions("judged") == 1, timeout=120, what="the conversation judged")
    env = {key: value for key, value in os.environ.items() if not key.startswith("TRACEJUDGE_")}
    where = ["--bootstrap-servers", broker.bootstrap_servers, "--group-id", settings.group_id]
    done = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "explain", "exp-judged", *where],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    judged = next(i for i, line in enumerate(lines) if line.startswith("  failure_rate: judged hallucination"))
    assert lines[judged + 1] == "    reason: scripted for exp judged", done.stdout
    assert lines[judged + 2] == "    evidence: 'turn 1: exp judged'", done.stdout
    assert "None" not in done.stdout, done.stdout
    assert done.stdout.count("snapshot 1: version 1, content ") == 1, done.stdout


@pytest.mark.timeout(300)
def test_no_results_writes_no_results_topic_and_says_what_is_lost(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, caplog: pytest.LogCaptureFixture
) -> None:
    from tracejudge.consumer.emit.results_topic import NO_RESULTS_NOTICE
    from tracejudge.consumer.kafka import KafkaClients
    from tracejudge.consumer.kafka.topics import InternalTopics

    judge_server.responder = respond
    caplog.set_level(logging.INFO, logger="tracejudge.consumer")
    settings = consumer_settings(broker.bootstrap_servers, topic, metrics="failure_rate", no_results=True)
    assert settings.results_topic_name() is None
    with RunningConsumer(settings) as consumer:
        play(traced_app(broker.bootstrap_servers, topic), {"exp-judged": [("exp judged q0.", "a0")]})
        wait_for(lambda: consumer.sessions("judged") == 1, timeout=120, what="the conversation judged")
    said = [r.getMessage() for r in caplog.records if "--no-results" in r.getMessage()]
    assert said == [NO_RESULTS_NOTICE] and "explain" in said[0] and "export" in said[0], said
    with KafkaClients.from_settings(settings).admin() as admin:
        on_broker = set(admin.list_topics())
    assert InternalTopics(settings.group_id).judge_queue in on_broker
    assert InternalTopics(settings.group_id).results not in on_broker


def test_explain_without_a_broker_is_one_line_and_69() -> None:
    done = explain("127.0.0.1:1", "g", "results", "any")
    assert done.returncode == 69, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stdout == ""


def test_a_sampled_out_conversation_whose_job_is_not_read_yet_is_not_blamed_on_the_results_topic() -> None:
    """The owner records "sampled_out" as it sends the job: until the judge worker reads it, the results topic holds
    nothing of it, and the story says the worker may not have read it (not only a missing --results-topic)."""
    from types import SimpleNamespace

    from tracejudge.consumer.adapters import ConversationEvent, Turn
    from tracejudge.consumer.cli.explain import build_story, print_story
    from tracejudge.consumer.conversation.table import ConversationTable
    from tracejudge.consumer.streams import records as R

    table = ConversationTable()
    table.apply(ConversationEvent("c", "a", turn=Turn("s0", "t", "", 1, 2, "q", "a", index=0)), 1000)
    table.apply(ConversationEvent("c", "a", ended=True), 1001)
    (dispatch,) = table.take_dispatches()
    table.verdict("c", dispatch.job.content_id, "sampled_out", 1001)  # as Processor.dispatch records it
    state = table.get("c")
    assert state is not None
    kind, value = R.encode_state(state)
    story = build_story("c", [SimpleNamespace(value=value, headers=R.header(kind), timestamp=1001)], [])
    why = story["judgements"][0]["why_none"]
    assert "the judge worker has not read its job" in why, why
    # Known from the changelog only: the content id, not the version: the story omits it, never `version None`.
    out = io.StringIO()
    print_story(story, out)
    assert "None" not in out.getvalue() and f"snapshot 1: content {dispatch.job.content_id}" in out.getvalue()
    # A results record with unknown fields (an older writer): the verdict and reason without a `None` in their place.
    bare = {"conversation_id": "c", "metric": "failure_rate", "outcome": "judged", "verdict": "stall", "reason": "r"}
    out = io.StringIO()
    print_story(build_story("c", [], [bare]), out)
    text = out.getvalue()
    assert "None" not in text and "  failure_rate: judged stall\n    reason: r\n    evidence: (none quoted)" in text
