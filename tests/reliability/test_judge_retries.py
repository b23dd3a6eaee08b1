"""Judge outages delay verdicts instead of losing them: real `tracejudge consume` processes on the embedded broker,
a judge server failing on command (503 for longer than the in-call retries, 401, an outage past the horizon)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.judge_server import JudgeServer, Reply, conversation_text
from tests.support.pipeline import consumer_process, play, read_all, scrape_logged, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker

DOWN = Reply(status=503, content="the judge is down")
FAST_RETRIES: dict[str, Any] = {
    "TRACEJUDGE_JUDGE_RETRIES": "1",  # in-call: one retry, under a second
    "TRACEJUDGE_JUDGE_RETRY_BACKOFF": "1s",  # durable: 1 s, 2 s, 4 s, ...
    "TRACEJUDGE_SESSION_IDLE_TIMEOUT": "30",
}


def conversations(prefix: str, count: int, turns: int = 2) -> dict[str, list[tuple[str, str]]]:
    return {f"{prefix}-{i}": [(f"{prefix} {i} q{t}.", f"a{t}") for t in range(turns)] for i in range(count)}


def results(broker: EmbeddedBroker, topic: str) -> list[dict[str, Any]]:
    return [json.loads(r.value) for r in read_all(broker.bootstrap_servers, topic, timeout_s=20)]


def by_outcome(records: list[dict[str, Any]], outcome: str) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record["outcome"] == outcome:
            found.setdefault(record["conversation_id"], []).append(record)
    return found


def judge_calls(server: JudgeServer, expected: dict[str, list[tuple[str, str]]]) -> Counter[str]:
    """How many answered judgement requests each conversation got (its first question is in the transcript)."""
    texts = [conversation_text(r) for r in list(server.requests)]
    return Counter({cid: sum(turns[0][0] in text for text in texts) for cid, turns in expected.items()})


def stop(process: subprocess.Popen, log: Path) -> str:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    output = log.read_text()
    print(output[-20000:])  # shown when the test fails
    return output


def retrying_gauge(log: Path) -> float | None:
    """tracejudge_judgements_retrying from the process's /metrics (its address is in its log)."""
    text = scrape_logged(log)
    if text is None:
        return None
    value = re.search(r"^tracejudge_judgements_retrying (\S+)$", text, re.M)
    return None if value is None else float(value.group(1))


def wait_retrying(broker: EmbeddedBroker, topic: str, expected: dict[str, Any], timeout: float = 240) -> None:
    missing: set[str] = set(expected)

    def every_one() -> bool:
        missing.intersection_update(set(expected) - set(by_outcome(results(broker, topic), "retrying")))
        return not missing

    try:
        wait_for(every_one, timeout=timeout, what="every conversation retrying")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: not retrying {sorted(missing)}") from None


def assert_judged_once_late(
    broker: EmbeddedBroker,
    topic: str,
    server: JudgeServer,
    expected: dict[str, Any],
    recovered_at: float,
    *,
    replayed: bool = False,
) -> None:
    """`replayed`: after a kill -9 a job whose offset was not committed is read again from the judge queue (no retry
    count of its own); its retry record's copy is then answered from it, without a call."""
    records = results(broker, topic)
    judged, retrying = by_outcome(records, "judged"), by_outcome(records, "retrying")
    assert not by_outcome(records, "failed"), "a conversation failed during an outage that passed"
    assert set(judged) == set(expected)
    # Judged once: one answered call each; duplicate records (a replay) carry the same deterministic result id.
    assert all(count == 1 for count in judge_calls(server, expected).values()), judge_calls(server, expected)
    assert all(len({r["result_id"] for r in judged[cid]}) == 1 for cid in expected)
    assert set(retrying) == set(expected)
    for cid in expected:
        record = judged[cid][0]
        if not replayed or record["attempt"] is not None:
            assert record["attempt"] >= 2 and record["retry_reason"] == "server_error"  # after a retrying attempt
        assert record["delay_s"] >= 1.0
        assert record["judged_at"] >= time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(recovered_at - 1))
        assert record["trace_ids"] and record["completed_at"] and record["completed_by"] == "end_marker"


@pytest.mark.timeout(600)
def test_an_outage_delays_verdicts_instead_of_losing_them(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    out, group = f"{topic}-results", f"retry-{uuid.uuid4().hex[:6]}"
    broker.create_topic(out, 1)
    expected = conversations("outage", 50)
    provider = traced_app(broker.bootstrap_servers, topic)
    judge_server.fail(DOWN)
    process = consumer_process(broker, topic, group, out, log=tmp_path / "process.log", **FAST_RETRIES)
    try:
        play(provider, expected)
        wait_retrying(broker, out, expected)
        log = tmp_path / "process.log"
        wait_for(lambda: (retrying_gauge(log) or 0) > 0, timeout=60, what="tracejudge_judgements_retrying above 0")
        refused = len(judge_server.refused)
        assert refused >= 2 * 50  # every conversation: the in-call retries spent, then durable retries
        recovered_at = time.time()
        judge_server.recover()
        wait_for(lambda: all(judge_calls(judge_server, expected).values()), timeout=240, what="all judged")
        wait_for(lambda: set(by_outcome(results(broker, out), "judged")) == set(expected), what="judged records")
        wait_for(lambda: retrying_gauge(log) == 0, timeout=60, what="tracejudge_judgements_retrying back to 0")
    finally:
        output = stop(process, tmp_path / "process.log")
    assert "next attempt at" in output and "check the provider's status" in output
    assert_judged_once_late(broker, out, judge_server, expected, recovered_at)
    provider.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_9_and_a_rebalance_during_the_outage_lose_no_retry(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    out, group = f"{topic}-results", f"retry9-{uuid.uuid4().hex[:6]}"
    broker.create_topic(out, 1)
    expected = conversations("kill9", 20)
    provider = traced_app(broker.bootstrap_servers, topic)
    judge_server.fail(DOWN)
    process = consumer_process(broker, topic, group, out, log=tmp_path / "process.log", **FAST_RETRIES)
    try:
        play(provider, expected)
        wait_retrying(broker, out, expected)
        process.kill()  # kill -9: retries wait in the retry topic, some mid-forward, some mid-judgement
        process.wait(10)
    finally:
        if process.poll() is None:
            process.kill()
        print((tmp_path / "process.log").read_text()[-20000:])
    # Two replicas come back (a rebalance splits the retry and judge-queue partitions); the judge comes back later.
    first = consumer_process(broker, topic, group, out, log=tmp_path / "first.log", **FAST_RETRIES)
    second = consumer_process(broker, topic, group, out, log=tmp_path / "second.log", **FAST_RETRIES)
    try:
        seen = len(judge_server.refused)
        wait_for(lambda: len(judge_server.refused) >= seen + 20, timeout=400, what="retries resumed after the restart")
        recovered_at = time.time()
        judge_server.recover()
        wait_for(lambda: all(judge_calls(judge_server, expected).values()), timeout=240, what="all judged")
        wait_for(lambda: set(by_outcome(results(broker, out), "judged")) == set(expected), what="judged records")
    finally:
        stop(first, tmp_path / "first.log")
        stop(second, tmp_path / "second.log")
    assert_judged_once_late(broker, out, judge_server, expected, recovered_at, replayed=True)
    provider.shutdown()


def test_a_reason_that_cannot_pass_fails_at_once(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    out, group = f"{topic}-results", f"auth-{uuid.uuid4().hex[:6]}"
    broker.create_topic(out, 1)
    expected = conversations("auth", 3)
    provider = traced_app(broker.bootstrap_servers, topic)
    judge_server.fail(Reply(status=401, content="invalid api key"))
    process = consumer_process(broker, topic, group, out, log=tmp_path / "process.log", **FAST_RETRIES)
    try:
        play(provider, expected)
        wait_for(lambda: set(by_outcome(results(broker, out), "failed")) == set(expected), timeout=120, what="3 failed")
    finally:
        stop(process, tmp_path / "process.log")
    records = results(broker, out)
    assert not by_outcome(records, "retrying")
    assert {r["error_kind"] for r in records} == {"auth"}
    assert len(judge_server.refused) == 3  # one call each: neither retried in the call nor durably
    provider.shutdown()


def test_past_the_horizon_a_conversation_fails_with_its_last_reason(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    out, group = f"{topic}-results", f"horizon-{uuid.uuid4().hex[:6]}"
    broker.create_topic(out, 1)
    expected = conversations("horizon", 5)
    provider = traced_app(broker.bootstrap_servers, topic)
    judge_server.fail(Reply(status=429, headers={"retry-after": "0.05"}, content="slow down"))
    env: dict[str, Any] = {**FAST_RETRIES, "TRACEJUDGE_JUDGE_RETRY_HORIZON": "4s"}
    process = consumer_process(broker, topic, group, out, log=tmp_path / "process.log", **env)
    try:
        play(provider, expected)
        wait_for(lambda: set(by_outcome(results(broker, out), "failed")) == set(expected), timeout=90, what="failed")
    finally:
        output = stop(process, tmp_path / "process.log")
    records = results(broker, out)
    failed, retrying = by_outcome(records, "failed"), by_outcome(records, "retrying")
    assert set(retrying) == set(expected)
    for cid in expected:
        (final,) = failed[cid]
        assert final["error_kind"] == "rate_limited" and final["retry_reason"] == "rate_limited"
        assert final["attempt"] >= 2 and final["attempt"] == len(retrying[cid]) + 1
        # The last attempt is made at the horizon, not after it.
        assert final["judged_at"] >= max(r["retry_until"] for r in retrying[cid])[:19]
    assert not by_outcome(records, "judged")
    assert "past the retry horizon" in output
    provider.shutdown()
