"""Consumer lag and backpressure across restarts and rebalances, on Tansu with the real consumer service.

Windows for the offset/partition state machine, each tested:
- lag after a restart with nothing new: position = committed = high watermark, so every partition reads 0 (not its
  whole log) from its first fetch on;
- lag of a revoked partition: its series disappears (its new owner reports it);
- a revoked partition's finished work: committed on revocation (from kafka-python's IO thread), not re-judged;
- a partition that moves: its new owner restores its conversations from the changelog (ConversationTable
  restore), so replayed records are duplicates, a completed conversation is not judged again, an open one completes
  whole;
- backpressure while a rebalance happens: judge-queue partitions assigned to a paused judge worker start paused and
  no job is read from them until the pressure goes, while input records keep being read and assembled (a slow
  judge is judge-queue lag).
"""

from __future__ import annotations

import threading
import time
import uuid

from kafka import TopicPartition

from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer, Reply
from tests.support.pipeline import (
    RunningConsumer,
    consumer_settings,
    last_outcome,
    play,
    traced_app,
    wait_for,
)
from tracejudge.consumer.adapters import ConversationEvent, Turn
from tracejudge.consumer.conversation.identity import content_id
from tracejudge.consumer.conversation.table import ConversationState, ConversationTable
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.kafka.partitioner import state_partition
from tracejudge.consumer.streams import records as R


def lag_series(consumer: RunningConsumer) -> dict[str, float]:
    return {
        sample.labels["partition"]: sample.value
        for metric in consumer.app.registry.collect()
        if metric.name == "tracejudge_consumer_lag"
        for sample in metric.samples
    }


def assigned(consumer: RunningConsumer) -> set[str]:
    """The input partitions the consumer's assembler owns."""
    assembler = consumer.app.service.assembler
    kafka = assembler.group if assembler is not None else None
    return {str(tp.partition) for tp in kafka.assignment()} if kafka is not None else set()


def judge_assigned(consumer: RunningConsumer) -> set[int]:
    """The judge-queue partitions the consumer's judge worker owns."""
    worker = consumer.app.service.judge_worker
    kafka = worker.consumer if worker is not None else None
    if kafka is None:
        return set()
    return {tp.partition for tp in kafka.assignment() if tp.topic == worker.topics.judge_queue}  # not the retry topic


def judge_lag(consumer: RunningConsumer) -> dict[int, float]:
    return {
        int(sample.labels["partition"]): sample.value
        for metric in consumer.app.registry.collect()
        if metric.name == "tracejudge_judge_queue_lag"
        for sample in metric.samples
    }


def test_lag_is_zero_after_a_restart_and_revoked_series_go(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    judge_server.responder = scripted_judge
    provider = traced_app(broker.bootstrap_servers, topic)
    play(provider, {f"lag-{i}": [(f"lag q{i}", "a")] for i in range(12)})  # spread over the three partitions
    provider.shutdown()
    group = f"lag-{uuid.uuid4().hex[:6]}"
    settings = consumer_settings(broker.bootstrap_servers, topic, group_id=group, metrics="failure_rate")
    with RunningConsumer(settings) as first:
        wait_for(lambda: first.sessions("judged") == 12, what="12 judged")
        wait_for(lambda: lag_series(first) and set(lag_series(first).values()) == {0.0}, what="caught up")
    # Restart: nothing new. Sample the gauge from the start: never above 0, and 0 for every partition at once.
    restarted = RunningConsumer(settings)
    samples: list[dict[str, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(lag_series(restarted))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    with restarted:
        sampler.start()
        wait_for(lambda: len(assigned(restarted)) == 3, what="the three partitions assigned")
        assigned_at = time.monotonic()
        wait_for(lambda: set(lag_series(restarted)) == {"0", "1", "2"}, timeout=60, what="a lag series per partition")
        reported_after = time.monotonic() - assigned_at
        stop.set()
        sampler.join()
        assert set(lag_series(restarted).values()) == {0.0}
        assert all(value == 0.0 for series in samples for value in series.values()), "lag above 0 after a restart"
        # A second member joins: the partitions revoked from the first lose their series there.
        with RunningConsumer(consumer_settings(broker.bootstrap_servers, topic, group_id=group)) as second:
            wait_for(lambda: assigned(second) and len(assigned(restarted)) < 3, what="the partitions split")
            wait_for(lambda: set(lag_series(restarted)) == assigned(restarted), timeout=60, what="revoked series gone")
            wait_for(lambda: set(lag_series(second)) == assigned(second), timeout=60, what="the new owner's series")
            kept, moved = sorted(assigned(restarted)), sorted(assigned(second))
    print(
        f"\nlag: after a restart {len(samples)} samples, max lag {max(max(s.values(), default=0) for s in samples)}, "
        f"every partition at 0 within {reported_after:.2f} s of assignment; after a rebalance series {kept} stay, "
        f"{moved} moved"
    )


def test_judge_queue_partitions_assigned_while_paused_start_paused(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    release = threading.Event()

    def hang(request: dict) -> Reply:
        release.wait(180)
        return scripted_judge(request)

    judge_server.responder = hang
    provider = traced_app(broker.bootstrap_servers, topic)
    group = f"bp-{uuid.uuid4().hex[:6]}"
    settings = consumer_settings(broker.bootstrap_servers, topic, group_id=group, metrics="failure_rate")
    paused = RunningConsumer(settings)
    with paused:
        service = paused.app.service
        worker = service.judge_worker
        assert worker is not None and worker.consumer is not None
        worker.max_pending = 2  # two judgements waiting are "full": a small value of the tuning knob
        wait_for(lambda: service.assigned.is_set() and judge_assigned(paused) == {0, 1, 2}, what="all assigned")
        play(provider, {f"bp-{i}": [(f"bp q{i}", "a")] for i in range(3)})
        wait_for(lambda: worker.paused, what="backpressure on")
        # A judge-only member joins (cooperative-sticky: it takes some of the judge queue) and leaves again: its
        # partitions come back to the paused worker, assigned while it is full.
        other = RunningConsumer(consumer_settings(broker.bootstrap_servers, topic, group_id=group, role="judge"))
        with other:
            wait_for(
                lambda: judge_assigned(other) and len(judge_assigned(paused)) < 3, timeout=120, what="the queue split"
            )
            handed = judge_assigned(other)
        wait_for(lambda: judge_assigned(paused) == {0, 1, 2}, timeout=120, what="the partitions handed back")
        kafka = worker.consumer
        queue_tps = lambda: {tp for tp in kafka.assignment() if tp.topic == worker.topics.judge_queue}  # noqa: E731
        wait_for(lambda: queue_tps() <= kafka.paused(), timeout=60, what="the handed-back partitions paused")
        assert worker.paused
        tps = {p: TopicPartition(f"{group}-judge-queue", p) for p in handed}
        position_before = {p: kafka.position(tp) for p, tp in tps.items()}
        read_before = paused.value("tracejudge_records_total", outcome="ok")
        # Conversations owned by the handed-back partitions: assembled, their jobs queued, none read while full.
        late = [cid for cid in (f"bp-late-{n}" for n in range(200)) if state_partition(cid, 3) in handed][:4]
        play(provider, {cid: [(f"late q {cid}", "a")] for cid in late})

        def assembled(cid: str) -> bool:
            state = service.conversation(cid)
            return state is not None and state.status == "completed" and list(state.dispatched.values()) == [None]

        wait_for(lambda: all(assembled(cid) for cid in late), timeout=120, what="the late conversations assembled")
        assert paused.value("tracejudge_records_total", outcome="ok") > read_before  # the input is still read
        waiting = {p: sum(state_partition(cid, 3) == p for cid in late) for p in handed}
        # Barrier: the judge worker's own lag gauge (its position against the fresh high watermark) counts the
        # queued jobs, so its thread has polled since they landed, and read none of them.
        wait_for(
            lambda: all(judge_lag(paused).get(p, 0) >= n for p, n in waiting.items() if n),
            timeout=120,
            what="the queued jobs counted as judge-queue lag",
        )
        assert {p: kafka.position(tp) for p, tp in tps.items()} == position_before
        assert queue_tps() <= kafka.paused() and worker.paused
        assert all(last_outcome(service, cid) is None for cid in late)
        release.set()
        wait_for(lambda: not worker.paused, timeout=120, what="backpressure released")
        wait_for(
            lambda: all(last_outcome(service, cid) == "judged" for cid in late),
            timeout=120,
            what="the late conversations judged once the pressure went",
        )
    provider.shutdown()
    print(
        f"\nbackpressure: judge-queue partitions {sorted(handed)} assigned while paused started paused; "
        f"{sum(waiting.values())} jobs waited in Kafka, 0 read until released, the input read throughout"
    )


def test_revoked_partitions_are_committed_on_revocation(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    """kafka-python 3 runs the rebalance listener on its IO thread, where a blocking `commit()` raises: the revocation
    commit must still happen (awaited), so neither member re-reads and re-judges what the first one finished: the
    input offsets with the state in the changelog, and the judge-queue offsets."""
    judge_server.responder = scripted_judge
    provider = traced_app(broker.bootstrap_servers, topic)
    play(provider, {f"rv-{i}": [(f"rv q{i}", "a")] for i in range(9)})  # spread over the three partitions
    provider.shutdown()
    group = f"rv-{uuid.uuid4().hex[:6]}"
    # No periodic commit during the test: only the revocation can commit.
    settings = consumer_settings(
        broker.bootstrap_servers, topic, group_id=group, metrics="failure_rate", commit_interval=3600.0
    )
    with RunningConsumer(settings) as first:
        wait_for(lambda: first.sessions("judged") == 9, what="9 judged")
        worker = first.app.service.judge_worker
        assert worker is not None
        wait_for(lambda: worker.offsets.held() == 0, what="every result delivered")
        with RunningConsumer(consumer_settings(broker.bootstrap_servers, topic, group_id=group)) as second:
            wait_for(lambda: assigned(second) and assigned(first), timeout=120, what="the input partitions split")
            wait_for(
                lambda: judge_assigned(second) and len(judge_assigned(first)) < 3, timeout=120, what="the queue split"
            )
            service = second.app.service
            wait_for(lambda: service.assigned.is_set(), timeout=120, what="the moved partitions restored")
            # Barrier: both stages of the new owner read to the end of what it owns (its own lag gauges at 0);
            # anything re-read would be a completion or a job in its pool by then.
            wait_for(
                lambda: (
                    set(lag_series(second)) == assigned(second)
                    and set(lag_series(second).values()) == {0.0}
                    and set(judge_lag(second)) == judge_assigned(second)
                    and set(judge_lag(second).values()) <= {0.0}
                    and service.pool.pending == 0
                    and service.delivery.awaiting == 0
                ),
                timeout=120,
                what="the new owner caught up on both topics",
            )
            completed_again = sum(
                second.value("tracejudge_conversations_completed_total", completed_by=by)
                for by in ("end_marker", "idle_timeout", "turn_cap", "memory_bound", "negative_feedback")
            )
            duplicates = service.counts().get("duplicate_spans", 0)
            restored = [cid for cid in (f"rv-{i}" for i in range(9)) if service.conversation(cid) is not None]
            outcomes = {cid: last_outcome(service, cid) for cid in restored}
            rejudged = first.sessions("judged") - 9 + second.sessions("judged")
            assert service.assembler is not None and service.judge_worker is not None
            group_consumer, judges = service.assembler.group, service.judge_worker.consumer
            committed = {tp.partition: group_consumer.committed(tp) for tp in group_consumer.assignment()}
            queue = {tp.partition: (judges.committed(tp) or 0, judges.position(tp)) for tp in judges.assignment()}
    print(
        f"\nrevocation commit: {rejudged:.0f} conversations re-judged after the rebalance, input committed "
        f"{committed}, judge queue (committed, position) {queue}, {len(restored)} conversations restored"
    )
    assert rejudged == 0 and len(judge_server.requests) == 9
    assert completed_again == 0 and duplicates == 0  # nothing re-read: the new owner started at the commit
    assert restored and set(outcomes.values()) == {"judged"}, outcomes  # restored with their verdicts
    assert committed and all(offset is not None and offset > 0 for offset in committed.values()), committed
    assert queue and all(done == position for done, position in queue.values()), queue


def test_a_partition_that_moves_restores_its_conversations_from_the_changelog() -> None:
    """A partition's new owner (after a rebalance or a restart) restores its conversations from the changelog and
    then replays the records since the last commit: what it already holds must be duplicates, a completed
    conversation (judged, or still in the judge pool) is not judged again, and an open one completes whole."""

    def turn(cid: str, n: int) -> Turn:
        return Turn(
            span_id=f"{cid}-s{n}", trace_id="t", parent_span_id="", start_ns=10 + n, end_ns=11 + n, input=f"q{n}",
            output=f"a{n}",
        )  # fmt: skip

    def turns(cid: str, *ns: int) -> list[ConversationEvent]:
        return [ConversationEvent(cid, "a", turn=turn(cid, n)) for n in ns]

    def end(cid: str) -> ConversationEvent:
        return ConversationEvent(cid, "a", ended=True)

    replayed = [*turns("judged", 0), end("judged"), *turns("in-pool", 0), end("in-pool"), *turns("open", 0)]
    table = ConversationTable()
    for ts, event in enumerate(replayed, start=1000):
        table.apply(event, ts)
    jobs = {d.job.conversation_id: d.job for d in table.take_dispatches()}
    assert set(jobs) == {"judged", "in-pool"}
    table.verdict("judged", jobs["judged"].content_id, "judged", 2000)  # the other's judge call is still running
    changed, removed = table.take_changes()
    assert not removed
    changelog = {state.id: R.dumps(state.to_json()) for state in changed}  # the changelog records' values
    assert set(changelog) == {"judged", "in-pool", "open"}
    table.close()

    moved = ConversationTable()
    for cid, value in changelog.items():
        moved.restore(ConversationState.from_json(R.loads(value)), cid)
    assert moved.open_count == 1 and len(moved) == 3
    for ts, event in enumerate(replayed, start=1000):  # the records since the last commit, read again
        moved.apply(event, ts)
    assert moved.counts["duplicate_spans"] == 3
    assert moved.take_dispatches() == []  # neither completed conversation is judged again
    moved.verdict("in-pool", jobs["in-pool"].content_id, "judged", 2100)  # the old owner's judgement lands
    assert moved.get("in-pool").dispatched == {jobs["in-pool"].content_id: "judged"}
    assert moved.take_dispatches() == []
    for ts, event in enumerate([*turns("open", 1), end("open")], start=3000):
        moved.apply(event, ts)
    [dispatch] = moved.take_dispatches()
    job = dispatch.job
    assert job.conversation_id == "open" and job.completed_by == "end_marker"
    assert [t.span_id for t in job.exchanges] == ["open-s0", "open-s1"]  # whole: the turn from before the move too
    assert job.content_id == content_id("open", job.exchanges)
