"""The judge worker: completed conversations from the judge queue → the judge pool → outputs → a verdict back.

Its own consumer group (`<group>-judges`, cooperative-sticky) on the judge-queue topic, so judging scales apart
from assembly and a slow judge is judge-queue lag, not memory: past `max_pending` jobs the worker pauses its
partitions. It is the judge thread's loop and the group's rebalance listener (Kafka Streams' StreamThread); its parts:
`JudgeTask` (the records of the partitions owned, their offsets, the settled verdicts), `RetryScheduler` (the retry
topic, co-partitioned with the judge queue), `VerdictCollector` (every write, one producer). A job's offset is
committed once every output reported it durable and its verdict acknowledgement is acknowledged. The group's
`--max-cost-per-hour` is split by the judge-queue partitions each worker owns, so replicas together never exceed it.

Threads: the judge thread runs `step`/`commit`/`update_gauges` and owns every part's state; the rebalance callbacks
run on the consumer's IO thread while the judge thread waits in `poll()`, so they act in its place. The producer's
sender thread and the pool's thread only queue what they learn (the collector's outcomes, the scheduler's retries).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..emit.delivery import Delivery
from ..emit.prometheus import ConsumerInstruments
from ..judging.feedback import FeedbackJoiner
from ..judging.pool import JudgePool
from ..kafka import KafkaClients, KafkaConsumer, OffsetAndMetadata, RebalanceListener, TopicPartition
from ..kafka.highwater import HighwaterProbe
from ..kafka.membership import close_leaving, guard_membership
from ..kafka.topics import JUDGE_RETRIES, JUDGES, InternalTopics
from ..offsets import OffsetTracker
from ..settings import Settings
from .instruments import StreamsInstruments
from .judge_task import JudgeTask
from .retry_scheduler import Offsets, RetryScheduler
from .verdict_collector import VerdictCollector

logger = logging.getLogger("tracejudge.consumer.judges")
POLL_S = 0.1  # the longest a step waits for judge-queue records (or, paused, for an output)


class JudgeWorker(RebalanceListener):
    def __init__(
        self,
        settings: Settings,
        pool: JudgePool,
        delivery: Delivery,
        prometheus: ConsumerInstruments,
        instruments: StreamsInstruments,
        *,
        partitions: int,
        feedback: FeedbackJoiner | None = None,
        clients: KafkaClients | None = None,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.delivery = delivery
        self.prometheus = prometheus
        self.instruments = instruments
        self.partitions = partitions
        self.clients = clients or KafkaClients.from_settings(settings)
        self.topics = InternalTopics(settings.group_id)
        self.max_pending = max(4, pool.max_concurrency * 4)
        self.consumer: KafkaConsumer | None = None
        self.probe = HighwaterProbe(self.clients)
        self.collector = VerdictCollector(self.clients, prometheus)
        self.task = JudgeTask(settings, pool, delivery, prometheus, instruments, self.collector, feedback=feedback)
        self.retries = RetryScheduler(self.topics, self.collector, prometheus, self.probe)
        self.paused = False
        self.stopping = False  # shutting down: newly assigned partitions stay paused
        self.hurried = False  # a second stop signal: in-flight judgements are given up (`hurry`)
        self.assigned: set[int] = set()
        self._committed: dict[int, int] = {}
        self._budget_total = settings.max_cost_per_hour
        self._lag_reported: set[int] = set()
        self.joined = threading.Event()
        self.share_budget()

    @property
    def group_id(self) -> str:
        return JUDGES.name(self.settings.group_id)

    @property
    def offsets(self) -> OffsetTracker:
        """The judge queue's offsets (OffsetTracker; `held()` may be read from any thread)."""
        return self.task.offsets

    def open(self) -> None:
        instance = self.settings.group_instance_id
        self.collector.open()
        self.consumer = self.clients.member(
            "tracejudge-judges",
            self.group_id,
            instance_id=f"{instance}-judges" if instance else None,
            auto_offset_reset="earliest",  # every completed conversation is judged, whenever the worker joins
            max_poll_records=max(1, self.max_pending),
        )
        guard_membership(self.consumer)
        self.consumer.subscribe([self.topics.judge_queue], listener=self)
        self.retries.open(self.clients, JUDGE_RETRIES.name(self.settings.group_id))
        self.delivery.reschedule = self.retries.reschedule

    # -- rebalance (the consumer's IO thread, while the judge thread waits in poll) --------------------------------

    def share_budget(self) -> None:
        """This worker's share of the group's budget: the share of judge-queue partitions it owns."""
        if self._budget_total is None:
            return
        self.pool.set_budget(self._budget_total * len(self.assigned) / max(1, self.partitions))

    def _mine(self, tps: Any) -> set[int]:
        """The judge-queue partitions among `tps` (their retry partitions follow them)."""
        return {tp.partition for tp in tps or () if tp.topic == self.topics.judge_queue}

    async def on_partitions_assigned(self, assigned: Any) -> None:
        mine = self._mine(assigned)
        self.assigned |= mine
        self.retries.assign(mine)
        self.share_budget()
        if self.consumer is not None and assigned:
            if self.stopping:
                self.consumer.pause(*assigned)
            elif self.paused:  # backpressure holds across a rebalance
                self.consumer.pause(*(tp for tp in assigned if tp.topic == self.topics.judge_queue))
        self.joined.set()
        if mine:
            logger.info("judge-queue partitions assigned: %s", sorted(mine))

    async def on_partitions_revoked(self, revoked: Any) -> None:
        mine = self._mine(revoked)
        if not mine or self.consumer is None:
            return
        # A retry queued by the pool before the revocation is written and acknowledged first: its job's offset then
        # moves past it, and only the retry record carries the job on (not also the new owner re-reading the job).
        self.retries.write_rescheduled()
        self.collector.ready_to_commit()
        self.delivery.drain(self.task.finished)
        queue_offsets, retry_offsets = self._offsets(mine)
        self.retries.commit(retry_offsets)
        if queue_offsets:
            try:
                await self.consumer.commit_async(queue_offsets)
            except Exception as exc:
                logger.warning("judge-queue commit on revocation failed (jobs since are judged again): %r", exc)
        if self.pool.batched:
            self.pool.abandon(mine)
        self._forget(mine)

    async def on_partitions_lost(self, lost: Any) -> None:
        mine = self._mine(lost)
        if self.pool.batched:
            self.pool.abandon(mine)
        self._forget(mine)

    def _forget(self, partitions: set[int]) -> None:
        self.assigned -= partitions
        self.share_budget()
        self.task.forget(partitions)
        self.retries.forget(partitions)
        for partition in partitions:
            self._committed.pop(partition, None)
            if partition in self._lag_reported:
                try:
                    self.instruments.judge_queue_lag.remove(str(partition))
                except KeyError:
                    pass
        self._lag_reported -= partitions

    # -- the judge thread -------------------------------------------------------------------------------------------

    def step(self) -> None:
        assert self.consumer is not None
        # Paused on outputs not yet durable (a results topic's acknowledgements): wait for the oldest, not for a poll
        # of paused partitions to time out (100 ms a round held the worker to max_pending jobs per ~100 ms).
        waited = self.paused and self.delivery.wait_for_outputs(POLL_S)
        batches = self.consumer.poll(timeout_ms=0 if waited else int(POLL_S * 1000), max_records=self.max_pending)
        self.retries.poll()
        for tp, records in batches.items():
            self.task.read(tp.partition, records)
        self.delivery.drain(self.task.finished)
        self._exchange()
        self.retries.wake()
        self._backpressure()

    def _exchange(self) -> None:
        """What other threads queued for this one: retry records to write, the producer's outcomes; then what failed
        is sent again."""
        self.retries.write_rescheduled()
        self.collector.collect()
        self.collector.resend()

    def _backpressure(self) -> None:
        """Pause and resume the judge-queue partitions only: a retry partition waits for its record's time."""
        assert self.consumer is not None
        full = self.pool.pending + self.delivery.awaiting >= self.max_pending
        topic = self.topics.judge_queue
        if full:
            unpaused = {tp for tp in self.consumer.assignment() - self.consumer.paused() if tp.topic == topic}
            if unpaused:
                self.consumer.pause(*unpaused)
            if not self.paused:
                logger.info("judges busy: %d jobs pending, the judge queue waits in Kafka", self.pool.pending)
            self.paused = True
        elif self.paused:
            paused = [tp for tp in self.consumer.paused() if tp.topic == topic]
            if paused:
                self.consumer.resume(*paused)
            self.paused = False

    def _offsets(self, partitions: set[int] | None = None) -> tuple[Offsets, Offsets]:
        """The judge queue's and the retry topic's offsets to commit (of `partitions`, or all owned): none until
        everything sent is acknowledged."""
        if not self.collector.ready_to_commit():
            return {}, {}
        queue_offsets = {
            TopicPartition(self.topics.judge_queue, partition): OffsetAndMetadata(offset, "", -1)
            for partition, offset in self.task.offsets.committable().items()
            if partition in self.assigned
            and (partitions is None or partition in partitions)
            and self._committed.get(partition) != offset
        }
        return queue_offsets, self.retries.committable(partitions)

    def commit(self) -> None:
        if self.consumer is None:
            return
        queue_offsets, retry_offsets = self._offsets()
        self.retries.commit(retry_offsets)
        if not queue_offsets:
            return
        try:
            self.consumer.commit(queue_offsets)
        except Exception as exc:
            logger.warning("judge-queue commit failed (will retry): %r", exc)
            return
        for tp, meta in queue_offsets.items():
            self._committed[tp.partition] = meta.offset

    def update_gauges(self, *, lag: bool) -> None:
        self.prometheus.in_flight.set(self.pool.in_flight)
        if not lag or self.consumer is None:
            return
        self.retries.count_retrying()
        paused = {tp.partition for tp in self.consumer.paused() if tp.topic == self.topics.judge_queue}
        fresh = self._probe_highwaters(paused) if paused else {}
        for tp in self.consumer.assignment():
            if tp.topic != self.topics.judge_queue:
                continue
            end = fresh.get(tp.partition, self.consumer.highwater(tp))
            try:
                position = self.consumer.position(tp, timeout_ms=0)
            except Exception:
                continue
            if end is None or position is None:
                continue
            self.instruments.judge_queue_lag.labels(partition=str(tp.partition)).set(max(0, end - position))
            self._lag_reported.add(tp.partition)

    def _probe_highwaters(self, partitions: set[int]) -> dict[int, int]:
        """Paused partitions are not fetched, so their high watermark goes stale: the probe learns it."""
        assert self.consumer is not None
        positions = {}
        for partition in sorted(partitions):
            tp = TopicPartition(self.topics.judge_queue, partition)
            try:
                positions[tp] = self.consumer.position(tp, timeout_ms=0) or 0
            except Exception:
                positions[tp] = 0
        return {tp.partition: end for tp, end in self.probe.highwaters(positions).items()}

    def hurry(self) -> None:
        """Stop waiting for in-flight judgements (`close` cancels them at once; their offsets stay uncommitted).
        Signal-safe: one flag."""
        self.hurried = True

    def close(self, grace_s: float) -> bool:
        """Judgements in flight get the grace period; what is durable by then is committed.

        The consumer keeps polling (every partition paused) while they finish, so a rebalance started meanwhile
        completes instead of waiting for this member (a member that stops polling stalls its whole group)."""
        deadline = time.monotonic() + max(0.5, grace_s)
        self.stopping = self.retries.stopping = True
        consumer = self.consumer
        if consumer is not None:
            consumer.pause(*consumer.assignment())
        last_commit = time.monotonic()
        while (self.pool.pending or self.delivery.awaiting) and time.monotonic() < deadline and not self.hurried:
            if consumer is not None:
                consumer.poll(timeout_ms=50)
            self.delivery.drain(self.task.finished)
            self._exchange()
            if time.monotonic() - last_commit >= self.settings.commit_interval:
                self.commit()
                last_commit = time.monotonic()
        finished = self.pool.stop(0.1 if self.hurried else max(0.1, deadline - time.monotonic()))
        self.retries.write_rescheduled()
        self.delivery.drain(self.task.finished)
        try:
            self.commit()
        except Exception as exc:
            logger.warning("final judge-queue commit failed: %r", exc)
        # The group consumer first: its revocation on close still commits the retry offsets through the retry
        # consumer, which closes after it.
        for client in (self.probe, self.consumer, self.retries.consumer):
            try:
                if isinstance(client, HighwaterProbe):
                    client.close()
                elif client is not None:
                    close_leaving(client)  # LeaveGroup (see `membership`)
            except Exception as exc:
                logger.warning("closing a consumer: %r", exc)
        self.collector.close(deadline - time.monotonic())
        return finished
