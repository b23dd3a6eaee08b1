"""Consumer groups, deterministic sampling, SIGTERM drain and kill -9 recovery, against Tansu and a local judge."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

from tests.consumer.test_pipeline import Collect, scripted_judge
from tests.support.judge_server import JudgeServer, Reply, conversation_text, metric_of
from tests.support.pipeline import (
    RunningConsumer,
    consumer_process,
    consumer_settings,
    owns_partitions,
    play,
    result_records,
    settled,
    snapshots,
    traced_app,
    wait_for,
)
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.judging.sampling import sample_point
from tracejudge.consumer.kafka.partitioner import state_partition

ROOT = Path(__file__).resolve().parents[2]


def conversations(prefix: str, count: int, turns: int = 2) -> dict[str, list[tuple[str, str]]]:
    return {f"{prefix}-{i}": [(f"{prefix} {i} q{t}", f"a{t}") for t in range(turns)] for i in range(count)}


def test_two_consumers_in_one_group_split_the_work(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    judge_server.responder = scripted_judge
    first, second = Collect(), Collect()
    provider = traced_app(broker.bootstrap_servers, topic)
    group = f"split-{uuid.uuid4().hex[:6]}"
    settings = consumer_settings(broker.bootstrap_servers, topic, group_id=group, metrics="failure_rate")
    with RunningConsumer(settings, extra_sinks=[first]) as a, RunningConsumer(settings, extra_sinks=[second]) as b:
        wait_for(lambda: owns_partitions(a) and owns_partitions(b), timeout=120, what="both members assigned")
        play(provider, conversations("split", 30))
        wait_for(lambda: a.sessions("judged") + b.sessions("judged") >= 30, what="30 judged")
        ids = list(conversations("split", 30))
        # Barrier: every verdict back at its conversation's owner, nothing open: a second judgement would need a
        # second snapshot (checked below) or a job still in a pool.
        wait_for(lambda: settled([a, b], ids), timeout=120, what="every conversation settled at its owner")
        wait_for(lambda: a.app.service.pool.pending == b.app.service.pool.pending == 0, what="the pools empty")
        assert all(snapshots([a, b], cid) == 1 for cid in ids)
        assert a.sessions("judged") > 0 and b.sessions("judged") > 0
        assert a.sessions("judged") + b.sessions("judged") == 30
    ids = first.ids() + second.ids()
    assert sorted(ids) == sorted(conversations("split", 30))
    provider.shutdown()


def test_sampling_is_the_same_across_groups(broker: EmbeddedBroker, topic: str, judge_server: JudgeServer) -> None:
    judge_server.responder = scripted_judge
    provider = traced_app(broker.bootstrap_servers, topic)
    play(provider, conversations("sample", 40, turns=1))
    expected = {cid for cid in conversations("sample", 40, turns=1) if sample_point(cid) < 0.5}
    assert 5 < len(expected) < 35
    judged: list[set[str]] = []
    for _ in range(2):
        collect = Collect()
        settings = consumer_settings(broker.bootstrap_servers, topic, sample_rate=0.5, metrics="failure_rate")
        with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
            wait_for(lambda c=consumer: c.sessions() == 40, what="40 conversations accounted")
            assert consumer.sessions("sampled_out") == 40 - len(expected)
        judged.append({j.job.conversation_id for j in collect.judgements if j.outcome == "judged"})
    assert judged[0] == judged[1] == expected
    provider.shutdown()


def judged_conversations(server: JudgeServer, expected: dict[str, list[tuple[str, str]]]) -> set[str]:
    texts = [conversation_text(r) for r in list(server.requests)]
    return {cid for cid, turns in expected.items() if any(turns[0][0] in text for text in texts)}


def slow_judge(delay: float):
    def respond(request: dict) -> Reply:
        reply = scripted_judge(request)
        reply.delay_s = delay
        assert metric_of(request) == "failure_rate"
        return reply

    return respond


def test_sigterm_drains_in_flight_judgements(broker: EmbeddedBroker, topic: str, judge_server: JudgeServer) -> None:
    judge_server.responder = slow_judge(2.0)
    results, group = f"{topic}-results", f"term-{uuid.uuid4().hex[:6]}"
    broker.create_topic(results, 1)
    provider = traced_app(broker.bootstrap_servers, topic)
    process = consumer_process(broker, topic, group, results)
    try:
        play(provider, conversations("term", 6))
        wait_for(lambda: len(judge_server.requests) >= 6, what="judge calls under way")
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output[-3000:]
    records = result_records(broker, results, expected=6)
    assert sorted(r["conversation_id"] for r in records) == sorted(conversations("term", 6))
    # Everything was committed: a restart of the same group judges nothing again.
    # Barrier: one new conversation per partition, judged. A restart judges what its restored state holds before it
    # reads new records, so once every partition's sentinel is judged, anything judged again would have been too.
    before = len(judge_server.requests)
    sentinels: dict[int, str] = {}
    for i in range(100):
        sentinels.setdefault(state_partition(f"sentinel-{i}", 3), f"sentinel-{i}")
    assert len(sentinels) == 3
    restart = consumer_process(broker, topic, group, results)
    try:
        play(provider, {cid: [("sentinel q", "a")] for cid in sentinels.values()})
        wait_for(lambda: len(judge_server.requests) >= before + 3, timeout=90, what="every partition's sentinel judged")
        restart.send_signal(signal.SIGTERM)
        restart.communicate(timeout=60)
    finally:
        if restart.poll() is None:
            restart.kill()
    judged_again = [conversation_text(r) for r in judge_server.requests[before:]]
    assert len(judged_again) == 3 and all("sentinel q" in text for text in judged_again), judged_again
    provider.shutdown()


@pytest.mark.slow
def test_kill_9_then_restart_loses_nothing(broker: EmbeddedBroker, topic: str, judge_server: JudgeServer) -> None:
    judge_server.responder = slow_judge(0.3)
    results, group = f"{topic}-results", f"kill-{uuid.uuid4().hex[:6]}"
    broker.create_topic(results, 1)
    provider = traced_app(broker.bootstrap_servers, topic)
    expected = conversations("kill", 40)
    process = consumer_process(broker, topic, group, results, TRACEJUDGE_MAX_CONCURRENCY="4")
    try:
        play(provider, expected)
        wait_for(lambda: len(judge_server.requests) >= 10, what="some judgements done")
        process.kill()
        process.wait(10)
    finally:
        if process.poll() is None:
            process.kill()
    judged_before = len(judge_server.requests)
    assert judged_before < 40, "the kill came too late to prove anything"
    restart = consumer_process(broker, topic, group, results, TRACEJUDGE_MAX_CONCURRENCY="16")
    try:
        wait_for(
            lambda: judged_conversations(judge_server, expected) == set(expected),
            timeout=90,
            what="every conversation judged after the restart",
        )
        restart.send_signal(signal.SIGTERM)
        restart.communicate(timeout=60)
    finally:
        if restart.poll() is None:
            restart.kill()
    records = result_records(broker, results, expected=40, timeout_s=20)
    by_conversation: dict[str, set[str]] = {}
    for record in records:
        by_conversation.setdefault(record["conversation_id"], set()).add(record["result_id"])
    assert set(by_conversation) == set(expected)
    assert all(len(ids) == 1 for ids in by_conversation.values())  # duplicates carry the same deterministic id
    provider.shutdown()
