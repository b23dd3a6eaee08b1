"""Consumer lag and backpressure across restarts and rebalances, on Tansu with the real consumer service.

Windows for the offset/partition state machine, each tested:
- lag after a restart with nothing new: position = committed = high watermark, so every partition reads 0 (not its
  whole log) from its first fetch on;
- lag of a revoked partition: its series disappears (its new owner reports it);
- a revoked partition's finished work: committed on revocation (from kafka-python's IO thread), not re-judged;
- a revoked partition handed straight back: its conversations completed or in the pool are read afresh;
- backpressure while a rebalance happens: partitions assigned to a paused service start paused, and nothing more is
  read from them until the pressure goes.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

from kafka import KafkaProducer

from tests.consumer.test_pipeline import scripted_judge
from tests.reliability.test_malformed import otlp_json_turn
from tests.support.judge_server import JudgeServer, Reply
from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker


def lag_series(consumer: RunningConsumer) -> dict[str, float]:
    return {
        sample.labels["partition"]: sample.value
        for metric in consumer.app.registry.collect()
        if metric.name == "tracejudge_consumer_lag"
        for sample in metric.samples
    }


def assigned(consumer: RunningConsumer) -> set[str]:
    kafka = consumer.app.service._consumer
    return {str(tp.partition) for tp in kafka.assignment()} if kafka is not None else set()


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
        wait_for(lambda: set(lag_series(restarted)) == {"0", "1", "2"}, timeout=10, what="a lag series per partition")
        reported_after = time.monotonic() - assigned_at
        stop.set()
        sampler.join()
        assert set(lag_series(restarted).values()) == {0.0}
        assert all(value == 0.0 for series in samples for value in series.values()), "lag above 0 after a restart"
        # A second member joins: the partitions revoked from the first lose their series there.
        with RunningConsumer(consumer_settings(broker.bootstrap_servers, topic, group_id=group)) as second:
            wait_for(lambda: assigned(second) and len(assigned(restarted)) < 3, what="the partitions split")
            wait_for(lambda: set(lag_series(restarted)) == assigned(restarted), timeout=10, what="revoked series gone")
            wait_for(lambda: set(lag_series(second)) == assigned(second), timeout=10, what="the new owner's series")
            kept, moved = sorted(assigned(restarted)), sorted(assigned(second))
    print(
        f"\nlag: after a restart {len(samples)} samples, max lag {max(max(s.values(), default=0) for s in samples)}, "
        f"every partition at 0 within {reported_after:.2f} s of assignment; after a rebalance series {kept} stay, "
        f"{moved} moved"
    )


def test_partitions_assigned_while_paused_start_paused(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    release = threading.Event()

    def hang(request: dict) -> Reply:
        release.wait(60)
        return scripted_judge(request)

    judge_server.responder = hang
    provider = traced_app(broker.bootstrap_servers, topic)
    group = f"bp-{uuid.uuid4().hex[:6]}"
    settings = consumer_settings(broker.bootstrap_servers, topic, group_id=group, metrics="failure_rate")
    paused = RunningConsumer(settings)
    paused.app.service.partitions.max_pending = 2  # two judgements waiting are "full": a small value of the tuning knob
    with paused:
        wait_for(lambda: len(assigned(paused)) == 3, what="three partitions assigned")
        play(provider, {f"bp-{i}": [(f"bp q{i}", "a")] for i in range(3)})
        wait_for(lambda: paused.app.service.partitions.paused, what="backpressure on")
        # A second member joins: every partition is revoked and reassigned (eager rebalance).
        other = RunningConsumer(consumer_settings(broker.bootstrap_servers, topic, group_id=group))
        with other:
            wait_for(lambda: assigned(other) and assigned(paused), what="the partitions split")
            kafka = paused.app.service._consumer
            assert kafka is not None
            wait_for(lambda: kafka.paused() == kafka.assignment(), timeout=5, what="new partitions paused")
            mine = {tp.partition for tp in kafka.assignment()}
            read_before = paused.value("tracejudge_records_total", outcome="ok")
            # Records for the paused member's partitions: not read while it is full.
            producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
            for partition in mine:
                for i in range(3):
                    turn = json.dumps(otlp_json_turn(f"bp-late-{partition}-{i}", 0, ended=True)).encode()
                    producer.send(topic, value=turn, partition=partition)
            producer.flush()
            producer.close()
            time.sleep(2.0)
            read_while_paused = paused.value("tracejudge_records_total", outcome="ok") - read_before
            assert kafka.paused() == kafka.assignment() and read_while_paused == 0
            release.set()
            wait_for(lambda: not paused.app.service.partitions.paused, what="backpressure released")
            wait_for(
                lambda: paused.value("tracejudge_records_total", outcome="ok") > read_before,
                what="reading again after the pressure went",
            )
    provider.shutdown()
    print(
        f"\nbackpressure: partitions {sorted(mine)} assigned while paused started paused; 0 records read until released"
    )


def test_revoked_partitions_are_committed_on_revocation(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    """kafka-python 3 runs the rebalance listener on its IO thread, where a blocking `commit()` raises: the revocation
    commit must still happen (awaited), so neither member re-reads and re-judges what the first one finished."""
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
        wait_for(lambda: first.app.service.offsets.held() == 0, what="every result delivered")
        with RunningConsumer(consumer_settings(broker.bootstrap_servers, topic, group_id=group)) as second:
            wait_for(lambda: assigned(second) and assigned(first), what="the partitions split")
            wait_for(
                lambda: set(lag_series(first)) == assigned(first) and set(lag_series(second)) == assigned(second),
                timeout=10,
                what="both members reading",
            )
            time.sleep(1.0)  # a re-read, if any, would reach the judge meanwhile
            rejudged = first.sessions("judged") - 9 + second.sessions("judged")
            kafka = second.app.service._consumer
            assert kafka is not None
            committed = {tp.partition: kafka.committed(tp) for tp in kafka.assignment()}
    print(f"\nrevocation commit: {rejudged:.0f} conversations re-judged after the rebalance, committed {committed}")
    assert rejudged == 0 and len(judge_server.requests) == 9
    assert committed and all(offset is not None and offset > 0 for offset in committed.values()), committed


def test_a_revoked_partition_that_comes_back_is_read_afresh() -> None:
    """Eager rebalances revoke every partition and often hand it straight back: the conversations of a revoked
    partition that were completed (not yet dispatched, or in the judge pool) must not make its re-read records look
    like duplicates, or the conversation is never judged again and is committed past."""
    from tracejudge.consumer.adapters import ConversationEvent, Turn
    from tracejudge.consumer.conversations import ConversationStore

    def records(cid: str) -> list[ConversationEvent]:
        turn = Turn(span_id=f"{cid}-s", trace_id="t", parent_span_id="", start_ns=1, end_ns=2, input="q", output="a")
        return [ConversationEvent(cid, "a", turn=turn), ConversationEvent(cid, "a", ended=True)]

    store = ConversationStore()
    for offset, event in enumerate(records("in-pool")):
        store.apply(event, 0, offset, 0.0)
    in_pool = store.take_ready()  # dispatched: its judge call is running
    for offset, event in enumerate(records("undispatched"), start=2):
        store.apply(event, 0, offset, 0.0)  # completed, to be dispatched after the next poll
    assert len(store.drop_partitions({0})) == 1  # the undispatched one's hold (the pool job's goes with the partition)
    assert not store.judging and not store.take_ready()
    # The partition comes back: its records are read again from the last commit.
    for offset, event in enumerate(records("undispatched") + records("in-pool")):
        store.apply(event, 0, offset, 0.0)
    again = sorted(job.conversation_id for job in store.take_ready())
    assert again == ["in-pool", "undispatched"], again
    store.finished(in_pool[0], judged=True)  # the old job finishing does not disturb the new one
    assert set(store.judging) == {"in-pool", "undispatched"}
