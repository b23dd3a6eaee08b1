"""State beyond memory (issue 32), with real `tracejudge consume` processes on the embedded broker: a backlog of 600
complete two-turn conversations, interleaved (every first turn, then every second turn and end marker), read with
--max-open-conversations 50. The bound sends conversations to the local store on disk instead of completing them:
each conversation is judged by both judges on its whole transcript, once (1,200 calls), also across a kill -9 and a
restart on the same state directory (restored from the local checkpoint) or on an empty one (from the changelog)."""

from __future__ import annotations

import re
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer, conversation_text, metric_of
from tests.support.pipeline import consumer_process, play, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.kafka.partitioner import state_partition

CONVERSATIONS = 600
BOUND = "50"
METRICS = "failure_rate,conversational_flow"


def judged(server: JudgeServer) -> list[tuple[str, str, bool]]:
    """(conversation, judge, whole transcript?) of every judge call on a backlog conversation."""
    calls = []
    for request in list(server.requests):
        text = conversation_text(request)
        found = re.search(r"beyond-(\d+) q0", text) or re.search(r"beyond-(\d+) q1", text)
        if found:
            cid = found.group(1)
            whole = f"beyond-{cid} q0" in text and f"beyond-{cid} q1" in text
            calls.append((cid, metric_of(request), whole))
    return calls


def sentinels_judged(server: JudgeServer, names: list[str]) -> bool:
    texts = [conversation_text(r) for r in list(server.requests)]
    return all(sum(f"{name} question" in t for t in texts) >= 2 for name in names)


def write_backlog(broker: EmbeddedBroker, topic: str) -> None:
    provider = traced_app(broker.bootstrap_servers, topic)
    ids = [f"beyond-{i}" for i in range(CONVERSATIONS)]
    play(provider, {cid: [(f"{cid} q0", "a0")] for cid in ids}, end=False)  # every first turn
    play(provider, {cid: [(f"{cid} q1", "a1")] for cid in ids})  # then every second turn and end marker
    provider.shutdown()


def barrier(broker: EmbeddedBroker, topic: str, server: JudgeServer, prefix: str = "") -> None:
    """A sentinel conversation per partition, written after the backlog and judged: every backlog record was read
    before it, so any call a bound caused (an early cut, then the whole) would have been made by then."""
    names: dict[int, str] = {}
    for i in range(100):
        names.setdefault(state_partition(f"{prefix}sentinel-{i}", 3), f"{prefix}sentinel-{i}")
    provider = traced_app(broker.bootstrap_servers, topic)
    play(provider, {cid: [(f"{cid} question", "answer")] for cid in names.values()})
    provider.shutdown()
    wait_for(lambda: sentinels_judged(server, list(names.values())), timeout=240, what="the sentinels judged")


def assert_whole(calls: list[tuple[str, str, bool]], *, exactly_once: bool) -> None:
    partial = [c for c in calls if not c[2]]
    assert not partial, f"{len(partial)} judge calls on part of a conversation, e.g. {partial[:3]}"
    per = Counter((cid, metric) for cid, metric, _ in calls)
    assert len(per) == 2 * CONVERSATIONS, f"{len(per)} of {2 * CONVERSATIONS} (conversation, judge) pairs judged"
    if exactly_once:
        assert len(calls) == 2 * CONVERSATIONS, f"{len(calls)} judge calls for {CONVERSATIONS} conversations x 2"


@pytest.mark.timeout(600)
def test_a_backlog_wider_than_the_open_bound_is_judged_whole_once(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = scripted_judge
    write_backlog(broker, topic)
    group, log = f"beyond-{uuid.uuid4().hex[:6]}", tmp_path / "consumer.log"
    process = consumer_process(
        broker,
        topic,
        group,
        f"{topic}-results",
        log=log,
        TRACEJUDGE_METRICS=METRICS,
        TRACEJUDGE_MAX_OPEN_CONVERSATIONS=BOUND,
        TRACEJUDGE_STATE_DIR=str(tmp_path / "state"),
        TRACEJUDGE_MAX_CONCURRENCY="16",
    )
    try:
        wait_for(lambda: len(judged(judge_server)) >= 2 * CONVERSATIONS, timeout=300, what="1,200 judge calls")
        barrier(broker, topic, judge_server)
    finally:
        process.kill()
        process.wait(10)
    assert_whole(judged(judge_server), exactly_once=True)
    assert "memory_bound" not in log.read_text()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("disk", ["same", "empty"])
def test_kill_9_halfway_then_a_restart_judges_every_conversation_whole(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path, disk: str
) -> None:
    judge_server.responder = scripted_judge
    write_backlog(broker, topic)
    group, log = f"beyond-{uuid.uuid4().hex[:6]}", tmp_path / "consumer.log"

    def start(state: Path) -> object:
        return consumer_process(
            broker,
            topic,
            group,
            f"{topic}-results",
            log=log,
            TRACEJUDGE_METRICS=METRICS,
            TRACEJUDGE_MAX_OPEN_CONVERSATIONS=BOUND,
            TRACEJUDGE_STATE_DIR=str(state),
            TRACEJUDGE_MAX_CONCURRENCY="16",
        )

    first = start(tmp_path / "state")
    try:
        wait_for(lambda: len(judged(judge_server)) >= CONVERSATIONS, timeout=300, what="half the judge calls")
    finally:
        first.kill()  # type: ignore[attr-defined]
        first.wait(10)  # type: ignore[attr-defined]
    killed_at = len(judged(judge_server))
    second = start(tmp_path / ("state" if disk == "same" else "empty"))
    try:
        wait_for(lambda: log.read_text().count("ready: consuming") >= 2, timeout=120, what="the restart restored")
        wait_for(
            lambda: {c for c, _, _ in judged(judge_server)} >= {str(i) for i in range(CONVERSATIONS)},
            timeout=300,
            what="every conversation judged",
        )
        barrier(broker, topic, judge_server)
    finally:
        second.kill()  # type: ignore[attr-defined]
        second.wait(10)  # type: ignore[attr-defined]
    text = log.read_text()
    restores = re.findall(r"partition \d+ restored: .*", text)
    print(f"\n{disk} disk, killed after {killed_at} judge calls; restores:\n" + "\n".join(restores))
    assert restores
    if disk == "same":
        assert "the local store's checkpoint" in text  # restored from the checkpoint: only the changelog's tail
    calls = judged(judge_server)
    assert_whole(calls, exactly_once=False)
    assert "memory_bound" not in text
    print(f"{len(calls)} judge calls ({len(calls) - 2 * CONVERSATIONS} repeated after the kill)")
