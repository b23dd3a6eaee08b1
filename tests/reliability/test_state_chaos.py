"""Durable conversation state under the way production breaks, through real `tracejudge consume` processes on Tansu.

The judge server records the transcript of every call. 240 conversations of 3 turns each, the turns seconds apart so
conversations are open on every partition at every moment, while replicas join, get SIGTERM and kill -9 and rejoin:
every conversation is judged, no judge call ever sees a partial transcript, and each conversation and metric has
one result id (a redelivered duplicate carries the same id).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer, conversation_text
from tests.support.pipeline import consumer_process, read_all, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.tracer import end_conversation, traced_agent

# replicas joining, stopping and dying on a timed schedule: runs alone (tests/run_suite.py's serial phase)
pytestmark = pytest.mark.serial

CONVERSATIONS = 240
TURNS = 3
WAVES = 8
_QUESTION = re.compile(r"chaos (c\d+) q(\d)")


def judged_transcripts(server: JudgeServer) -> dict[str, list[set[int]]]:
    """For each conversation, the turn numbers each judge call saw."""
    seen: dict[str, list[set[int]]] = defaultdict(list)
    for request in list(server.requests):
        turns: dict[str, set[int]] = defaultdict(set)
        for cid, number in _QUESTION.findall(conversation_text(request)):
            turns[cid].add(int(number))
        for cid, numbers in turns.items():
            seen[cid].append(numbers)
    return seen


def produce_interleaved(bootstrap: str, topic: str, ids: list[str], *, wave_gap_s: float, turn_gap_s: float) -> None:
    """Waves of conversations; within a wave turn k of every conversation, then a pause, then turn k+1."""
    provider = traced_app(bootstrap, topic)

    @traced_agent("support", tracer_provider=provider)
    def respond(question: str, session_id: str) -> str:
        return "answer to " + question

    waves = [ids[i::WAVES] for i in range(WAVES)]

    def wave(members: list[str]) -> None:
        for k in range(1, TURNS + 1):
            for cid in members:
                respond(f"chaos {cid} q{k}", session_id=cid)
            provider.force_flush()
            time.sleep(turn_gap_s)
        for cid in members:
            end_conversation(cid, agent="support", tracer_provider=provider)
        provider.force_flush()

    threads = []
    for members in waves:
        thread = threading.Thread(target=wave, args=(members,), daemon=True)
        thread.start()
        threads.append(thread)
        time.sleep(wave_gap_s)
    for thread in threads:
        thread.join(120)
    provider.shutdown()


def stop(process: subprocess.Popen, how: str) -> None:
    if process.poll() is not None:
        return
    if how == "kill":
        process.kill()
    else:
        process.send_signal(signal.SIGTERM)
    process.wait(60)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_replicas_join_leave_and_die_without_losing_or_fragmenting(
    broker: EmbeddedBroker, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = scripted_judge
    topic = f"chaos-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, 6)
    results, group = f"{topic}-results", f"chaos-{uuid.uuid4().hex[:6]}"
    broker.create_topic(results, 1)
    ids = [f"c{i}" for i in range(CONVERSATIONS)]
    env = {"TRACEJUDGE_MAX_CONCURRENCY": "8", "TRACEJUDGE_SESSION_IDLE_TIMEOUT": "60"}
    logs = {name: tmp_path / f"replica-{name}.log" for name in "abc"}
    replicas = {"a": consumer_process(broker, topic, group, results, log=logs["a"], **env)}
    producer = threading.Thread(
        target=produce_interleaved,
        args=(broker.bootstrap_servers, topic, ids),
        kwargs={"wave_gap_s": 5.0, "turn_gap_s": 3.0},
        daemon=True,
    )
    producer.start()
    try:
        script = [
            (3, "start", "b"),
            (8, "start", "c"),
            (14, "term", "b"),
            (19, "kill", "c"),
            (23, "start", "b"),
            (28, "kill", "a"),
            (31, "start", "c"),
            (38, "term", "b"),
            (42, "start", "a"),
        ]
        started = time.monotonic()
        for at, action, name in script:
            time.sleep(max(0.0, started + at - time.monotonic()))
            if action == "start":
                replicas[name] = consumer_process(broker, topic, group, results, log=logs[name], **env)
            else:
                stop(replicas[name], action)
        producer.join(180)
        try:
            wait_for(lambda: set(judged_transcripts(judge_server)) >= set(ids), timeout=120, what="all judged")
        except AssertionError:
            missing = sorted(set(ids) - set(judged_transcripts(judge_server)))
            for name, log in logs.items():
                print(f"--- replica {name}\n" + (log.read_text()[-6000:] if log.exists() else ""))
            raise AssertionError(f"{len(missing)} never judged: {missing[:20]}") from None
        quiet = {"count": -1, "since": time.monotonic()}

        def settled() -> bool:
            count = len(judge_server.requests)
            if count != quiet["count"]:
                quiet.update(count=count, since=time.monotonic())
            return time.monotonic() - quiet["since"] > 6

        wait_for(settled, timeout=120, what="no more judge calls")
    finally:
        for process in replicas.values():
            stop(process, "term")
    transcripts = judged_transcripts(judge_server)
    partial = {cid: calls for cid, calls in transcripts.items() if any(c != set(range(1, TURNS + 1)) for c in calls)}
    assert not partial, f"{len(partial)} conversations judged on a partial transcript, e.g. {list(partial.items())[:3]}"
    records = [json.loads(r.value) for r in read_all(broker.bootstrap_servers, results)]
    by_key: dict[tuple[str, str], set[str]] = defaultdict(set)
    for record in records:
        by_key[(record["conversation_id"], record["metric"])].add(record["result_id"])
    assert {cid for cid, _ in by_key} == set(ids)  # every conversation has a result
    assert all(len(found) == 1 for found in by_key.values()), [k for k, v in by_key.items() if len(v) > 1][:5]
    calls = sum(len(c) for c in transcripts.values())
    print(f"\nchaos: {CONVERSATIONS} conversations, {calls} judge calls ({calls - CONVERSATIONS} repeated), 0 partial")
