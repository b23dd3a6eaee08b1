"""The retry topics' side of the judge worker: judgements that failed for a reason that can pass, written there
(`reschedule`), read back and forwarded to the judge queue once their not-before time has come.

One topic per backoff step (`judging/retries.py`'s ladder): step n, `<group>-judge-retry-<n>`, holds the records
whose wait is the backoff doubled n-1 times, so within one of its partitions they ripen in the order they were
written, and a partition paused on the first record not yet ripe holds back none due sooner (with one topic, a record
waiting 10 minutes held every record behind it). A wait that is no step's own (the last attempt, at the horizon) goes
to the longest step under it; let out, it moves on to the step for the rest of its wait, and the last stretch, under
the first step, is waited in memory, its offset uncommitted. `<group>-judge-retry` holds the waits shorter than the
first step (read at once, held until due) and the records written before the steps (each its own not-before time, as
then).

Each retry partition p is read while the worker owns judge-queue partition p (co-partitioned, as a Kafka Streams task
owns its partitions) by a consumer of its own, assigned by hand, its offsets committed under `<group>-judges-retries`
(the group's assignor balances the judge queue alone). A retry offset is committed only once the record's forward
(or its move to another step) is acknowledged, so a kill -9 anywhere loses no retry (it may forward one twice: the
copy is answered from the first, or judged again to the same result id).

Everything here runs on the judge thread (or the rebalance listener, while that thread waits in poll), except
`reschedule`: the pool's thread calls it, and it only queues the judgement for the judge thread to write.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ..emit.prometheus import ConsumerInstruments
from ..judging.judgement import Judgement
from ..judging.retries import (
    DEFAULT_BACKOFF_S,
    FORWARD,
    HOLD,
    Placement,
    on_ripe,
    place,
    retry_from_json,
    retry_to_json,
    step_delays,
)
from ..kafka import KafkaClients, KafkaConsumer, OffsetAndMetadata, TopicPartition
from ..kafka.highwater import HighwaterProbe
from ..kafka.topics import RETRY_STEPS, InternalTopics
from ..offsets import OffsetTracker
from . import records as R
from .verdict_collector import Outgoing, VerdictCollector

logger = logging.getLogger("tracejudge.consumer.judges")
# How often the retry topics are read while nothing is ripe: an idle worker's polls (each a round trip through the
# consumer's IO thread) take the GIL 2 times a second, not 10. For a second after a partition resumed (a record
# ripened) they are read every step: a resumed partition's records come back a fetch later, one or two polls.
RETRY_POLL_S = 0.5
RETRY_DUE_S = 1.0
RESUMED_POLL_S = 0.1  # every step: a judge worker's step waits at most this long
EARLY_S = 1.0  # a paused partition resumes this long before its record ripens: the fetch is back by then
RETRYING_REFRESH_S = 5.0  # tracejudge_judgements_retrying is counted at most this often (a scrape is ~15 s)
MAX_HELD = 1000  # records held in memory per retry partition (their last stretch); past it the partition waits

Offsets = dict[TopicPartition, OffsetAndMetadata]


class RetryScheduler:
    def __init__(
        self,
        topics: InternalTopics,
        collector: VerdictCollector,
        prometheus: ConsumerInstruments,
        probe: HighwaterProbe,
        steps: Sequence[float] | None = None,
    ) -> None:
        self.topics = topics
        self.collector = collector
        self.prometheus = prometheus
        self.probe = probe
        # The ladder new records are placed on (`--judge-retry-backoff`'s: the service sets it before `open`).
        self.steps: tuple[float, ...] = tuple(steps) if steps is not None else step_delays(DEFAULT_BACKOFF_S)
        self.consumer: KafkaConsumer | None = None
        self.read_topics: list[str] = [topics.judge_retry]  # the retry topics read (`open`)
        self.offsets: dict[str, OffsetTracker] = {}  # per retry topic: a record is held until its forward is acked
        self.partitions: set[int] = set()  # the retry partitions read (those of the judge-queue partitions owned)
        self.stopping = False  # closing: nothing is reassigned, resumed or read any more
        self._committed: dict[TopicPartition, int] = {}
        self._ripe: dict[TopicPartition, float] = {}  # paused on a record not yet ripe → when it ripens
        self._full: set[TopicPartition] = set()  # paused: MAX_HELD of its records held in memory
        self._held: list[tuple[float, int, TopicPartition, Any]] = []  # (due, seq, tp, record): a heap by due
        self._held_count: Counter[TopicPartition] = Counter()
        self._seq = itertools.count()
        self._poll_at = 0.0  # monotonic time of the next read of the retry topics
        self._counted_at = float("-inf")  # monotonic time of the last count_retrying
        self._resumed_until = 0.0  # monotonic time until which they are read every step (a partition resumed)
        self._rescheduled: queue.SimpleQueue[tuple[Judgement, threading.Event]] = queue.SimpleQueue()
        self._log = RateLimitedLog(logger, interval_s=10.0)

    def open(self, clients: KafkaClients, group_id: str) -> None:
        """`group_id`: the retry topics' offsets' own group (`kafka.topics.JUDGE_RETRIES`), never joined. Read: the
        short-wait topic, this ladder's step topics, and any other step topic there is (records written under a
        shorter backoff wait there)."""
        self.consumer = clients.consumer("tracejudge-judge-retries", group_id=group_id)
        wanted = {self.topics.judge_retry_step(n) for n in range(1, len(self.steps) + 1)}
        try:
            listing = getattr(self.consumer, "topics", None)
            existing = set(listing()) if listing is not None else set()
        except Exception as exc:  # the ladder's own steps are read regardless: only older records would wait
            logger.warning("cannot list the topics (%r): the retry steps of another backoff are not read", exc)
            existing = set()
        steps = [self.topics.judge_retry_step(n) for n in range(1, RETRY_STEPS + 1)]
        self.read_topics = [self.topics.judge_retry, *(name for name in steps if name in wanted or name in existing)]

    def _tracker(self, topic: str) -> OffsetTracker:
        tracker = self.offsets.get(topic)
        if tracker is None:
            tracker = self.offsets[topic] = OffsetTracker()
        return tracker

    def _topic_of(self, step: int) -> str:
        return self.topics.judge_retry if step == 0 else self.topics.judge_retry_step(step)

    # -- writing ----------------------------------------------------------------------------------------------------

    def reschedule(self, judgement: Judgement) -> threading.Event:
        """Delivery's `reschedule`, on the pool's thread: the judgement is queued for the judge thread, which writes
        its job to the retry topic of its wait; the event is set once the broker has it (Delivery holds the job's
        offset)."""
        event = threading.Event()
        self._rescheduled.put((judgement, event))
        return event

    def write_rescheduled(self) -> None:
        """The retry records queued by `reschedule`, each to its conversation's partition of its step's topic."""
        while True:
            try:
                judgement, event = self._rescheduled.get_nowait()
            except queue.Empty:
                return
            job, retry = judgement.job, judgement.retry
            assert retry is not None
            due = retry.until if retry.next_at is None else retry.next_at
            placement = place(due, time.time(), self.steps, exact=due < retry.until)  # at the horizon: cut short
            value = R.job_to_json(job, sampled=True, completed_ms=job.completed_ms or 0)
            value["retry"] = retry_to_json(retry)
            self._send_placed(
                placement, job.conversation_id.encode("utf-8", "surrogatepass"), value, job.partition, event=event
            )

    def _send_placed(
        self,
        placement: Placement,
        key: bytes,
        value: dict[str, Any],
        partition: int,
        *,
        event: threading.Event | None = None,
        acked: Any = None,
        wanted: Any = None,
    ) -> None:
        value["ripe_ms"] = int(placement.ripe_at * 1000)  # when its step topic lets it out (write order)
        self.collector.send(
            Outgoing(
                self._topic_of(placement.step),
                key,
                R.dumps(value),
                R.JOB,
                partition,
                "a retry record could not be written: %r (sent again; the job stays held)",
                event=event,
                acked=acked,
                wanted=wanted,
            )
        )

    # -- assignment -------------------------------------------------------------------------------------------------

    def assign(self, partitions: Iterable[int]) -> None:
        """Read these retry partitions too, of every retry topic (positions from their committed offsets)."""
        self.partitions |= set(partitions)
        self._counted_at = float("-inf")  # the retrying gauge recounted at once, over what is read now
        self._reassign()

    def forget(self, partitions: set[int]) -> None:
        self.partitions -= partitions
        self._counted_at = float("-inf")  # no longer counted here: the new owner counts them
        for tracker in self.offsets.values():
            tracker.forget_partitions(partitions)
        for tp in [tp for tp in self._committed if tp.partition in partitions]:
            del self._committed[tp]
        for tp in [tp for tp in self._ripe if tp.partition in partitions]:
            del self._ripe[tp]
        self._full = {tp for tp in self._full if tp.partition not in partitions}
        if any(tp.partition in partitions for _, _, tp, _ in self._held):  # their offsets were never committed
            self._held = [entry for entry in self._held if entry[2].partition not in partitions]
            heapq.heapify(self._held)
            for tp in [tp for tp in self._held_count if tp.partition in partitions]:
                del self._held_count[tp]
        if partitions:
            self._reassign()

    def _reassign(self) -> None:
        if self.consumer is not None and not self.stopping:  # closing: the revocation reassigns nothing
            self.consumer.assign(
                [TopicPartition(topic, p) for topic in self.read_topics for p in sorted(self.partitions)]
            )

    # -- reading and forwarding -------------------------------------------------------------------------------------

    def poll(self) -> None:
        """Read the retry partitions (every RETRY_POLL_S, every step for a while after one resumed)."""
        now = time.monotonic()
        if self.consumer is None or not self.partitions or self.stopping or now < self._poll_at:
            return
        self._poll_at = now + (RESUMED_POLL_S if now < self._resumed_until else RETRY_POLL_S)
        for tp, records in self.consumer.poll(timeout_ms=0).items():
            self._records(tp, records)

    def _records(self, tp: TopicPartition, records: list[Any]) -> None:
        """Each record its topic lets out: forwarded when due, held until due when that is within the first step,
        else moved on to the step of the rest of its wait. At the first record not yet ripe (or past MAX_HELD held),
        the partition pauses on it."""
        assert self.consumer is not None
        tracker = self._tracker(tp.topic)
        now = time.time()
        for record in records:
            try:
                value = R.loads(record.value)
                retry = retry_from_json(value.get("retry"))
                due = retry.next_at if retry is not None and retry.next_at is not None else 0.0
                # Records written before the steps carry no ripe time: each waits for its own not-before time.
                ripe = value["ripe_ms"] / 1000 if isinstance(value.get("ripe_ms"), int) else due
            except Exception as exc:
                self._log.warning(
                    "unreadable retry record at %s/%d/%d skipped: %r", tp.topic, tp.partition, record.offset, exc
                )
                tracker.consumed(tp.partition, record.offset + 1)
                continue
            if ripe > now + EARLY_S or self._held_count[tp] >= MAX_HELD:
                self.consumer.seek(tp, record.offset)
                self.consumer.pause(tp)
                if ripe > now + EARLY_S:
                    self._ripe[tp] = ripe
                else:
                    self._full.add(tp)
                    self._log.warning(
                        "%d retries held in memory on %s/%d: the partition waits until they are forwarded",
                        MAX_HELD,
                        tp.topic,
                        tp.partition,
                    )
                return
            tracker.consumed(tp.partition, record.offset + 1)
            tracker.hold(self._key(tp, record), tp.partition, record.offset)
            action = on_ripe(due, now, self.steps)
            if action == FORWARD:
                self._forward(tp, record)
            elif action == HOLD:
                heapq.heappush(self._held, (due, next(self._seq), tp, record))
                self._held_count[tp] += 1
            else:
                assert isinstance(action, Placement)
                self._move(tp, record, value, action)

    @staticmethod
    def _key(tp: TopicPartition, record: Any) -> str:
        return f"{tp.topic}:{tp.partition}:{record.offset}"

    def _forward(self, tp: TopicPartition, record: Any) -> None:
        key = self._key(tp, record)
        tracker = self._tracker(tp.topic)
        self.collector.send(
            Outgoing(
                self.topics.judge_queue,
                record.key,
                record.value,
                R.JOB,
                tp.partition,
                "a due retry could not be forwarded to the judge queue: %r (sent again)",
                acked=lambda: tracker.release(key),
                wanted=lambda: tp.partition in self.partitions,
            )
        )

    def _move(self, tp: TopicPartition, record: Any, value: dict[str, Any], placement: Placement) -> None:
        """The rest of a record's wait, in the step topic that fits it; its offset here is released once written."""
        key = self._key(tp, record)
        tracker = self._tracker(tp.topic)
        self._send_placed(
            placement,
            record.key,
            value,
            tp.partition,
            acked=lambda: tracker.release(key),
            wanted=lambda: tp.partition in self.partitions,
        )

    def wake(self) -> None:
        """Forward each held record now due; resume each partition whose waiting record is about to ripen, or whose
        held records went below half of MAX_HELD (unless stopping)."""
        if self.consumer is None or self.stopping:
            return
        now = time.time()
        while self._held and self._held[0][0] <= now:
            _, _, tp, record = heapq.heappop(self._held)
            self._held_count[tp] -= 1
            if tp.partition in self.partitions:
                self._forward(tp, record)
        resumed = [tp for tp, ripe in self._ripe.items() if ripe - EARLY_S <= now]
        resumed += [tp for tp in self._full if self._held_count[tp] < MAX_HELD // 2]
        for tp in resumed:
            self._ripe.pop(tp, None)
            self._full.discard(tp)
            self.consumer.resume(tp)
        if resumed:
            self._poll_at = 0.0  # read at the next step, and every step for a while
            self._resumed_until = time.monotonic() + RETRY_DUE_S

    # -- commits and the gauge --------------------------------------------------------------------------------------

    def committable(self, partitions: set[int] | None = None) -> Offsets:
        """The retry offsets to commit (of `partitions`, or all read), as of the last collected acknowledgement."""
        found: Offsets = {}
        for topic, tracker in self.offsets.items():
            for partition, offset in tracker.committable().items():
                tp = TopicPartition(topic, partition)
                if (
                    partition in self.partitions
                    and (partitions is None or partition in partitions)
                    and self._committed.get(tp) != offset
                ):
                    found[tp] = OffsetAndMetadata(offset, "", -1)
        return found

    def commit(self, offsets: Offsets) -> None:
        if not offsets or self.consumer is None:
            return
        try:
            self.consumer.commit(offsets)
        except Exception as exc:
            logger.warning("retry-topic commit failed (will retry; a retry may be forwarded twice): %r", exc)
            return
        for tp, meta in offsets.items():
            self._committed[tp] = meta.offset

    def count_retrying(self) -> None:
        """tracejudge_judgements_retrying: the records of the retry partitions read not yet forwarded (the log end
        minus the position, and those held in memory). The consumer's fetches tell the log end of the partitions it
        reads; a waiting partition is paused, so its end is probed (a probe of a partition with nothing past the
        position waits for the brokers' fetch wait: it held the judge loop ~180 ms every 0.5 s). Counted at most every
        RETRYING_REFRESH_S: kafka-python's `position` revalidates every assigned partition on each call, so a count
        over the retry steps' partitions costs each call that many times over (a third of an idle replica's CPU when
        it ran every 0.5 s, bench/scale_out.py)."""
        if self.consumer is None:
            return
        now = time.monotonic()
        if now - self._counted_at < RETRYING_REFRESH_S:
            return
        positions: dict[TopicPartition, int] = {}
        ends: dict[TopicPartition, int] = {}
        paused = self.consumer.paused()
        for topic in self.read_topics:
            for partition in sorted(self.partitions):
                tp = TopicPartition(topic, partition)
                try:
                    positions[tp] = self.consumer.position(tp, timeout_ms=0) or 0
                    end = None if tp in paused else self.consumer.highwater(tp)
                except Exception:
                    return  # a position not known yet (just assigned): counted at the next refresh
                if end is not None:
                    ends[tp] = end
        unknown = {tp: start for tp, start in positions.items() if tp not in ends}
        if unknown:
            probed = self.probe.highwaters(unknown)
            if not probed:
                return  # the probe could not measure (said in its own log): the last count stands
            ends.update(probed)
        waiting = sum(max(0, ends.get(tp, start) - start) for tp, start in positions.items())
        self.prometheus.retrying.set(waiting + len(self._held))
        self._counted_at = now  # a count that could not be made is tried again at the next tick
