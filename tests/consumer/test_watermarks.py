"""Watermarks as one record per target partition (`StreamClock.broadcast`), read by `Processor.repartitioned`: the
order kept, a fleet mid rolling upgrade (a replica of the earlier version reads the single-source form, each source
in turn), records nobody of ours wrote (counted, skipped whole); and the retrying gauge counted at most every
RETRYING_REFRESH_S, at once again after a failed count or a move.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.consumer.test_streams_clock import repartition_reader
from tests.consumer.test_trace_keyed_windows import PARTITIONS, TOPICS, Cluster, end, owned_by, turn
from tracejudge.consumer.conversation.table import ConversationTable
from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.kafka import TopicPartition
from tracejudge.consumer.kafka.topics import InternalTopics
from tracejudge.consumer.streams import records as R
from tracejudge.consumer.streams import retry_scheduler as retry_module
from tracejudge.consumer.streams.clock import StreamClock, task_time, wall_ms
from tracejudge.consumer.streams.processor import Processor
from tracejudge.consumer.streams.retry_scheduler import RETRYING_REFRESH_S, RetryScheduler
from tracejudge.consumer.streams.task import Task

# -- watermarks: order, mixed fleet ------------------------------------------------------------------------------------


def test_a_batched_watermark_follows_what_its_sources_routed_to_that_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per target partition, the one watermark record of a round comes after every event its sources routed there in
    that round (one producer, one partition: the order sent is the order read), and claims no more than was read."""
    cluster = Cluster(monkeypatch)
    owner = 2
    cid = owned_by(owner, "o")
    cluster.input(0, 1_000, turn(cid, 1, 1_000))
    cluster.input(1, 2_000, turn(cid, 2, 2_000))
    StreamClock("spans", TOPICS.repartition, PARTITIONS).broadcast(cluster.tasks.values(), cluster.repartition)  # type: ignore[arg-type]
    log = cluster.repartition.partitions[owner]
    kinds = [R.kind_of(record.headers) for record in log]
    assert kinds == [R.EVENTS, R.EVENTS, R.WATERMARK], kinds
    sources = R.loads(log[-1].value)["sources"]
    assert sources == {"0": 1_000, "1": 2_000}  # each source's own clock, never past what it read


def _legacy_repartitioned(processor: Processor, task: Task, record: Any) -> None:
    """A replica of the version before 054392a: a watermark's `source` and `ms` only."""
    if R.kind_of(record.headers) == R.WATERMARK:
        value = R.loads(record.value)
        task.source_watermark(int(value["source"]), int(value["ms"]))
    else:
        processor.repartitioned(task, record)


def _mixed_round(cluster: Cluster, legacy: set[int], clock: StreamClock) -> None:
    """Cluster.round with the partitions `legacy` on a replica of the earlier version: it reads watermarks as that
    version did and broadcasts one single-source record per (source, target)."""

    def deliver() -> None:
        for p, task in cluster.tasks.items():
            log = cluster.repartition.partitions[p]
            for record in log[cluster.repartition.offsets[p] :]:
                if p in legacy:
                    _legacy_repartitioned(cluster.processor, task, record)
                else:
                    cluster.processor.repartitioned(task, record)
            cluster.repartition.offsets[p] = len(log)

    deliver()
    new = [task for p, task in cluster.tasks.items() if p not in legacy]
    clock.broadcast(new, cluster.repartition)  # type: ignore[arg-type]  # the replicas' one clock, round after round
    now = wall_ms()
    for p in legacy:
        value = R.dumps({"source": p, "ms": task_time(cluster.tasks[p], now)})
        for target in range(PARTITIONS):
            if target != p:
                cluster.repartition.send(TOPICS.repartition, R.WATERMARK_KEY, value, R.WATERMARK, partition=target)
    deliver()
    StreamClock("spans", TOPICS.repartition, PARTITIONS).advance(cluster.tasks.values())
    for task in cluster.tasks.values():
        for dispatch in task.table.take_dispatches():
            cluster.judged.setdefault(dispatch.job.conversation_id, []).append(
                [t.span_id for t in dispatch.job.exchanges]
            )


@pytest.mark.parametrize(
    "legacy",
    [
        pytest.param(set(), id="every-replica-new"),
        pytest.param({0}, id="old-replica-owns-a-routing-source"),
        pytest.param({2}, id="old-replica-owns-the-conversation"),
    ],
)
def test_mid_rolling_upgrade_a_conversation_with_routed_turns_completes(
    monkeypatch: pytest.MonkeyPatch, legacy: set[int]
) -> None:
    """Partitions 0 and 1 route turns of conversation c (owned by 2) and move on; c's end marker is read on 2. Whoever
    runs the earlier version, c completes once every source passed the marker's grace, whole."""
    cluster = Cluster(monkeypatch)
    c = owned_by(2, "c")
    cluster.input(0, 1_000, turn(c, 1, 1_000))
    cluster.input(1, 2_000, turn(c, 2, 2_000))
    cluster.input(2, 3_000, end(c))
    for p in range(PARTITIONS):  # every input moves on past the end marker's grace
        cluster.input(p, 20_000 + p, turn(owned_by(p, f"later{p}-"), 1, 20_000 + p))
    clock = StreamClock("spans", TOPICS.repartition, PARTITIONS)
    for _ in range(6):  # 3 s of rounds
        clock._watermarks.seconds = 0.0  # every round broadcasts (the clock's own pace is 0.5 s)
        _mixed_round(cluster, legacy, clock)
    assert cluster.judged.get(c) == [[f"{c}-s1", f"{c}-s2"]], (cluster.judged.get(c), cluster.tasks[2].sources)


# -- watermarks: records nobody of ours wrote ----------------------------------------------------------------------


def _processor() -> tuple[Processor, CollectorRegistry]:
    registry = CollectorRegistry()
    return repartition_reader(PARTITIONS, registry), registry


def _raw(value: bytes) -> SimpleNamespace:
    return SimpleNamespace(
        headers=R.header(R.WATERMARK), key=R.WATERMARK_KEY, value=value, timestamp=1, partition=0, offset=7
    )


HOSTILE = [
    b'{"sources": {"x": 1}}',
    b'{"sources": {"1": null}}',
    b'{"sources": {"1": "soon"}}',
    b'{"sources": {"1": Infinity}}',  # json reads it (msgspec refuses): int() overflows
    b'{"sources": {"1": NaN}}',
    b'{"sources": {"1": [1]}}',
    b'{"sources": []}',  # not a dict: the single form is read, and is missing
    b'{"sources": 5, "source": "a", "ms": 1}',
    b"[1, 2]",
    b'"text"',
    b"\xff\xfe",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_malformed_watermark_never_stops_the_consumer_nor_moves_a_source(
    value: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    processor, _ = _processor()
    task = Task(0, ConversationTable(idle_timeout_s=1.0), restoring=False)
    task.source_watermark(1, 500)
    with caplog.at_level(logging.WARNING, logger="tracejudge.consumer.streams"):
        processor.repartitioned(task, _raw(value))
    assert task.sources == {1: 500}
    assert "unreadable repartition record at 0/7" in caplog.text


def test_an_empty_sources_dict_moves_nothing() -> None:
    """broadcast never sends one; a record with one (and a single form beside it) moves no source."""
    processor, _ = _processor()
    task = Task(0, ConversationTable(idle_timeout_s=1.0), restoring=False)
    processor.repartitioned(task, _raw(b'{"sources": {}, "source": 1, "ms": 9000}'))
    assert task.sources == {}


@pytest.mark.parametrize(
    "value",
    [
        b'{"sources": {"1": 9000, "x": 1}}',  # a bad entry after a good one
        b'{"sources": {"1": 9000, "99": 1}}',  # a source that is no input partition
        b'{"sources": {"1": 9000000000000000}}',  # far past the future slack
        b'{"sources": {"1": -5}}',
    ],
)
def test_a_malformed_watermark_is_counted_and_applied_whole_or_not_at_all(value: bytes) -> None:
    processor, registry = _processor()
    task = Task(0, ConversationTable(idle_timeout_s=1.0), restoring=False)
    processor.repartitioned(task, _raw(value))
    processor.repartitioned(task, _raw(value))
    assert task.sources == {}  # a corrupted record claims nothing, not its first entries
    unreadable = registry.get_sample_value("tracejudge_internal_records_unreadable_total", {"topic": "repartition"})
    assert unreadable == 2.0


# -- the retrying gauge --------------------------------------------------------------------------------------------


class _RetryConsumer:
    """The retry topics' consumer: positions unknown until `known` (just assigned), the log end its fetches told."""

    def __init__(self) -> None:
        self.known = False

    def paused(self) -> set[TopicPartition]:
        return set()

    def assign(self, partitions: list[TopicPartition]) -> None:
        pass

    def position(self, tp: TopicPartition, timeout_ms: int = 0) -> int:
        if not self.known:
            raise AssertionError("no position yet")  # kafka-python: the partition's offset is being reset
        return 2

    def highwater(self, tp: TopicPartition) -> int:
        return 7


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now


def _scheduler(monkeypatch: pytest.MonkeyPatch) -> tuple[RetryScheduler, _RetryConsumer, _Clock, CollectorRegistry]:
    clock = _Clock()
    monkeypatch.setattr(retry_module, "time", SimpleNamespace(monotonic=clock.monotonic, time=clock.monotonic))
    registry = CollectorRegistry()
    probe = SimpleNamespace(highwaters=lambda positions: {})
    scheduler = RetryScheduler(InternalTopics("g"), None, ConsumerInstruments(registry), probe)  # type: ignore[arg-type]
    consumer = _RetryConsumer()
    scheduler.consumer = consumer  # type: ignore[assignment]
    scheduler.partitions = {0}
    return scheduler, consumer, clock, registry


def _retrying(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("tracejudge_judgements_retrying")


def test_the_retrying_gauge_is_counted_at_the_first_call_then_at_most_every_refresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduler, consumer, clock, registry = _scheduler(monkeypatch)
    consumer.known = True
    scheduler.count_retrying()
    assert _retrying(registry) == 5  # at once: 7 - 2
    consumer.position = lambda tp, timeout_ms=0: 7  # type: ignore[method-assign]  # forwarded
    clock.now += 0.5
    scheduler.count_retrying()
    assert _retrying(registry) == 5  # not yet: counted at most every RETRYING_REFRESH_S
    clock.now += RETRYING_REFRESH_S
    scheduler.count_retrying()
    assert _retrying(registry) == 0


def test_a_count_that_could_not_be_made_is_tried_again_at_the_next_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    scheduler, consumer, clock, registry = _scheduler(monkeypatch)
    scheduler.count_retrying()  # just assigned: no position yet
    consumer.known = True
    clock.now += 0.5  # the judge loop's next gauge tick (LAG_INTERVAL_S)
    scheduler.count_retrying()
    assert _retrying(registry) == 5


def test_the_retrying_gauge_is_recounted_after_its_partitions_move(monkeypatch: pytest.MonkeyPatch) -> None:
    scheduler, consumer, clock, registry = _scheduler(monkeypatch)
    consumer.known = True
    scheduler.count_retrying()
    assert _retrying(registry) == 5
    scheduler.forget({0})  # revoked: another replica reads (and counts) them now
    clock.now += 0.5
    scheduler.count_retrying()
    assert _retrying(registry) == 0
