"""The retry topic's side of the judge worker: judgements that failed for a reason that can pass, written there
(`reschedule`), read back and forwarded to the judge queue once their not-before time has come.

Retry partition p is read while the worker owns judge-queue partition p (co-partitioned, as a Kafka Streams task
owns its partitions) by a consumer of its own, assigned by hand, its offsets committed under
`<group>-judges-retries` (the group's assignor balances the judge queue alone). A record not yet due pauses its
partition (seeked back to it) until then. A retry offset is committed only once the forward is acknowledged, so a
kill -9 anywhere loses no retry (it may forward one twice: the copy is answered from the first, or judged again to
the same result id).

Everything here runs on the judge thread (or the rebalance listener, while that thread waits in poll), except
`reschedule`: the pool's thread calls it, and it only queues the judgement for the judge thread to write.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable
from typing import Any

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ..emit.prometheus import ConsumerInstruments
from ..judging.judgement import Judgement
from ..judging.retries import retry_from_json, retry_to_json
from ..kafka import KafkaClients, KafkaConsumer, OffsetAndMetadata, TopicPartition
from ..kafka.highwater import HighwaterProbe
from ..kafka.topics import InternalTopics
from ..offsets import OffsetTracker
from . import records as R
from .verdict_collector import Outgoing, VerdictCollector

logger = logging.getLogger("tracejudge.consumer.judges")
# How often the retry topic is read while nothing is due: an idle worker's polls of it (each a round trip through the
# consumer's IO thread) take the GIL 2 times a second, not 10. For a second after a partition resumed (a record came
# due) it is read every step: a resumed partition's records come back a fetch later, one or two polls.
RETRY_POLL_S = 0.5
RETRY_DUE_S = 1.0
RESUMED_POLL_S = 0.1  # every step: a judge worker's step waits at most this long

Offsets = dict[TopicPartition, OffsetAndMetadata]


class RetryScheduler:
    def __init__(
        self,
        topics: InternalTopics,
        collector: VerdictCollector,
        prometheus: ConsumerInstruments,
        probe: HighwaterProbe,
    ) -> None:
        self.topics = topics
        self.collector = collector
        self.prometheus = prometheus
        self.probe = probe
        self.consumer: KafkaConsumer | None = None
        self.offsets = OffsetTracker()  # a record is held until its forward is acknowledged
        self.partitions: set[int] = set()  # the retry partitions read (those of the judge-queue partitions owned)
        self.stopping = False  # closing: nothing is reassigned, resumed or read any more
        self._committed: dict[int, int] = {}
        self._due: dict[int, float] = {}  # retry partition paused on a record not yet due → its time
        self._poll_at = 0.0  # monotonic time of the next read of the retry topic
        self._resumed_until = 0.0  # monotonic time until which it is read every step (a partition resumed)
        self._rescheduled: queue.SimpleQueue[tuple[Judgement, threading.Event]] = queue.SimpleQueue()
        self._log = RateLimitedLog(logger, interval_s=10.0)

    def open(self, clients: KafkaClients, group_id: str) -> None:
        """`group_id`: the retry topic's offsets' own group (`kafka.topics.JUDGE_RETRIES`), never joined."""
        self.consumer = clients.consumer("tracejudge-judge-retries", group_id=group_id)

    def _tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self.topics.judge_retry, partition)

    # -- writing ----------------------------------------------------------------------------------------------------

    def reschedule(self, judgement: Judgement) -> threading.Event:
        """Delivery's `reschedule`, on the pool's thread: the judgement is queued for the judge thread, which writes
        its job to the retry topic; the event is set once the broker has it (Delivery holds the job's offset)."""
        event = threading.Event()
        self._rescheduled.put((judgement, event))
        return event

    def write_rescheduled(self) -> None:
        """The retry records queued by `reschedule`, to their conversation's partition of the retry topic."""
        while True:
            try:
                judgement, event = self._rescheduled.get_nowait()
            except queue.Empty:
                return
            job, retry = judgement.job, judgement.retry
            assert retry is not None
            value = R.job_to_json(job, sampled=True, completed_ms=job.completed_ms or 0)
            value["retry"] = retry_to_json(retry)
            self.collector.send(
                Outgoing(
                    self.topics.judge_retry,
                    job.conversation_id.encode("utf-8", "surrogatepass"),
                    R.dumps(value),
                    R.JOB,
                    job.partition,
                    "a retry record could not be written: %r (sent again; the job stays held)",
                    event=event,
                )
            )

    # -- assignment -------------------------------------------------------------------------------------------------

    def assign(self, partitions: Iterable[int]) -> None:
        """Read these retry partitions too (positions from their committed offsets)."""
        self.partitions |= set(partitions)
        self._reassign()

    def forget(self, partitions: set[int]) -> None:
        self.partitions -= partitions
        self.offsets.forget_partitions(partitions)
        for partition in partitions:
            self._committed.pop(partition, None)
            self._due.pop(partition, None)
        if partitions:
            self._reassign()

    def _reassign(self) -> None:
        if self.consumer is not None and not self.stopping:  # closing: the revocation reassigns nothing
            self.consumer.assign([self._tp(p) for p in sorted(self.partitions)])

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
        """Forward what is due to the judge queue; at the first record not yet due, pause the partition on it."""
        assert self.consumer is not None
        now_ms = time.time() * 1000
        for record in records:
            try:
                retry = retry_from_json(R.loads(record.value).get("retry"))
                due_ms = retry.next_at * 1000 if retry is not None and retry.next_at is not None else 0.0
            except Exception as exc:
                self._log.warning("unreadable retry record at %d/%d skipped: %r", tp.partition, record.offset, exc)
                self.offsets.consumed(tp.partition, record.offset + 1)
                continue
            if due_ms > now_ms:
                self.consumer.seek(tp, record.offset)
                self.consumer.pause(tp)
                self._due[tp.partition] = due_ms / 1000
                return
            self._forward(record)
            self.offsets.consumed(tp.partition, record.offset + 1)

    def _forward(self, record: Any) -> None:
        key = f"r{record.partition}:{record.offset}"
        self.offsets.hold(key, record.partition, record.offset)
        self.collector.send(
            Outgoing(
                self.topics.judge_queue,
                record.key,
                record.value,
                R.JOB,
                record.partition,
                "a due retry could not be forwarded to the judge queue: %r (sent again)",
                acked=lambda: self.offsets.release(key),
                wanted=lambda: record.partition in self.partitions,
            )
        )

    def wake(self) -> None:
        """Resume each retry partition whose waiting record is due (unless stopping)."""
        if self.consumer is None or self.stopping or not self._due:
            return
        now = time.time()
        for partition, due in list(self._due.items()):
            if due <= now:
                del self._due[partition]
                self.consumer.resume(self._tp(partition))
                self._poll_at = 0.0  # read at the next step, and every step for a while
                self._resumed_until = time.monotonic() + RETRY_DUE_S

    # -- commits and the gauge --------------------------------------------------------------------------------------

    def committable(self, partitions: set[int] | None = None) -> Offsets:
        """The retry offsets to commit (of `partitions`, or all read), as of the last collected acknowledgement."""
        return {
            self._tp(partition): OffsetAndMetadata(offset, "", -1)
            for partition, offset in self.offsets.committable().items()
            if partition in self.partitions
            and (partitions is None or partition in partitions)
            and self._committed.get(partition) != offset
        }

    def commit(self, offsets: Offsets) -> None:
        if not offsets or self.consumer is None:
            return
        try:
            self.consumer.commit(offsets)
        except Exception as exc:
            logger.warning("retry-topic commit failed (will retry; a retry may be forwarded twice): %r", exc)
            return
        for tp, meta in offsets.items():
            self._committed[tp.partition] = meta.offset

    def count_retrying(self) -> None:
        """tracejudge_judgements_retrying: the records of the retry partitions read not yet forwarded (the log end
        minus the position). The consumer's fetches tell the log end of the partitions it reads; a waiting partition
        is paused, so its end is probed (a probe of a partition with nothing past the position waits for the
        brokers' fetch wait: it held the judge loop ~180 ms every 0.5 s)."""
        if self.consumer is None:
            return
        positions: dict[TopicPartition, int] = {}
        ends: dict[TopicPartition, int] = {}
        for partition in sorted(self.partitions):
            tp = self._tp(partition)
            try:
                positions[tp] = self.consumer.position(tp, timeout_ms=0) or 0
                end = None if tp in self.consumer.paused() else self.consumer.highwater(tp)
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
        self.prometheus.retrying.set(sum(max(0, ends.get(tp, start) - start) for tp, start in positions.items()))
