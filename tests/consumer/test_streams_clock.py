"""A state partition's record-time clock moves only with records that carry record time.

Watermarks and verdict acks are stamped with wall time when sent. Taking their timestamps moved a lagging
partition's clock to "now" (and it broadcast that clock as how far it had routed its input), so while catching up on
a backlog older than the idle timeout every conversation with routed events could complete before its turns came.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from kafka import TopicPartition
from kafka.protocol.consumer.fetch import FetchResponse
from prometheus_client import CollectorRegistry

from tracejudge.consumer.adapters import ConversationEvent, Turn
from tracejudge.consumer.conversation.table import ConversationTable
from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.kafka.topics import InternalTopics
from tracejudge.consumer.streams import records as R
from tracejudge.consumer.streams.clock import APPEND_SLACK_MS, StreamClock, task_time
from tracejudge.consumer.streams.instruments import StreamsInstruments
from tracejudge.consumer.streams.processor import Processor
from tracejudge.consumer.streams.task import Task


def repartition_reader(partitions: int = 4, registry: CollectorRegistry | None = None) -> Processor:
    """A processor for `repartitioned` alone: its collector is never used there."""
    registry = registry or CollectorRegistry()
    return Processor(
        SimpleNamespace(set_aside=lambda record, reason: None),  # type: ignore[arg-type]
        InternalTopics("g"),
        partitions,
        ConsumerInstruments(registry),
        StreamsInstruments(registry),
        lambda job: True,
        max_record_bytes=1 << 20,
    )


def record(kind: str, key: bytes, value: object, timestamp: int) -> SimpleNamespace:
    return SimpleNamespace(
        headers=R.header(kind), key=key, value=R.dumps(value), timestamp=timestamp, partition=0, offset=0
    )


def test_watermarks_and_verdicts_do_not_move_the_record_clock() -> None:
    processor = repartition_reader()
    task = Task(0, ConversationTable(idle_timeout_s=1.0), restoring=False)
    now = int(time.time() * 1000)
    backlog = now - 60_000  # records a minute old, being caught up on
    turn = Turn("s1", "t1", "", 1, 2, "question", "answer")
    event = ConversationEvent("conv-1", "agent", turn=turn)
    processor.repartitioned(task, record(R.EVENTS, b"conv-1", {"events": [R.event_to_json(event)]}, backlog))
    assert task.watermark_ms == 0  # a routed event carries its source's time, not this input's
    task.input_record(backlog)  # the task's own input, read up to the backlog
    processor.repartitioned(task, record(R.WATERMARK, R.WATERMARK_KEY, {"source": 1, "ms": backlog}, now))
    processor.repartitioned(task, record(R.VERDICT, b"conv-1", {"content_id": "x", "outcome": "judged"}, now))
    assert task.sources == {1: backlog}
    assert task.watermark_ms == backlog  # not `now`: input up to now was not read
    task.table.advance(task.watermark_ms, backlog)
    assert task.table.open_count == 1  # its other turns may still be in the backlog


def fetch_response(
    highwaters: dict[int, int],
    *,
    session_id: int = 0,
    topic: str = "spans",
    throttle_time_ms: int = 0,
    error_code: int = 0,
) -> FetchResponse:
    """A fetch answer as kafka-python decodes it: partition -> high watermark of `topic`."""
    partitions = [
        FetchResponse.FetchableTopicResponse.PartitionData(partition_index=p, error_code=0, high_watermark=hw)
        for p, hw in highwaters.items()
    ]
    return FetchResponse(
        version=12,
        throttle_time_ms=throttle_time_ms,
        error_code=error_code,
        session_id=session_id,
        responses=[FetchResponse.FetchableTopicResponse(topic=topic, partitions=partitions)] if partitions else [],
    )


class _Consumer:
    """A consumer: kafka-python's remembered high watermark, and its fetcher's answer handler (what `FetchAnswers`
    watches)."""

    def __init__(self, highwater: int | None, topic: str = "spans") -> None:
        self.remembered = highwater
        self.topic = topic
        self._fetcher = SimpleNamespace(_handle_fetch_response=lambda node, asked, sent, response: None)

    def highwater(self, tp: object) -> int | None:
        return self.remembered

    def answer(self, highwater: int | None, *, sent: float | None = None, session_id: int = 0) -> None:
        """A fetch of partition 0, sent at monotonic `sent` (now), answered: `None` leaves it out (an incremental
        session: unchanged)."""
        asked = {TopicPartition(self.topic, 0): 0}
        response = fetch_response({} if highwater is None else {0: highwater}, session_id=session_id, topic=self.topic)
        self._fetcher._handle_fetch_response(1, asked, time.monotonic() if sent is None else sent, response)


class _Thread:
    """What the stream thread hands the clock: its tasks and its two consumers."""

    def __init__(self, task: Task, group: _Consumer) -> None:
        self.clock = StreamClock("spans", "g-repartition", 1)
        self.task, self.group, self.side = task, group, _Consumer(None, "g-repartition")
        self.clock.watch(group, self.side)  # type: ignore[arg-type]


def _assembler() -> tuple[_Thread, Task, _Consumer]:
    group = _Consumer(10)
    task = Task(0, ConversationTable(idle_timeout_s=1.0), restoring=False, input_position=10)
    task.watermark_ms = int(time.time() * 1000) - 60_000
    return _Thread(task, group), task, group


def _check(assembler: _Thread, *, routed: int | None = 0) -> None:
    """The clock's probe, the repartition partition answered read to the end just now (`routed`: its end; None: no
    answer)."""
    if routed is not None:
        assembler.side.answer(routed)
    assembler.clock.probe([assembler.task], assembler.group, assembler.side, force=True)  # type: ignore[arg-type]


def test_a_remembered_high_watermark_never_lets_wall_time_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The group consumer's last fetch said offset 10 is the end, and then it stopped fetching (kafka-python fetches
    nothing while a rebalance is under way; a busy thread): however often and however long the clock is checked, no
    answer comes, and it stays at record time. CI found it: a replica ten seconds in a join claimed its partition
    read by the value it remembered, and four conversations completed without the turn written meanwhile."""
    import tracejudge.consumer.streams.clock as module

    assembler, task, _group = _assembler()
    now = int(time.time() * 1000)
    for seconds in (0, 3, 10, 600):
        monkeypatch.setattr(module, "wall_ms", lambda seconds=seconds: now + seconds * 1000)
        _check(assembler)
        assert task_time(task, now + seconds * 1000) == task.watermark_ms


def test_a_fetch_answered_at_the_position_moves_the_clock_to_when_it_was_sent() -> None:
    assembler, task, group = _assembler()
    before = int(time.time() * 1000) - 2_000 - APPEND_SLACK_MS
    group.answer(10, sent=time.monotonic() - 2.0)  # sent two seconds ago, answered now: still at the position
    _check(assembler)
    clock = task_time(task, int(time.time() * 1000))
    assert before - 50 <= clock <= before + 50  # when it was sent: what was written since is not claimed read


def test_the_repartition_partition_unread_or_unanswered_claims_nothing() -> None:
    """Events routed here and not read yet, or no answer yet from the repartition partition's consumer (just
    sought): the input read to its end is not enough."""
    assembler, task, group = _assembler()
    group.answer(10)
    _check(assembler, routed=3)  # 3 routed records not read
    assert task_time(task, int(time.time() * 1000)) == task.watermark_ms
    task.repartition_read(3)  # read: the answer kept (3) would now do
    assembler.clock.forget([0], side=True)  # sought again: the earlier answers are not about this reading
    _check(assembler, routed=None)
    assert task_time(task, int(time.time() * 1000)) == task.watermark_ms
    _check(assembler, routed=3)  # this reading's first answer
    assert task_time(task, int(time.time() * 1000)) > task.watermark_ms


def test_an_answer_from_before_the_partition_was_assigned_again_is_not_this_assignments() -> None:
    """Lost at offset 10, assigned again after another owner committed 20: the answer kept from before says
    nothing (a lag gauge read 10 - 20), until this assignment's first fetch answers."""
    assembler, task, group = _assembler()
    group.answer(10, sent=time.monotonic() - 30.0)
    assembler.clock.forget([0])  # assigned again
    assert assembler.clock.answer(task, group) is None  # type: ignore[arg-type]
    group.answer(20)
    answer = assembler.clock.answer(task, group)  # type: ignore[arg-type]
    assert answer is not None and answer.highwater == 20


def test_an_answer_with_more_records_keeps_record_time() -> None:
    assembler, task, group = _assembler()
    group.answer(15)  # 5 more records in the partition
    _check(assembler)
    assert task_time(task, int(time.time() * 1000)) == task.watermark_ms


def test_an_incremental_session_leaving_the_partition_out_answers_it_unchanged() -> None:
    """Apache Kafka's incremental fetch session leaves out a partition with nothing new: the last high watermark
    stands, as of that fetch. Without a session (Tansu) a partition left out says nothing."""
    assembler, task, group = _assembler()
    five_ago = int(time.time() * 1000) - 5_000 - APPEND_SLACK_MS
    group.answer(15, sent=time.monotonic() - 5.0, session_id=7)  # 5 records to read
    _check(assembler)
    assert task_time(task, int(time.time() * 1000)) == task.watermark_ms
    task.input_read(15)  # read them: caught up as of that fetch
    _check(assembler)
    assert five_ago - 50 <= task_time(task, int(time.time() * 1000)) <= five_ago + 50
    group.answer(None, sent=time.monotonic() - 1.0, session_id=0)  # no session: left out says nothing
    _check(assembler)
    assert five_ago - 50 <= task_time(task, int(time.time() * 1000)) <= five_ago + 50
    one_ago = int(time.time() * 1000) - 1_000 - APPEND_SLACK_MS
    group.answer(None, sent=time.monotonic() - 1.0, session_id=7)  # the session: unchanged, still 15
    _check(assembler)
    assert one_ago - 50 <= task_time(task, int(time.time() * 1000)) <= one_ago + 50


def test_the_lag_probe_never_raises_into_the_judge_worker() -> None:
    """CI found it: judges busy (partitions paused) during a broker outage, the probe's consumer could not bootstrap
    and its KafkaTimeoutError stopped the judge worker, and with it the consumer. Now it answers nothing, and the next
    call tries again."""
    from kafka import TopicPartition
    from kafka.errors import KafkaTimeoutError

    from tracejudge.consumer.kafka import KafkaClients
    from tracejudge.consumer.kafka.highwater import HighwaterProbe

    attempts: list[int] = []

    def unreachable(**_: object) -> object:
        attempts.append(1)
        raise KafkaTimeoutError("Unable to bootstrap from 127.0.0.1:1")

    probe = HighwaterProbe(KafkaClients("127.0.0.1:1", consumer_factory=unreachable))
    tp = TopicPartition("q", 0)
    assert probe.highwaters({tp: 5}) == {}
    assert probe.highwaters({tp: 5}) == {}
    assert len(attempts) == 2


class _Sent:
    """A record collector that keeps what is sent."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, bytes, str, int]] = []

    def send(self, topic: str, key: bytes, value: bytes, kind: str, *, partition: int) -> None:
        self.records.append((topic, key, value, kind, partition))


def test_one_watermark_record_per_target_carries_every_source_and_an_earlier_version_reads_one() -> None:
    """A replica owning 3 of 4 partitions sends 4 records a round (not 3 × 3): each target gets every source but
    itself. A receiver applies all of them; a receiver of an earlier version reads the single-source form."""
    tasks = []
    for partition, ms in ((0, 1_000), (1, 2_000), (3, 3_000)):
        task = Task(partition, ConversationTable(idle_timeout_s=1.0), restoring=False)
        task.input_record(ms)
        tasks.append(task)
    sent = _Sent()
    StreamClock("spans", "spans-repartition", 4).broadcast(tasks, sent)  # type: ignore[arg-type]
    assert [r[4] for r in sent.records] == [0, 1, 2, 3]
    assert all(r[3] == R.WATERMARK and r[1] == R.WATERMARK_KEY for r in sent.records)
    processor = repartition_reader()
    for _topic, key, value, kind, target in sent.records:
        receiver = Task(target, ConversationTable(idle_timeout_s=1.0), restoring=False)
        processor.repartitioned(receiver, record(kind, key, R.loads(value), 5_000))
        expected = {p: ms for p, ms in ((0, 1_000), (1, 2_000), (3, 3_000)) if p != target}
        assert receiver.sources == expected
        legacy = R.loads(value)  # what an earlier version reads: `source` and `ms`
        assert expected[int(legacy["source"])] == int(legacy["ms"])
