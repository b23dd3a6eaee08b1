"""Stream time: the clock by which a task's conversations go idle and complete (Kafka Streams' punctuation by
stream time, with Flink's watermarks across the repartition shuffle).

A task's clock is the highest record timestamp it has read from its own input partition (never a routed event's:
`Processor.repartitioned`), or the wall time at which a fetch was sent that found nothing left to read (`probe`); a
lagging, paused or rebalancing task never makes its conversations idle, and a stale high watermark never passes for
"caught up". Conversations with routed events complete by the slowest other source, whose clock each task broadcasts
through the repartition topic.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..kafka import KafkaConsumer, KafkaError, TopicPartition
from ..kafka.highwater import FetchAnswer, FetchAnswers
from . import records as R
from .record_collector import RecordCollector
from .task import Task, active

logger = logging.getLogger("tracejudge.consumer.streams")
FUTURE_SLACK_MS = 5 * 60 * 1000  # a record stamped further ahead than this (a producer's bad clock) is not believed
WATERMARK_INTERVAL_S = 0.5
# A record is stamped by its producer before it is written (linger, a retry): one stamped up to this long before a
# fetch was sent may not have been in the partition yet. The end grace (--end-grace) covers longer delays.
APPEND_SLACK_MS = 1_000


def wall_ms() -> int:
    return int(time.time() * 1000)


def record_time(record: Any) -> int:
    """A record's timestamp, or now when it has none; never believed further ahead than FUTURE_SLACK_MS."""
    now = wall_ms()
    ts = record.timestamp if isinstance(record.timestamp, int) and record.timestamp > 0 else now
    return min(ts, now + FUTURE_SLACK_MS)


def task_time(task: Task, now: int) -> int:
    """A task's clock: its highest record timestamp, or the wall time by which a fresh fetch found its input
    partition read to the end (never later than `now`)."""
    return min(now, max(task.watermark_ms, task.caught_up_ms)) if task.caught_up_ms else task.watermark_ms


class _Every:
    """Due at most once every `seconds` (monotonic time)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._last = 0.0

    def due(self, *, force: bool = False) -> bool:
        if not force and time.monotonic() - self._last < self.seconds:
            return False
        self._last = time.monotonic()
        return True


class StreamClock:
    """The tasks' clocks: when their input is read to the end, how far their conversations have gone idle, and the
    watermarks they send one another. Driven by the stream thread only."""

    def __init__(
        self, topic: str, repartition: str, partitions: int, on_unreadable: Callable[[str], None] | None = None
    ) -> None:
        self.topic = topic
        self._on_unreadable = on_unreadable  # given "group" or "restore" for each fetch answer that could not be read
        self.repartition = repartition
        self.partitions = partitions
        self._probes = _Every(WATERMARK_INTERVAL_S)
        self._watermarks = _Every(WATERMARK_INTERVAL_S)
        self._rounds = 0  # broadcasts so far: which source the single-source form carries (each in turn)
        self._answers: FetchAnswers | None = None  # the group consumer's fetch answers (`watch`)
        self._side_answers: FetchAnswers | None = None  # the side consumer's (repartition partitions)

    def input_position(self, task: Task, group: KafkaConsumer) -> int | None:
        """The next input offset the task processes (the group consumer's position before it read anything)."""
        if task.input_position is not None:
            return task.input_position
        try:
            return group.position(TopicPartition(self.topic, task.partition), timeout_ms=0)
        except Exception:
            return None

    def watch(self, group: KafkaConsumer, side: KafkaConsumer) -> None:
        """Keep what the group and side consumers' fetches answer (`FetchAnswers`), from before their first fetch."""
        self._answers = FetchAnswers.install(group, self._unreadable("group"))
        self._side_answers = FetchAnswers.install(side, self._unreadable("restore"))
        if self._answers is None or self._side_answers is None:
            logger.warning(
                "this kafka-python keeps its fetcher elsewhere: the stream clock trusts the last high watermark it"
                " remembers, and a conversation may complete while a turn waits behind a rebalance (install the"
                " kafka-python version tracejudge requires)"
            )

    def _unreadable(self, consumer: str) -> Callable[[], None] | None:
        count = self._on_unreadable
        return None if count is None else lambda: count(consumer)

    def forget(self, partitions: Iterable[int], *, side: bool = False) -> None:
        """Input partitions assigned (or, `side`, repartition partitions sought): earlier answers are not theirs."""
        if side and self._side_answers is not None:
            self._side_answers.forget([TopicPartition(self.repartition, p) for p in partitions])
        elif not side and self._answers is not None:
            self._answers.forget([TopicPartition(self.topic, p) for p in partitions])

    def answer(self, task: Task, group: KafkaConsumer) -> FetchAnswer | None:
        """The high watermark the latest fetch of the task's input partition answered, and when that fetch was sent."""
        return self._latest(self._answers, group, TopicPartition(self.topic, task.partition))

    def _latest(self, answers: FetchAnswers | None, consumer: KafkaConsumer, tp: TopicPartition) -> FetchAnswer | None:
        if answers is not None:
            return answers.latest(tp)
        try:
            end = consumer.highwater(tp)  # no way to tell when it was answered: taken as it is
        except KafkaError:  # not assigned (yet)
            return None
        return None if end is None else FetchAnswer(end, wall_ms())

    def probe(self, tasks: Iterable[Task], group: KafkaConsumer, side: KafkaConsumer, *, force: bool = False) -> None:
        """Every WATERMARK_INTERVAL_S (or at once: `force`): a task whose input and repartition partitions a fetch
        each found read to the end (the high watermark it answered at most the task's position there) is caught up as
        of the earlier of the times those fetches were sent, less APPEND_SLACK_MS. While a consumer does not fetch
        (paused; rebalancing: kafka-python fetches nothing until the join completes; its thread busy) no answer
        comes, and the clock holds, however long: the high watermark kafka-python remembers from before is never
        taken for an answer (it claimed a turn written during a rebalance read, and its conversation completed
        without it)."""
        if not self._probes.due(force=force):
            return
        for task in active(tasks):
            answer = self.answer(task, group)
            position = self.input_position(task, group)
            if answer is None or position is None or answer.highwater > position:
                continue
            routed = self._latest(self._side_answers, side, TopicPartition(self.repartition, task.partition))
            if routed is None or routed.highwater > task.repartition_position:
                continue
            task.caught_up(min(answer.sent_ms, routed.sent_ms) - APPEND_SLACK_MS)

    def advance(self, tasks: Iterable[Task]) -> None:
        """Each active task's table to its clock: idle conversations complete (routed ones by the slowest source)."""
        now = wall_ms()
        for task in active(tasks):
            others = [task.sources.get(q, 0) for q in range(self.partitions) if q != task.partition]
            task.table.advance(task_time(task, now), min(others) if others else None)

    def broadcast(self, tasks: Iterable[Task], collector: RecordCollector) -> None:
        """Every other state partition learns how far each of our input partitions has routed its records (as
        Flink's watermarks cross a shuffle): conversations with routed events complete by the slowest source.

        One record per target partition carries every source of ours (`sources`), sent after what they routed
        there, as a record per source would be: a replica owning P of N partitions sends N records a round, not
        P × (N − 1) (240 every 0.5 s for one replica over 16 partitions, idle or not). The record also carries one
        source in the single-source form (`source`, `ms`), each source in turn from round to round, so a replica of
        an earlier version, mid rolling upgrade, learns every source within P rounds instead of one only."""
        if self.partitions < 2 or not self._watermarks.due():
            return
        now = wall_ms()
        times = {task.partition: task_time(task, now) for task in active(tasks)}
        self._rounds += 1
        for target in range(self.partitions):
            sources = {source: ms for source, ms in times.items() if source != target}
            if not sources:
                continue
            order = sorted(sources)
            one = order[self._rounds % len(order)]
            value = R.dumps({"source": one, "ms": sources[one], "sources": {str(k): v for k, v in sources.items()}})
            collector.send(self.repartition, R.WATERMARK_KEY, value, R.WATERMARK, partition=target)
