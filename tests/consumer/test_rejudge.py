"""`tracejudge rejudge`: which failures it selects (the last outcome per conversation and metric, the filters, those
already requested), and the whole story through real `tracejudge consume` processes: a judge whose model is not
found fails every conversation for good; fixed, `rejudge` has each judged once, and a second run judges nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.test_state_windows import Replica, Turns, calls_by_conversation, results_by_conversation, settle
from tests.support.judge_server import JudgeServer, Reply, verdict
from tests.support.pipeline import ROOT, wait_for
from tracejudge.consumer.cli.rejudge import Filters, failure_id, select_failed
from tracejudge.consumer.embedded_broker import EmbeddedBroker


def record(cid: str, outcome: str, *, metric: str = "failure_rate", content: str = "c1", **extra: Any) -> dict:
    return {
        "result_id": f"{cid}-{metric}-{content}-{outcome}",
        "conversation_id": cid,
        "content_id": f"{cid}:{content}",
        "metric": metric,
        "agent": extra.pop("agent", "support"),
        "outcome": outcome,
        "error_kind": extra.pop("error_kind", "bad_request" if outcome == "failed" else None),
        "judged_at": extra.pop("judged_at", "2026-12-05T12:00:00+00:00"),
        "shadow": False,
        **extra,
    }


def test_only_a_last_outcome_of_failed_is_selected() -> None:
    records = [
        record("a", "failed"),  # failed, then judged since: not selected
        record("a", "judged"),
        record("b", "retrying"),  # retrying, then failed for good: selected
        record("b", "failed"),
        record("c", "failed"),  # failed, then retrying again: not final, not selected
        record("c", "retrying"),
        record("d", "empty"),  # no text to judge: a judge cannot fix it
        record("e", "failed", shadow=True),  # a shadow judge's result is never a production outcome
        record("f", "failed", metric="failure_rate"),  # two metrics failed: one re-judgement of the transcript
        record("f", "failed", metric="conversational_flow"),
    ]
    chosen = select_failed(records, Filters(), set())
    assert sorted(f.conversation_id for f in chosen) == ["b", "f"]
    assert len(next(f for f in chosen if f.conversation_id == "f").result_ids) == 2


def test_the_filters_and_what_was_already_requested() -> None:
    records = [
        record("a", "failed", agent="support", error_kind="bad_request", judged_at="2026-12-05T10:00:00+00:00"),
        record("b", "failed", agent="billing", error_kind="auth", judged_at="2026-12-05T11:00:00+00:00"),
        record("c", "failed", agent="support", error_kind="auth", judged_at="2026-12-05T12:00:00+00:00"),
    ]

    def ids(filters: Filters, done: frozenset[str] = frozenset()) -> list[str]:
        return sorted(f.conversation_id for f in select_failed(records, filters, set(done)))

    assert ids(Filters(reasons=frozenset({"auth"}))) == ["b", "c"]
    assert ids(Filters(agents=frozenset({"support"}))) == ["a", "c"]
    assert ids(Filters(since=datetime(2026, 12, 5, 11, tzinfo=UTC))) == ["b", "c"]
    assert ids(Filters(until=datetime(2026, 12, 5, 11, tzinfo=UTC))) == ["a"]
    assert ids(Filters(), frozenset({failure_id(records[1])})) == ["a", "c"]  # requested by an earlier run
    failed_again = {**records[1], "judged_at": "2026-12-05T13:00:00+00:00"}  # judged again, failed again: a new failure
    assert [f.conversation_id for f in select_failed([failed_again], Filters(), {failure_id(records[1])})] == ["b"]


def rejudge(broker: EmbeddedBroker, group: str, results: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "rejudge", "--bootstrap-servers", broker.bootstrap_servers,
         "--group-id", group, "--results-topic", results, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


@pytest.mark.serial
def test_a_wrong_model_fixed_then_every_failed_conversation_judged_once(
    broker: EmbeddedBroker, judge_server: JudgeServer, tmp_path: Path
) -> None:
    topic = f"rj-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, 3)
    results = f"{topic}-results"
    broker.create_topic(results, 1)
    group = f"rj-{uuid.uuid4().hex[:6]}"
    # a model the provider does not know: 404, a reason no retry can pass, so every conversation fails for good
    judge_server.fail(Reply(status=404, content=json.dumps({"error": {"message": "model 'gpt-wrong' not found"}})))
    replica = Replica(broker, topic, group, results, tmp_path / "a.log", TRACEJUDGE_JUDGE_CHECK="false")
    try:
        _story(broker, judge_server, replica, topic, group, results)
    finally:
        replica.stop("term")


def _story(
    broker: EmbeddedBroker, judge_server: JudgeServer, replica: Replica, topic: str, group: str, results: str
) -> None:
    replica.ready()
    ids = [f"r{i}" for i in range(4)]
    turns = Turns(broker.bootstrap_servers, topic)
    for cid in ids:
        turns.turn(cid, 1, indexed=True)
        turns.end(cid)
    turns.flush()

    def last_outcomes() -> dict[str, str]:
        return {cid: found[-1]["outcome"] for cid, found in results_by_conversation(broker, results).items()}

    wait_for(lambda: all(last_outcomes().get(c) == "failed" for c in ids), 120, "every conversation failed for good")
    command = f"tracejudge rejudge --group-id {group}"  # the failure line names the command
    wait_for(lambda: command in replica.log.read_text(), 30, "the failure line")
    failed_before = replica.metric("tracejudge_sessions_total", outcome="failed")
    assert failed_before >= len(ids)

    dry = rejudge(broker, group, results, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"{len(ids)} conversations would be judged again" in dry.stdout and "estimated judge cost" in dry.stdout
    settle(judge_server, quiet_s=2.0)
    calls_before = calls_by_conversation(judge_server)

    judge_server.recover()
    judge_server.responder = lambda request: verdict("honest_fallback", reason="fixed")
    first = rejudge(broker, group, results)
    assert first.returncode == 0, first.stderr
    assert f"{len(ids)} conversations sent to be judged again" in first.stdout
    # At once, before any new outcome reached the results topic (the last outcomes still read `failed`): the requests
    # recorded by the first run keep a second run from sending them again.
    again = rejudge(broker, group, results)
    assert again.returncode == 0 and "no conversation to judge again" in again.stdout, (again.stdout, again.stderr)
    wait_for(lambda: all(last_outcomes().get(c) == "judged" for c in ids), 120, "every conversation judged again")
    settle(judge_server, quiet_s=3.0)
    calls = calls_by_conversation(judge_server)
    assert all(len(calls[c]) == len(calls_before.get(c, [])) + 1 for c in ids), (calls_before, calls)
    wait_for(
        lambda: replica.metric("tracejudge_sessions_total", outcome="judged") >= len(ids), 30, "the verdicts counted"
    )

    second = rejudge(broker, group, results)
    assert second.returncode == 0, second.stderr
    assert "no conversation to judge again" in second.stdout
    settle(judge_server, quiet_s=3.0)
    assert calls_by_conversation(judge_server) == calls  # nothing judged twice
