"""A task's state changes on the stream thread only.

The producer answers on its sender thread: an acknowledgement or a failure is queued there and applied when the stream
thread asks (`RecordCollector.answers`, at each flush, `failed` and round). The rebalance listener runs on
kafka-python's IO thread: an assignment or a loss is queued and applied after the poll returns. Restoration is decided
and applied by the state manager alone (`StateManager.complete_restorations`).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.kafka import KafkaClients, TopicPartition
from tracejudge.consumer.settings import Settings
from tracejudge.consumer.streams import records as R
from tracejudge.consumer.streams.assembler import Assembler
from tracejudge.consumer.streams.instruments import StreamsInstruments
from tracejudge.consumer.streams.task import Task


class _Future:
    """A send's future whose callbacks the test calls, from the thread it picks."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []
        self.errbacks: list[Any] = []

    def add_callback(self, fn: Any) -> _Future:
        self.callbacks.append(fn)
        return self

    def add_errback(self, fn: Any) -> _Future:
        self.errbacks.append(fn)
        return self


class _Producer:
    def __init__(self) -> None:
        self.futures: list[_Future] = []

    def send(self, topic: str, **_: Any) -> _Future:
        self.futures.append(_Future())
        return self.futures[-1]

    def flush(self, timeout: float | None = None) -> None:
        pass

    def close(self, timeout: float | None = None) -> None:
        pass


class _Group:
    def __init__(self) -> None:
        self.paused: list[Any] = []
        self.resumed: list[Any] = []
        self.commits: list[dict[Any, Any]] = []

    def pause(self, *tps: Any) -> None:
        self.paused.extend(tps)

    def resume(self, *tps: Any) -> None:
        self.resumed.extend(tps)

    def commit(self, offsets: dict[Any, Any]) -> None:
        self.commits.append(dict(offsets))

    async def commit_async(self, offsets: dict[Any, Any]) -> None:
        self.commits.append(dict(offsets))


class _Side:
    def __init__(self, ends: dict[int, int]) -> None:
        self.ends = ends

    def highwater(self, tp: Any) -> int | None:
        return self.ends.get(tp.partition)


def new_assembler(tmp_path: Path, *, partitions: int = 2, consumer_factory: Any = None) -> Assembler:
    """An assembler over topic "spans" and group "g", its producer a stand-in (`consumer_factory`: its consumers)."""
    registry = CollectorRegistry()
    settings = Settings.from_options(topic="spans", group_id="g", state_dir=str(tmp_path))
    return Assembler(
        settings,
        ConsumerInstruments(registry),
        StreamsInstruments(registry),
        lambda job: True,
        partitions=partitions,
        clients=KafkaClients(
            "localhost:9", consumer_factory=consumer_factory, producer_factory=lambda **_: _Producer()
        ),
    )


def assembler(tmp_path: Path) -> Assembler:
    asm = new_assembler(tmp_path)
    asm.collector.open()
    asm.group = _Group()  # type: ignore[assignment]
    asm.side = _Side({})  # type: ignore[assignment]
    return asm


def on_another_thread(fn: Any, *args: Any) -> None:
    thread = threading.Thread(target=fn, args=args)
    thread.start()
    thread.join()


def test_the_senders_answers_change_the_task_only_when_the_stream_thread_applies_them(tmp_path: Path) -> None:
    asm = assembler(tmp_path)
    task = Task(0, asm.state.new_table(), restoring=False)
    collector = asm.collector
    producer = collector.producer
    assert isinstance(producer, _Producer)
    collector.send(asm.topics.changelog, R.POSITIONS_KEY, b"{}", R.POSITIONS, partition=0, acked=task)
    collector.send(asm.topics.repartition, "c", b"{}", R.EVENTS, partition=1)
    acked, failed = producer.futures
    on_another_thread(acked.callbacks[0], SimpleNamespace(offset=41))  # the sender thread answers
    on_another_thread(failed.errbacks[0], RuntimeError("broker gone"))
    assert task.changelog_acked is None  # queued, not written from the sender thread
    assert collector.flushed(1.0)  # the stream thread applies what was answered
    assert task.changelog_acked == 42
    assert collector.failed


def test_a_renewed_producers_late_failure_is_not_remembered(tmp_path: Path) -> None:
    asm = assembler(tmp_path)
    collector = asm.collector
    old = collector.producer
    assert isinstance(old, _Producer)
    collector.send(asm.topics.repartition, "c", b"{}", R.EVENTS, partition=1)
    collector.renew()  # recovered from: what the old producer still says is not a new failure
    on_another_thread(old.futures[0].errbacks[0], RuntimeError("aborted"))
    assert not collector.failed


def test_an_assignment_learned_on_the_io_thread_makes_its_task_on_the_stream_thread(tmp_path: Path) -> None:
    asm = assembler(tmp_path)
    made_on: list[int] = []
    new_task = asm.state.new_task

    def recording(partition: int) -> Task:
        made_on.append(threading.get_ident())
        return new_task(partition)

    asm.state.new_task = recording  # type: ignore[method-assign]
    tp = TopicPartition("spans", 1)
    on_another_thread(asyncio.run, asm.on_partitions_assigned([tp]))  # kafka-python's IO thread
    group = asm.group
    assert isinstance(group, _Group)
    assert group.paused == [tp] and asm.tasks == {}  # paused at once; no task made there
    asm.commit()  # the stream thread applies the assignment first (as `step` does right after its poll)
    assert made_on == [threading.get_ident()] and asm.tasks[1].restoring
    asm.side = _Side({1: 0})  # type: ignore[assignment]  # an empty changelog: restored
    asm.complete_restorations()
    assert not asm.tasks[1].restoring and group.resumed == [tp]


def test_restoration_is_decided_and_applied_by_the_state_manager(tmp_path: Path) -> None:
    asm = assembler(tmp_path)
    state = asm.state
    reading, done = state.new_task(0), state.new_task(1)
    positions = SimpleNamespace(
        key=R.POSITIONS_KEY,
        value=R.dumps({"repartition": 7, "watermark": 5_000, "sources": {"0": 4_000}}),
        headers=R.header(R.POSITIONS),
        partition=1,
        offset=2,
    )
    state.restore_records(done, [positions])
    tasks = {0: reading, 1: done}
    ends = {0: 10, 1: 3}
    finished = state.complete_restorations(tasks, ends.get)
    assert finished == [done] and not done.restoring and reading.restoring  # 0 has 10 records to read, 1 read them
    assert (done.changelog_position, done.repartition_position, done.watermark_ms, done.sources) == (
        3,
        7,
        5_000,
        {0: 4_000},
    )
    state.restore_records(done, [positions])  # an active task takes no changelog record
    assert done.changelog_position == 3
    reading.checkpointed = 50  # a store checkpointed past the changelog's end (the topic was recreated)
    state.complete_restorations(tasks, ends.get)
    assert tasks[0] is not reading and tasks[0].restoring and tasks[0].changelog_position == 0
