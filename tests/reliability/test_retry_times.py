"""Retries at their own times (issue 43): a real `tracejudge consume` process, a judge answering 503, three
conversations of one partition failing at staggered times. Each retry is attempted within a second of the time the
consumer promised for it (its `retrying` result's `next_attempt_at`, what `explain` shows), never held behind another
conversation's longer backoff (with one retry topic, attempts promised for 20:20:10 and 20:20:15 ran at 20:20:29); then
a kill -9 with retries waiting loses none of them."""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.test_judge_retries import DOWN, by_outcome, judge_calls, results, stop
from tests.support.judge_server import JudgeServer, conversation_text
from tests.support.pipeline import consumer_process, play, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker

ON_TIME_S = 1.0  # the bound: within a second of the promised time
RETRIES: dict[str, Any] = {
    "TRACEJUDGE_JUDGE_RETRIES": "0",  # one call per attempt: each attempt is one request at the judge
    "TRACEJUDGE_JUDGE_RETRY_BACKOFF": "1s",  # 1, 2, 4, 8, 16 s ...: the three chains interleave
    "TRACEJUDGE_JUDGE_RETRY_HORIZON": "180s",
    "TRACEJUDGE_SESSION_IDLE_TIMEOUT": "60",
}


def attempts(server: JudgeServer, first_question: str) -> list[float]:
    """When the judge received each (refused) request for the conversation whose first question this is."""
    return sorted(at for at, body in list(server.refused) if first_question in conversation_text(body))


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


@pytest.mark.timeout(600)
def test_each_retry_runs_at_its_own_promised_time_and_a_kill_9_loses_none(
    broker: EmbeddedBroker, judge_server: JudgeServer, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:6]
    topic, out, group = f"spans-{suffix}", f"results-{suffix}", f"times-{suffix}"
    broker.create_topic(topic, 1)  # one partition: the three share every retry partition
    broker.create_topic(out, 1)
    expected = {f"times-{name}": [(f"times {name} q0.", "a0"), (f"times {name} q1.", "a1")] for name in "abc"}
    provider = traced_app(broker.bootstrap_servers, topic)
    judge_server.fail(DOWN)
    log = tmp_path / "process.log"
    process = consumer_process(broker, topic, group, out, log=log, **RETRIES)
    try:
        # Staggered: b starts failing once a waits 16 s for its sixth attempt (b's first retries, written after that
        # record, are due before it), c once b is at its third attempt.
        first = {conversation: turns[0][0] for conversation, turns in expected.items()}
        for conversation, after, count in (("times-a", None, 0), ("times-b", "times-a", 5), ("times-c", "times-b", 3)):
            if after is not None:
                wait_for(
                    lambda q=first[after], n=count: len(attempts(judge_server, q)) >= n,  # type: ignore[misc]
                    timeout=120,
                    what=f"attempt {count} of {after}",
                )
            play(provider, {conversation: expected[conversation]})
        wait_for(lambda: len(attempts(judge_server, first["times-c"])) >= 5, timeout=120, what="c's fifth attempt")
        records = results(broker, out)
        written = sorted(
            (seconds(r["judged_at"]), seconds(r["next_attempt_at"])) for r in records if r["outcome"] == "retrying"
        )
        held, latest = [], 0.0  # one retry topic, read in write order: how late each would have been
        for _, due in written:
            held.append(max(0.0, latest - due))
            latest = max(latest, due)
        assert max(held) > 2 * ON_TIME_S, held  # a scenario one retry topic gets wrong
        checked, deviations = 0, []
        for conversation, turns in expected.items():
            asked = attempts(judge_server, turns[0][0])
            for record in by_outcome(records, "retrying")[conversation]:
                promised, failed_at = seconds(record["next_attempt_at"]), seconds(record["judged_at"])
                if promised > asked[-1] + ON_TIME_S:
                    continue  # not due yet
                actual = min(at for at in asked if at > failed_at)  # the next attempt after this one failed
                deviations.append(round(actual - promised, 3))
                assert abs(actual - promised) <= ON_TIME_S, (conversation, record["attempt"], promised, actual)
                checked += 1
        print("attempted minus promised, s:", deviations, "one topic's lateness, s:", [round(h, 1) for h in held])
        assert checked >= 10, checked  # every chain's first attempts, interleaved with the others'
        process.kill()  # kill -9 with every retry waiting in the retry topics
        process.wait(10)
    finally:
        if process.poll() is None:
            process.kill()
        print(log.read_text()[-20000:])
    before = {c: len(attempts(judge_server, turns[0][0])) for c, turns in expected.items()}
    restarted = consumer_process(broker, topic, group, out, log=tmp_path / "restarted.log", **RETRIES)
    try:
        wait_for(
            lambda: all(len(attempts(judge_server, t[0][0])) > before[c] for c, t in expected.items()),
            timeout=240,
            what="every retry resumed after the restart",
        )
        judge_server.recover()
        wait_for(lambda: all(judge_calls(judge_server, expected).values()), timeout=240, what="all judged")
        wait_for(lambda: set(by_outcome(results(broker, out), "judged")) == set(expected), what="judged records")
    finally:
        stop(restarted, tmp_path / "restarted.log")
    records = results(broker, out)
    assert not by_outcome(records, "failed")
    calls = judge_calls(judge_server, expected)
    assert all(count == 1 for count in calls.values()), calls  # judged once each, none lost
    provider.shutdown()
