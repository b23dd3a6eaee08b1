"""Review of branch `state` (issue 22): failing tests that pin holes found by reading the code (Kafka-free).

Each test states the behaviour the issue and docs/state.md promise; each fails on `state` at fffea85.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kafka import TopicPartition
from prometheus_client import CollectorRegistry

from tracejudge.consumer.adapters import ConversationEvent, Turn
from tracejudge.consumer.conversation.table import ConversationState, ConversationTable, MemoryBound
from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.settings import Settings
from tracejudge.consumer.streams.assembler import Assembler
from tracejudge.consumer.streams.task import Task


def turn(cid: str, n: int, text: str = "q") -> ConversationEvent:
    return ConversationEvent(cid, "a", turn=Turn(f"{cid}-s{n}", "t", "", 10 + n, 11 + n, f"{text}{n}", "a", index=n))


def end(cid: str) -> ConversationEvent:
    return ConversationEvent(cid, "a", ended=True)


# -- ConversationTable ---------------------------------------------------------------------------------------------


def test_shared_memory_bound_never_judges_another_partitions_live_conversation_in_fragments() -> None:
    """The bound is shared by every table of the process but `_enforce_memory` only evicts from the table being
    applied to. Partition A holds yesterday's completed conversations (retention); partition B then receives a live
    3-turn conversation: each of its turns is completed (`memory_bound`) AND forgotten at once, so the judges get
    three one-turn fragments, while A's day-old completed state stays."""
    memory = MemoryBound(1 << 30)
    a, b = ConversationTable(memory=memory), ConversationTable(memory=memory)
    for i in range(40):  # A: completed conversations kept for continuations, filling the bound
        a.apply(turn(f"old{i}", 0, "x" * 400), 1000 + i)
        a.apply(end(f"old{i}"), 1000 + i)
    a.take_dispatches()
    memory.max_bytes = memory.used + 100  # A filled the process's bound (its own applies kept it just under)
    for n in range(3):
        b.apply(turn("live", n), 5000 + n)
    b.apply(end("live"), 5003)
    fragments = [[t.span_id for t in d.job.exchanges] for d in b.take_dispatches()]
    assert fragments == [["live-s0", "live-s1", "live-s2"]], fragments  # on `state`: [[s0], [s1], [s2]]


def test_one_outcome_never_returned_does_not_pin_every_completed_conversation() -> None:
    """`advance` stops the retention scan at the first completed conversation whose outcome is unknown (`break`):
    one lost or unreadable job (the judge worker skips an unreadable record without a verdict) keeps every later
    completed conversation of the partition in memory and in the changelog forever."""
    table = ConversationTable(retention_s=10.0)
    table.apply(turn("lost", 0), 1000)
    table.apply(end("lost"), 1000)  # dispatched; its outcome never comes back
    for i in range(5):
        table.apply(turn(f"ok{i}", 0), 1100 + i)
        table.apply(end(f"ok{i}"), 1100 + i)
    for dispatch in table.take_dispatches():
        if dispatch.job.conversation_id != "lost":
            table.verdict(dispatch.job.conversation_id, dispatch.job.content_id, "judged", 1200)
    table.advance(1_000_000)  # far past retention
    kept = sorted(cid for cid in table.states if cid != "lost")
    assert kept == [], kept  # on `state`: all five judged conversations are kept


# -- Assembler (fake clients) --------------------------------------------------------------------------------------


class _Future:
    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    def add_errback(self, fn: Any) -> _Future:
        if self.error is not None:
            fn(self.error)
        return self

    def add_callback(self, fn: Any) -> _Future:
        return self


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, int | None]] = []
        self.fail: Any = lambda topic, partition: False

    def send(self, topic: str, *, key: Any = None, value: Any = None, headers: Any = None, **kw: Any) -> _Future:
        partition = kw.get("partition")
        if self.fail(topic, partition) or (value is not None and len(value) > 1_048_576):  # kafka-python's limit
            return _Future(RuntimeError(f"send to {topic}/{partition} failed"))
        self.sent.append((topic, key, partition))
        return _Future(None)

    def flush(self, timeout: float | None = None) -> None:
        pass

    def close(self, timeout: float | None = None) -> None:
        pass


class FakeGroup:
    def __init__(self) -> None:
        self.commits: list[dict[TopicPartition, Any]] = []

    def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        self.commits.append(dict(offsets))

    async def commit_async(self, offsets: dict[TopicPartition, Any]) -> None:
        self.commits.append(dict(offsets))

    def pause(self, *tps: Any) -> None:
        pass

    def resume(self, *tps: Any) -> None:
        pass

    def seek(self, tp: Any, offset: int) -> None:
        pass

    def committed(self, tp: Any) -> int | None:
        return 0


class FakeSide:
    def highwater(self, tp: Any) -> int:
        return 0  # an empty changelog partition: the restore is complete


def assembler(**options: Any) -> Assembler:
    registry = CollectorRegistry()
    from tracejudge.consumer.kafka import KafkaClients
    from tracejudge.consumer.streams.instruments import StreamsInstruments

    settings = Settings.from_options(topic="spans", group_id="g", **options)
    producers: list[FakeProducer] = []

    def producer_factory(**_: Any) -> FakeProducer:
        producers.append(FakeProducer())
        return producers[-1]

    asm = Assembler(
        settings,
        ConsumerInstruments(registry),
        StreamsInstruments(registry),
        lambda job: True,
        partitions=2,
        clients=KafkaClients("localhost:9", producer_factory=producer_factory),
    )
    asm.collector.open()
    asm.group = FakeGroup()  # type: ignore[assignment]
    asm.side = FakeSide()  # type: ignore[assignment]
    return asm


def open_state(cid: str) -> ConversationState:
    table = ConversationTable()
    for n in range(2):
        table.apply(turn(cid, n), 1000 + n)
    state = table.get(cid)
    assert state is not None
    return ConversationState.from_json(state.to_json())


def test_open_bound_reached_while_a_partition_restores_loses_the_completion() -> None:
    """`_bound_open` counts and completes the open conversations of RESTORING tasks too; `_finish_restores` then
    discards that table's dispatches and changes (`take_dispatches()`, `take_changes()`), so the conversation is
    marked dispatched (outcome None) but no job ever reaches the judge queue: never judged, an identical later
    completion is an `unchanged_completion`, and its unknown outcome pins retention."""
    asm = assembler(max_open_conversations=1)
    restoring = Task(1, asm.state.new_table())
    for cid in ("r1", "r2"):  # the changelog being read: two open conversations
        restoring.table.restore(open_state(cid), cid)
    asm.tasks = {1: restoring}
    # step() order: complete_restorations() runs before, but a long restore spans many steps
    asm.bounds.hold_open(asm.tasks.values())
    asm.complete_restorations()
    asm.processor.dispatch(asm.tasks.values())
    assert asm.collector.producer is not None
    jobs = [key for topic, key, _ in asm.collector.producer.sent if topic == asm.topics.judge_queue]  # type: ignore[attr-defined]
    completed = [cid for cid, s in restoring.table.states.items() if s.status == "completed"]
    # Either nothing completes during a restore, or what completes is sent to the judges.
    assert sorted(k.decode() for k in jobs) == sorted(completed), (jobs, completed)


def test_a_failed_send_is_not_forgotten_when_another_partition_is_revoked() -> None:
    """`_send_failed` is process-wide but a revocation's `_flush(revoked)` clears it and recovers only the revoked
    tasks: the kept partition's lost routed events / judge jobs are forgotten and the next commit moves its input
    offset past them (at-least-once hole)."""
    asm = assembler()
    keep, leave = (
        Task(0, asm.state.new_table(), restoring=False),
        Task(1, asm.state.new_table(), restoring=False),
    )
    keep.input_position, leave.input_position = 10, 20
    asm.tasks = {0: keep, 1: leave}
    producer = asm.collector.producer
    assert isinstance(producer, FakeProducer)
    producer.fail = lambda topic, partition: topic == asm.topics.judge_queue and partition == 0
    keep.table.apply(turn("c", 0), 1000)  # partition 0's conversation completes; its job's send fails
    keep.table.apply(end("c"), 1000)
    asm.processor.dispatch(asm.tasks.values())
    assert asm.collector.failed
    asyncio.run(asm.on_partitions_revoked([TopicPartition("spans", 1)]))
    asm.commit()  # the periodic commit
    group = asm.group
    assert isinstance(group, FakeGroup)
    committed = {tp.partition: meta.offset for commit in group.commits for tp, meta in commit.items()}
    assert 0 not in committed, committed  # on `state`: {0: 10} — committed past the job that was never written


class _Record:
    def __init__(self, offset: int) -> None:
        self.topic, self.partition, self.offset = "spans", 0, offset
        self.key, self.value, self.timestamp, self.headers = b"trace-1", b"", 1000, []


def test_an_input_record_too_large_to_route_does_not_stop_every_commit(monkeypatch: Any) -> None:
    """A trace-keyed record (the Collector) of up to --max-record-bytes (8 MiB) is accepted, and its events are routed
    unclipped (MAX_FIELD_CHARS applies only in the table) in ONE repartition record. Past the producer's
    max_request_size (1 MiB) kafka-python fails that send (MessageSizeTooLargeError) every time: `_flush` recovers
    every task, the replay fails again, and no input offset of the process is ever committed again (each cycle also
    re-dispatches the jobs completed since the last commit: repeated judge calls)."""
    from tracejudge.consumer.kafka.partitioner import state_partition
    from tracejudge.consumer.streams import processor as module

    cid = next(f"conv{i}" for i in range(100) if state_partition(f"conv{i}", 2) == 1)  # owned by partition 1
    big = ConversationEvent(cid, "a", turn=Turn("s1", "t", "", 1, 2, "q" * 1_200_000, "a", index=0))
    monkeypatch.setattr(module, "read_events", lambda value, **kw: ([big], None))
    asm = assembler()
    producer = asm.collector.producer
    assert isinstance(producer, FakeProducer)
    for _cycle in range(3):  # read the record, commit; on failure the task is rebuilt and the record read again
        task = asm.tasks.get(0) or Task(0, asm.state.new_table(), restoring=False)
        task.restoring = False
        asm.tasks = {0: task}
        asm.processor.input(task, _Record(5))
        task.input_position = 6
        asm.commit()
    group = asm.group
    assert isinstance(group, FakeGroup)
    assert group.commits, "three commit cycles, nothing committed: the record is neither routed nor set aside"


def test_open_bound_with_an_interleaved_backlog_is_counted_and_ends_whole() -> None:
    """The documented bound (docs/state.md, Limits): read from an interleaved backlog, conversations past
    --max-open-conversations complete early (`memory_bound`, counted) on the turns read so far; each continues as a
    new version, so its last judgement has the whole transcript. (Not cutting them needs a spill store: not built.)"""
    asm = assembler(max_open_conversations=2)
    task = Task(0, asm.state.new_table(), restoring=False)
    asm.tasks = {0: task}
    ids = [f"i{k}" for k in range(4)]
    for n in range(2):  # the backlog: turn 0 of every conversation, then turn 1 of every conversation
        for cid in ids:
            task.table.apply(turn(cid, n), 1000 + n)
            asm.bounds.hold_open(asm.tasks.values())  # as step() runs it after each poll batch
    for cid in ids:
        task.table.apply(end(cid), 1002)
    dispatches = task.table.take_dispatches()
    early = [d for d in dispatches if d.job.completed_by == "memory_bound"]
    assert early and task.table.counts["completed_at_bound"] == len(early)
    last = {d.job.conversation_id: [t.span_id.split("-")[1] for t in d.job.exchanges] for d in dispatches}
    assert last == {cid: ["s0", "s1"] for cid in ids}, last


def test_after_a_failed_send_is_recovered_from_commits_resume(tmp_path: Path) -> None:
    """A failed send: the next commit renews the producer and rebuilds the tasks (nothing committed); once they are
    restored, commits go on. A failure flag that survived the renewal would stop every commit for good."""
    asm = assembler(state_dir=str(tmp_path))
    task = asm.state.new_task(0)
    task.restoring = False
    task.input_position = 5
    asm.tasks = {0: task}
    producer = asm.collector.producer
    assert isinstance(producer, FakeProducer)
    producer.fail = lambda topic, partition: topic == asm.topics.judge_queue
    task.table.apply(turn("c", 0), 1000)
    task.table.apply(end("c"), 1000)
    asm.processor.dispatch(asm.tasks.values())
    assert asm.collector.failed
    asm.commit()  # renewal + recovery, nothing committed
    group = asm.group
    assert isinstance(group, FakeGroup) and group.commits == []
    assert not asm.collector.failed, "the renewal clears the failure"
    assert asm.collector.producer is not producer
    asm.complete_restorations()  # FakeSide: an empty changelog
    fresh = asm.tasks[0]
    assert fresh is not task and not fresh.restoring
    fresh.input_position = 5
    asm.commit()
    assert group.commits and group.commits[-1], group.commits


class _Acked:
    """A send's future that answers at once: acknowledged with an offset, or failed."""

    def __init__(self, error: Exception | None, offset: int | None) -> None:
        self.error, self.offset = error, offset

    def add_errback(self, fn: Any) -> _Acked:
        if self.error is not None:
            fn(self.error)
        return self

    def add_callback(self, fn: Any) -> _Acked:
        if self.error is None:
            fn(SimpleNamespace(offset=self.offset))
        return self


def test_no_checkpoint_past_an_unacknowledged_positions_record(tmp_path: Path) -> None:
    """Step three: the checkpoint moves only once the positions record it carries was acknowledged."""
    asm = assembler(state_dir=str(tmp_path))
    task = asm.state.new_task(0)
    task.restoring = False
    asm.tasks = {0: task}
    producer = asm.collector.producer
    assert isinstance(producer, FakeProducer)
    state: dict[str, Any] = {"n": 0, "fail_positions": False}

    def send(topic: str, *, key: bytes | None = None, value: Any = None, headers: Any = None, **kw: Any) -> _Acked:
        state["n"] += 1
        if state["fail_positions"] and key == b"\x00tracejudge.positions":
            return _Acked(RuntimeError("positions write failed"), None)
        return _Acked(None, state["n"])

    producer.send = send  # type: ignore[method-assign]
    task.table.apply(turn("c", 0), 1000)
    task.input_position = 1
    asm.commit()
    first = asm.state.directory.read_checkpoint(0)
    assert first is not None and first["positions"]["input"] == 1, first
    state["fail_positions"] = True
    task.table.apply(turn("c", 1), 1001)
    task.input_position = 2
    asm.commit()
    group = asm.group
    assert isinstance(group, FakeGroup)
    assert [c for c in group.commits if any(m.offset == 2 for m in c.values())] == []
    assert asm.state.directory.read_checkpoint(0)["positions"]["input"] == 1  # type: ignore[index]


def test_the_stream_clock_watches_the_span_topic_and_the_repartition_topic() -> None:
    """The clock's caught-up check reads each topic's own high watermark: swapped, it would call a lagging input
    caught up."""
    asm = assembler()
    assert (asm.clock.topic, asm.clock.repartition) == (asm.settings.topic, asm.topics.repartition)
    assert asm.clock.topic != asm.clock.repartition
