"""The judge worker: completed conversations from the judge queue → the judge pool → outputs → a verdict back.

Its own consumer group (`<group>-judges`, cooperative-sticky) on the judge-queue topic, so judging scales apart
from assembly and a slow judge is judge-queue lag, not memory: past `max_pending` jobs the worker pauses its
partitions. A job's offset is committed once every output reported it durable (the results topic acknowledged,
the OTLP exporter succeeded) and the verdict acknowledgement (which tells the conversation's owner the outcome,
for negative feedback) is acknowledged. A judgement that failed for a reason that can pass is written to the
retry topic (`retries.py`); the worker owns retry partition p whenever it owns judge-queue partition p (they are
co-partitioned, as a Kafka Streams task owns its partitions; a second consumer, manually assigned, its offsets
committed under `<group>-judges-retries`: the group's assignor balances the judge queue alone) and forwards each
record to the judge queue once its not-before time has come: a record not yet due pauses its retry partition
(seeked back to it) until then. Its retry offset is committed once the forwarded job is acknowledged, so a kill -9
anywhere loses no retry (it may forward one twice: the copy is answered from the first, or judged again to the
same result id). The group's `--max-cost-per-hour` is split by the judge-queue partitions each worker owns, so
replicas together never exceed it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from kafka import AsyncConsumerRebalanceListener, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.errors import KafkaTimeoutError
from kafka.structs import OffsetAndMetadata

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ..adapters import Feedback
from ..conversation.job import JudgeJob
from ..emit.delivery import Delivery
from ..emit.prometheus import ConsumerInstruments
from ..judging.feedback import FeedbackJoiner
from ..judging.judgement import OUTCOME_JUDGED, OUTCOME_SAMPLED_OUT, Judgement
from ..judging.pool import JudgePool
from ..judging.retries import iso, retry_from_json, retry_to_json
from ..offsets import OffsetTracker
from ..settings import Settings
from . import records as R
from .instruments import StreamsInstruments
from .membership import close_leaving, guard_membership
from .probe import HighwaterProbe
from .record_collector import close_failed
from .topics import InternalTopics

logger = logging.getLogger("tracejudge.consumer.judges")
SETTLED_MEMORY = 65_536  # transcripts whose verdicts this worker remembers, to answer a replayed job without a call
POLL_S = 0.1  # the longest a step waits for judge-queue records (or, paused, for an output)
# How often the retry topic is read while nothing is due: an idle worker's polls of it (each a round trip through the
# consumer's IO thread) take the GIL 2 times a second, not 10. For a second after a partition resumed (a record came
# due) it is read every step: a resumed partition's records come back a fetch later, one or two polls.
RETRY_POLL_S = 0.5
RETRY_DUE_S = 1.0


class JudgeWorker(AsyncConsumerRebalanceListener):
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
        consumer_factory: Callable[..., KafkaConsumer] = KafkaConsumer,
        producer_factory: Callable[..., KafkaProducer] = KafkaProducer,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.delivery = delivery
        self.prometheus = prometheus
        self.instruments = instruments
        self.partitions = partitions
        self.feedback = feedback
        self.topics = InternalTopics(settings.group_id)
        self.offsets = OffsetTracker()
        self.retry_offsets = OffsetTracker()  # the retry topic's: a record is held until its forward is acknowledged
        self._retry_assigned: set[int] = set()
        self._retry_committed: dict[int, int] = {}
        self._retry_due: dict[int, float] = {}  # retry partition paused on a record not yet due → its time
        self._retry_poll = 0.0  # monotonic time of the next read of the retry topic
        self._retry_resumed = 0.0  # monotonic time until which it is read every step (a partition resumed)
        self._unforwarded: queue.SimpleQueue[Any] = queue.SimpleQueue()  # forwards that failed, sent again
        self._unscheduled: queue.SimpleQueue[tuple[Judgement, threading.Event]] = queue.SimpleQueue()
        self.max_pending = max(4, pool.max_concurrency * 4)
        self.consumer_factory = consumer_factory
        self.producer_factory = producer_factory
        self.consumer: KafkaConsumer | None = None
        self.retry_consumer: KafkaConsumer | None = None
        self.producer: KafkaProducer | None = None
        self.probe = HighwaterProbe(consumer_factory, settings.bootstrap_servers, settings.consumer_config())
        self.paused = False
        self.stopping = False  # shutting down: newly assigned partitions stay paused
        self.assigned: set[int] = set()
        self._committed: dict[int, int] = {}
        self._budget_total = settings.max_cost_per_hour
        self._log = RateLimitedLog(logger, interval_s=10.0)
        self._ack_failed = False
        self._unacknowledged: queue.SimpleQueue[Judgement] = queue.SimpleQueue()
        self._flush_timed_out = False
        # A crash between a job's send and the assembler's commit replays the conversation into a second job for the
        # same transcript (same content id, so same result id): answered from here, not judged (and paid) again.
        self._settled: OrderedDict[str, str] = OrderedDict()  # content id → outcome delivered by this worker
        # content id in flight → (its job's key, whether it is forced, the later copies waiting for it)
        self._following: dict[str, tuple[str, bool, list[JudgeJob]]] = {}
        self._lag_reported: set[int] = set()
        self.joined = threading.Event()
        self.share_budget()

    @property
    def group_id(self) -> str:
        return f"{self.settings.group_id}-judges"

    def _new_producer(self) -> KafkaProducer:
        settings = self.settings
        return self.producer_factory(
            bootstrap_servers=settings.bootstrap_servers,
            client_id="tracejudge-verdicts",
            acks="all",
            linger_ms=5,
            **settings.producer_config(),
        )

    def _renew_producer(self) -> None:
        """A send failed for good: a fresh producer (an idempotent producer whose id the brokers forgot, e.g. after
        they lost their state, fails every later send with InitProducerId errors and never recovers)."""
        old = self.producer
        self.producer = self._new_producer()
        close_failed(old)

    def open(self) -> None:
        settings = self.settings
        common = settings.consumer_config()
        config: dict[str, Any] = {
            "bootstrap_servers": settings.bootstrap_servers,
            "group_id": self.group_id,
            "client_id": "tracejudge-judges",
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",  # every completed conversation is judged, whenever the worker joins
            "max_poll_records": max(1, self.max_pending),
            "partition_assignment_strategy": [CooperativeStickyAssignor],
            **common,
        }
        if settings.group_instance_id:
            config["group_instance_id"] = f"{settings.group_instance_id}-judges"
        self.producer = self._new_producer()
        self.consumer = self.consumer_factory(**config)
        guard_membership(self.consumer)
        self.consumer.subscribe([self.topics.judge_queue], listener=self)
        self.retry_consumer = self.consumer_factory(
            bootstrap_servers=settings.bootstrap_servers,
            group_id=f"{self.group_id}-retries",  # never joined: offsets only
            client_id="tracejudge-judge-retries",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **common,
        )
        self.delivery.reschedule = self._reschedule

    # -- rebalance --------------------------------------------------------------------------------------------------

    def share_budget(self) -> None:
        """This worker's share of the group's budget: the share of judge-queue partitions it owns."""
        if self._budget_total is None:
            return
        self.pool.set_budget(self._budget_total * len(self.assigned) / max(1, self.partitions))

    def _split(self, tps: Any) -> tuple[set[int], set[int]]:
        """Judge-queue partitions, retry-topic partitions."""
        tps = list(tps or ())
        queue_ = {tp.partition for tp in tps if tp.topic == self.topics.judge_queue}
        return queue_, {tp.partition for tp in tps if tp.topic == self.topics.judge_retry}

    async def on_partitions_assigned(self, assigned: Any) -> None:
        queue_partitions, _ = self._split(assigned)
        self.assigned |= queue_partitions
        self._retry_assigned |= queue_partitions
        self._assign_retries()
        self.share_budget()
        if self.consumer is not None and assigned:
            if self.stopping:
                self.consumer.pause(*assigned)
            elif self.paused:  # backpressure holds across a rebalance
                self.consumer.pause(*(tp for tp in assigned if tp.topic == self.topics.judge_queue))
        self.joined.set()
        if queue_partitions:
            logger.info("judge-queue partitions assigned: %s", sorted(queue_partitions))

    def _assign_retries(self) -> None:
        """The retry partitions of the judge-queue partitions owned (positions from their committed offsets)."""
        if self.retry_consumer is not None and not self.stopping:  # closing: the revocation reassigns nothing
            topic = self.topics.judge_retry
            self.retry_consumer.assign([TopicPartition(topic, p) for p in sorted(self._retry_assigned)])

    async def on_partitions_revoked(self, revoked: Any) -> None:
        mine, _ = self._split(revoked)
        retry_mine = set(mine)
        if not (mine or retry_mine) or self.consumer is None:
            return
        self.delivery.drain(self._finished)
        offsets = self._ack_and_offsets(mine, retry_mine)
        self._commit_retries(offsets)
        if offsets:
            try:
                await self.consumer.commit_async(offsets)
            except Exception as exc:
                logger.warning("judge-queue commit on revocation failed (jobs since are judged again): %r", exc)
        if self.pool.batched:
            self.pool.abandon(mine)
        self._forget(mine)
        self._forget_retries(retry_mine)

    async def on_partitions_lost(self, lost: Any) -> None:
        partitions, _ = self._split(lost)
        retry_partitions = set(partitions)
        if self.pool.batched:
            self.pool.abandon(partitions)
        self._forget(partitions)
        self._forget_retries(retry_partitions)

    def _forget_retries(self, partitions: set[int]) -> None:
        self._retry_assigned -= partitions
        self.retry_offsets.forget_partitions(partitions)
        for partition in partitions:
            self._retry_committed.pop(partition, None)
            self._retry_due.pop(partition, None)
        if partitions:
            self._assign_retries()

    def _forget(self, partitions: set[int]) -> None:
        self.assigned -= partitions
        self.share_budget()
        self.offsets.forget_partitions(partitions)
        for content, (key, _forced, _copies) in list(self._following.items()):  # their copies are on the same partition
            if int(key.partition(":")[0]) in partitions:
                del self._following[content]
        for partition in partitions:
            self._committed.pop(partition, None)
            if partition in self._lag_reported:
                try:
                    self.instruments.judge_queue_lag.remove(str(partition))
                except KeyError:
                    pass
        self._lag_reported -= partitions

    # -- the worker thread ------------------------------------------------------------------------------------------

    def step(self) -> None:
        assert self.consumer is not None
        # Paused on outputs not yet durable (a results topic's acknowledgements): wait for the oldest, not for a poll
        # of paused partitions to time out (100 ms a round held the worker to max_pending jobs per ~100 ms).
        waited = self.paused and self.delivery.wait_for_outputs(POLL_S)
        batches = self.consumer.poll(timeout_ms=0 if waited else int(POLL_S * 1000), max_records=self.max_pending)
        now = time.monotonic()
        if self.retry_consumer is not None and self._retry_assigned and not self.stopping and now >= self._retry_poll:
            self._retry_poll = now + (POLL_S if now < self._retry_resumed else RETRY_POLL_S)
            for tp, records in self.retry_consumer.poll(timeout_ms=0).items():
                self._retry_records(tp, records)
        for tp, records in batches.items():
            for record in records:
                self._record(tp.partition, record)
            self.offsets.consumed(tp.partition, records[-1].offset + 1)
        self.delivery.drain(self._finished)
        self._resend_acknowledgements()
        self._resend_retries()
        self._wake_retries()
        self._backpressure()

    # -- the retry topic --------------------------------------------------------------------------------------------

    def _reschedule(self, judgement: Judgement) -> threading.Event:
        """A retrying judgement's job to the retry topic (its conversation's partition); the event is set once the
        broker has it (Delivery holds the job's offset until then). Called on the pool's thread."""
        event = threading.Event()
        self._send_retry(judgement, event)
        return event

    def _send_retry(self, judgement: Judgement, event: threading.Event) -> None:
        job, retry = judgement.job, judgement.retry
        assert self.producer is not None and retry is not None
        value = R.job_to_json(job, sampled=True, completed_ms=job.completed_ms or 0)
        value["retry"] = retry_to_json(retry)
        producer = self.producer

        def failed(exc: BaseException) -> None:
            self.prometheus.record_output_error("internal_topics")
            self._log.warning("a retry record could not be written: %r (sent again; the job stays held)", exc)
            self._unscheduled.put((judgement, event))

        try:
            future = producer.send(
                self.topics.judge_retry,
                key=job.conversation_id.encode("utf-8", "surrogatepass"),
                value=R.dumps(value),
                headers=R.header(R.JOB),
                partition=job.partition,
            )
        except Exception as exc:
            failed(exc)
            return
        future.add_callback(lambda _metadata: event.set())
        future.add_errback(failed)

    def _resend_retries(self) -> None:
        for _ in range(self._unscheduled.qsize()):
            try:
                judgement, event = self._unscheduled.get_nowait()
            except queue.Empty:
                break
            self._send_retry(judgement, event)
        for _ in range(self._unforwarded.qsize()):
            try:
                record = self._unforwarded.get_nowait()
            except queue.Empty:
                break
            if record.partition in self._retry_assigned:
                self._forward(record)

    def _retry_records(self, tp: TopicPartition, records: list[Any]) -> None:
        """Forward what is due to the judge queue; at the first record not yet due, pause the partition on it."""
        assert self.retry_consumer is not None
        now_ms = time.time() * 1000
        for record in records:
            try:
                retry = retry_from_json(R.loads(record.value).get("retry"))
                due_ms = retry.next_at * 1000 if retry is not None and retry.next_at is not None else 0.0
            except Exception as exc:
                self._log.warning("unreadable retry record at %d/%d skipped: %r", tp.partition, record.offset, exc)
                self.retry_offsets.consumed(tp.partition, record.offset + 1)
                continue
            if due_ms > now_ms:
                self.retry_consumer.seek(tp, record.offset)
                self.retry_consumer.pause(tp)
                self._retry_due[tp.partition] = due_ms / 1000
                return
            self._forward(record)
            self.retry_offsets.consumed(tp.partition, record.offset + 1)

    def _forward(self, record: Any) -> None:
        assert self.producer is not None
        key = f"r{record.partition}:{record.offset}"
        self.retry_offsets.hold(key, record.partition, record.offset)
        producer = self.producer

        def failed(exc: BaseException) -> None:
            self._log.warning("a due retry could not be forwarded to the judge queue: %r (sent again)", exc)
            self._unforwarded.put(record)

        try:
            future = producer.send(
                self.topics.judge_queue,
                key=record.key,
                value=record.value,
                headers=R.header(R.JOB),
                partition=record.partition,
            )
        except Exception as exc:
            failed(exc)
            return
        future.add_callback(lambda _metadata: self.retry_offsets.release(key))
        future.add_errback(failed)

    def _wake_retries(self) -> None:
        """Resume each retry partition whose waiting record is due (unless the worker is stopping)."""
        if self.retry_consumer is None or self.stopping or not self._retry_due:
            return
        now = time.time()
        for partition, due in list(self._retry_due.items()):
            if due <= now:
                del self._retry_due[partition]
                self.retry_consumer.resume(TopicPartition(self.topics.judge_retry, partition))
                self._retry_poll = 0.0  # read at the next step, and every step for a while
                self._retry_resumed = time.monotonic() + RETRY_DUE_S

    def _record(self, partition: int, record: Any) -> None:
        kind = R.kind_of(record.headers)
        try:
            if kind == R.JOB:
                job, sampled, retry_value = R.job_record(
                    record.value, key=f"{partition}:{record.offset}", partition=partition
                )
                retry = retry_from_json(retry_value)
            else:
                value = R.loads(record.value)
                if kind == R.FEEDBACK:
                    self._feedback(record.key.decode("utf-8", "surrogatepass"), value)
                return
        except Exception as exc:
            self._log.warning("unreadable judge-queue record at %d/%d skipped: %r", partition, record.offset, exc)
            return
        self.offsets.hold(job.key, partition, record.offset)
        if retry is not None:
            logger.info(
                "conversation %s: judge attempt %d (the last failed with %s; retried until %s)",
                job.conversation_id,
                retry.attempt + 1,
                retry.reason,
                iso(retry.until),
            )
        if sampled and self._duplicate(job):
            self.instruments.duplicate_jobs.inc()
        elif sampled:
            if retry is not None:
                self.delivery.retried[job.key] = retry
            self.pool.submit(job)
        else:
            rate = self.settings.agent_sample_rates.get(job.agent, self.settings.sample_rate)
            self.delivery.not_judged(Judgement(job, OUTCOME_SAMPLED_OUT, sample_rate=rate))

    def _duplicate(self, job: JudgeJob) -> bool:
        """A job for a transcript judged or being judged here is answered with that verdict; else it is the first.
        A forced job (negative feedback: judged whatever the budget) never waits for an unforced one, which may end
        skipped for budget."""
        if not job.content_id:
            return False
        following = self._following.get(job.content_id)
        if following is not None and (following[1] or not job.negative_feedback):
            following[2].append(job)
            return True
        outcome = self._settled.get(job.content_id)
        if outcome is not None:
            self._settled.move_to_end(job.content_id)
            self._finished(Judgement(job, outcome))
            return True
        if following is None:
            self._following[job.content_id] = (job.key, job.negative_feedback, [])
        return False

    def _settle(self, judgement: Judgement) -> list[JudgeJob]:
        """Remember a delivered verdict; the copies that waited for it."""
        job = judgement.job
        entry = self._following.get(job.content_id)
        if entry is None or entry[0] != job.key:
            return []
        del self._following[job.content_id]
        if judgement.outcome == OUTCOME_JUDGED:
            self._settled[job.content_id] = judgement.outcome
            while len(self._settled) > SETTLED_MEMORY:
                self._settled.popitem(last=False)
        return entry[2]

    def _feedback(self, conversation_id: str, value: dict[str, Any]) -> None:
        feedback = Feedback(**value["feedback"])
        agent = value.get("agent") or "unknown"
        self.prometheus.record_feedback(agent, negative=feedback.negative)
        if self.feedback is not None:
            self.feedback.feedback(conversation_id, agent, feedback)

    def _finished(self, judgement: Judgement) -> None:
        """Its outputs are durable: tell the conversation's owner the outcome; the job's offset may be committed once
        that acknowledgement is itself acknowledged (a failed one is sent again at the next step). A job whose owner
        recorded its outcome when it sent it (`answered`: sampled out) is told nothing: its offset may go now."""
        job = judgement.job
        for copy in self._settle(judgement):
            self._finished(Judgement(copy, judgement.outcome))
        if job.answered and judgement.outcome == OUTCOME_SAMPLED_OUT:
            self.offsets.release(job.key)
            return
        assert self.producer is not None
        value = R.verdict_value(job.content_id, judgement.outcome)
        producer = self.producer
        try:
            future = producer.send(
                self.topics.repartition,
                key=job.conversation_id.encode("utf-8", "surrogatepass"),
                value=value,
                headers=R.header(R.VERDICT),
                partition=job.partition,
            )
        except Exception as exc:
            self._ack_error(exc, judgement)
            return
        future.add_callback(lambda _metadata: self.offsets.release(job.key))
        future.add_errback(lambda exc: self._ack_error(exc, judgement) if producer is self.producer else None)

    def _ack_error(self, exc: BaseException, judgement: Judgement) -> None:
        self._ack_failed = True
        self._unacknowledged.put(judgement)
        self.prometheus.record_output_error("internal_topics")
        self._log.warning(
            "a verdict acknowledgement could not be written: %r (sent again; its job stays uncommitted until then)", exc
        )

    def _resend_acknowledgements(self) -> None:
        for _ in range(self._unacknowledged.qsize()):  # what failed until now: one that fails again waits a step
            try:
                judgement = self._unacknowledged.get_nowait()
            except queue.Empty:
                return
            self._finished(judgement)

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

    def _ack_and_offsets(
        self, partitions: set[int] | None = None, retry_partitions: set[int] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        assert self.producer is not None and self.consumer is not None
        if not self._flush_timed_out:  # after a timed-out flush, a failure of what it waited for is still to be seen
            self._ack_failed = False
        try:
            self.producer.flush(timeout=30)
        except KafkaTimeoutError:  # the brokers do not answer (an outage): nothing is committed, retried next time
            self._flush_timed_out = True
            self._log.warning("verdict acknowledgements unanswered after 30s: nothing committed (check the brokers)")
            return {}
        self._flush_timed_out = False
        if self._ack_failed:
            self._renew_producer()
            return {}
        offsets = {
            TopicPartition(self.topics.judge_queue, partition): OffsetAndMetadata(offset, "", -1)
            for partition, offset in self.offsets.committable().items()
            if partition in self.assigned
            and (partitions is None or partition in partitions)
            and self._committed.get(partition) != offset
        }
        offsets.update(
            {
                TopicPartition(self.topics.judge_retry, partition): OffsetAndMetadata(offset, "", -1)
                for partition, offset in self.retry_offsets.committable().items()
                if partition in self._retry_assigned
                and (partitions is None or partition in (retry_partitions or set()))
                and self._retry_committed.get(partition) != offset
            }
        )
        return offsets

    def commit(self) -> None:
        if self.consumer is None:
            return
        offsets = self._ack_and_offsets()
        self._commit_retries(offsets)
        if not offsets:
            return
        try:
            self.consumer.commit(offsets)
        except Exception as exc:
            logger.warning("judge-queue commit failed (will retry): %r", exc)
            return
        for tp, meta in offsets.items():
            committed = self._committed if tp.topic == self.topics.judge_queue else self._retry_committed
            committed[tp.partition] = meta.offset

    def _commit_retries(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        """Take the retry topic's offsets out of `offsets` and commit them with the retry consumer."""
        retries = {tp: meta for tp, meta in offsets.items() if tp.topic == self.topics.judge_retry}
        for tp in retries:
            del offsets[tp]
        if not retries or self.retry_consumer is None:
            return
        try:
            self.retry_consumer.commit(retries)
        except Exception as exc:
            logger.warning("retry-topic commit failed (will retry; a retry may be forwarded twice): %r", exc)
            return
        for tp, meta in retries.items():
            self._retry_committed[tp.partition] = meta.offset

    def update_gauges(self, *, lag: bool) -> None:
        self.prometheus.in_flight.set(self.pool.in_flight)
        if not lag or self.consumer is None:
            return
        self._count_retrying()
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

    def _count_retrying(self) -> None:
        """tracejudge_judgements_retrying: the records of this worker's retry partitions not yet forwarded (the
        log end minus the position). The retry consumer's fetches tell the log end of the partitions it reads; a
        waiting partition is paused, so its end is probed (a probe of a partition with nothing past the position
        waits for the brokers' fetch wait: it held the judge loop ~180 ms every 0.5 s)."""
        assert self.consumer is not None
        positions: dict[TopicPartition, int] = {}
        ends: dict[TopicPartition, int] = {}
        for partition in sorted(self._retry_assigned):
            tp = TopicPartition(self.topics.judge_retry, partition)
            try:
                assert self.retry_consumer is not None
                positions[tp] = self.retry_consumer.position(tp, timeout_ms=0) or 0
                end = None if tp in self.retry_consumer.paused() else self.retry_consumer.highwater(tp)
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

    def close(self, grace_s: float) -> bool:
        """Judgements in flight get the grace period; what is durable by then is committed.

        The consumer keeps polling (every partition paused) while they finish, so a rebalance started meanwhile
        completes instead of waiting for this member (a member that stops polling stalls its whole group)."""
        deadline = time.monotonic() + max(0.5, grace_s)
        self.stopping = True
        consumer = self.consumer
        if consumer is not None:
            consumer.pause(*consumer.assignment())
        last_commit = time.monotonic()
        while (self.pool.pending or self.delivery.awaiting) and time.monotonic() < deadline:
            if consumer is not None:
                consumer.poll(timeout_ms=50)
            self.delivery.drain(self._finished)
            if time.monotonic() - last_commit >= self.settings.commit_interval:
                self.commit()
                last_commit = time.monotonic()
        finished = self.pool.stop(max(0.1, deadline - time.monotonic()))
        self.delivery.drain(self._finished)
        try:
            self.commit()
        except Exception as exc:
            logger.warning("final judge-queue commit failed: %r", exc)
        # The group consumer first: its revocation on close still commits the retry offsets through the retry
        # consumer, which closes after it.
        for client in (self.probe, self.consumer, self.retry_consumer):
            try:
                if isinstance(client, HighwaterProbe):
                    client.close()
                elif client is not None:
                    close_leaving(client)  # LeaveGroup (see `membership`)
            except Exception as exc:
                logger.warning("closing a consumer: %r", exc)
        if self.producer is not None:
            try:
                self.producer.close(timeout=max(0.5, deadline - time.monotonic()))
            except Exception as exc:
                logger.warning("closing the producer: %r", exc)
        return finished
