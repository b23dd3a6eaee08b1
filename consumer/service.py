"""The consumer service: poll → decode → adapt → assemble → complete → sample → judge (async) → emit → commit.

Only this module's poll thread touches the Kafka consumer (kafka-python's consumer is not thread-safe), and the
rebalance listener, which kafka-python runs on its IO thread while the poll thread waits in `poll()`. Judgements
finish on the pool's thread, emit there, then come back through a queue so the poll thread can release their
offset holds and commit.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from kafka import AsyncConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from tracejudge.metrics import HolisticJudgeMetric
from tracejudge.tracer.rate_limited_log import RateLimitedLog

from .adapters import ConversationEvent, extract, trace_contexts
from .decode import MalformedRecord, decode_record
from .emit import KafkaWriter
from .emit.prometheus import ConsumerMetrics
from .feedback import FeedbackJoiner
from .offsets import OffsetTracker
from .pool import OUTCOME_FAILED, OUTCOME_JUDGED, OUTCOME_SAMPLED_OUT, Judgement, JudgePool
from .sampling import Sampler
from .sessions import SessionStore
from .settings import Settings

logger = logging.getLogger("tracejudge.consumer")
LAG_INTERVAL_S = 0.2  # one poll's timeout: lag is never staler than a poll


class JudgementSink(Protocol):
    """Receives every finished judgement; may return events that are set once the output is durable."""

    def emit(self, judgement: Judgement) -> Any: ...


class _Rebalance(AsyncConsumerRebalanceListener):
    """kafka-python 3 runs these on its IO thread while the poll thread waits inside `consumer.poll()` or
    `consumer.close()` (so they never race the poll loop), and there a blocking consumer call raises RuntimeError:
    hence async, with the revocation commit awaited (`commit_async`) instead of a blocking `commit()`."""

    def __init__(self, service: ConsumerService) -> None:
        self.service = service

    def _mine(self, partitions: Any) -> set[int]:
        return {tp.partition for tp in partitions if tp.topic == self.service.settings.topic}

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.service._on_revoked(self._mine(revoked), commit=True)

    async def on_partitions_lost(self, lost: Any) -> None:
        await self.service._on_revoked(self._mine(lost), commit=False)  # evicted: a commit would be refused

    async def on_partitions_assigned(self, assigned: Any) -> None:
        logger.info("partitions assigned: %s", sorted(tp.partition for tp in assigned))
        consumer = self.service._consumer
        if self.service._paused and consumer is not None and assigned:
            consumer.pause(*assigned)  # backpressure holds across a rebalance: new partitions start paused


class ConsumerService:
    """Runs until `request_stop()`; library code: registry, metrics and sinks come in as arguments."""

    def __init__(
        self,
        settings: Settings,
        metrics: Sequence[HolisticJudgeMetric],
        prometheus: ConsumerMetrics,
        *,
        sinks: Sequence[JudgementSink] = (),
        consumer_factory: Callable[..., KafkaConsumer] = KafkaConsumer,
    ) -> None:
        self.settings = settings
        self.prometheus = prometheus
        self.sinks = list(sinks)
        self.consumer_factory = consumer_factory
        self.store = SessionStore(
            idle_timeout_s=settings.session_idle_timeout,
            max_open=settings.max_open_conversations,
            max_turns=settings.max_turns_per_conversation,
        )
        self.sampler = Sampler(settings.sample_rate, settings.agent_sample_rates)
        self.offsets = OffsetTracker()
        self.pool = JudgePool(
            metrics,
            self._judged,
            max_concurrency=settings.max_concurrency,
            max_requests_per_minute=settings.max_requests_per_minute,
            max_cost_per_hour=settings.max_cost_per_hour,
        )
        prometheus.record_judges(self.pool.metrics)  # tracejudge_judge_info: whoever builds the service
        self.max_pending = settings.max_concurrency * 4 + 1_000
        self._done: queue.SimpleQueue[tuple[Judgement, list[threading.Event]]] = queue.SimpleQueue()
        self._awaiting_delivery: list[tuple[Judgement, list[threading.Event]]] = []
        self.feedback = FeedbackJoiner(prometheus.record_agreement)
        self._stop = threading.Event()
        self._consumer: KafkaConsumer | None = None
        self._dead_letter: KafkaWriter | None = None
        self._paused = False
        self._committed: dict[int, int] = {}
        self._lag_reported: set[int] = set()
        self.stop_deadline: float | None = None  # set when the shutdown starts: the end of the grace period
        self._malformed_log = RateLimitedLog(logger, interval_s=10.0)
        self.ready = threading.Event()
        self.judgements = 0

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Thread- and signal-safe."""
        self._stop.set()

    def run(self) -> None:
        settings = self.settings
        config: dict[str, Any] = {
            "bootstrap_servers": settings.bootstrap_servers,
            "group_id": settings.group_id,
            "client_id": "tracejudge-consumer",
            "enable_auto_commit": False,
            "auto_offset_reset": settings.start_from,
            "max_poll_records": 500,
            **settings.consumer_config(),
        }
        self._consumer = self.consumer_factory(**config)
        self._consumer.subscribe([settings.topic], listener=_Rebalance(self))
        if settings.dead_letter_topic:
            self._dead_letter = KafkaWriter(
                settings.bootstrap_servers,
                settings.dead_letter_topic,
                on_error=lambda: self.prometheus.record_output_error("dead_letter"),
                **settings.producer_config(),
            ).start()
        self.pool.start()
        self.ready.set()
        logger.info("consuming %r as group %r from %s", settings.topic, settings.group_id, settings.bootstrap_servers)
        last_commit = last_idle = last_lag = time.monotonic()
        try:
            while not self._stop.is_set():
                self._poll_once()
                now = time.monotonic()
                if now - last_idle >= 0.5:
                    for key in self.store.expire_idle(now):
                        self.offsets.release(key)
                    last_idle = now
                self._dispatch_ready()
                self._drain_done()
                self._backpressure()
                if now - last_commit >= settings.commit_interval:
                    self._commit()
                    last_commit = now
                if now - last_lag >= LAG_INTERVAL_S:
                    self._update_gauges(lag=True)
                    last_lag = now
                else:
                    self._update_gauges(lag=False)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        """Everything within `--shutdown-grace`: judgements in flight, then results still unwritten (an output that
        keeps failing retries forever; what it has not written by the deadline stays uncommitted)."""
        grace_end = self.stop_deadline = time.monotonic() + self.settings.shutdown_grace
        finished = self.pool.stop(self.settings.shutdown_grace)
        if not finished:
            logger.warning(
                "judgements still running after the %.0fs grace period are left uncommitted",
                self.settings.shutdown_grace,
            )
        deadline = max(grace_end, time.monotonic() + 0.5)  # results just emitted get a moment to land
        self._drain_done()
        while self._awaiting_delivery and time.monotonic() < deadline:
            time.sleep(0.02)
            self._drain_done()
        try:
            self._commit()
        except Exception as exc:
            logger.warning("final commit failed: %r", exc)
        if self._consumer is not None:
            try:
                self._consumer.close(autocommit=False)
            except Exception as exc:
                logger.warning("closing the consumer: %r", exc)
        if self._dead_letter is not None:
            self._dead_letter.close(max(0.5, grace_end - time.monotonic()))
        logger.info("stopped: %d conversations judged in this run", self.judgements)

    # -- the poll thread -------------------------------------------------------------------------------------------

    def _poll_once(self) -> None:
        assert self._consumer is not None
        batches = self._consumer.poll(timeout_ms=200, max_records=500)
        now = time.monotonic()
        for tp, records in batches.items():
            for record in records:
                self._ingest(tp.partition, record, now)
            self.offsets.consumed(tp.partition, records[-1].offset + 1)

    def _ingest(self, partition: int, record: Any, now: float) -> None:
        """One record in. Nothing it contains may stop the consumer: any exception while decoding it makes it a
        malformed record (counted, dead-lettered); a span that fails to adapt or fold in does too, after the
        record's other spans went in."""
        try:
            spans = decode_record(record.value, max_bytes=self.settings.max_record_bytes)
            traces = trace_contexts(spans)  # a span without an id goes with the conversation its trace names
        except MalformedRecord as exc:
            self._malformed(record, str(exc))
            return
        except Exception as exc:  # RecursionError (deep nesting), OverflowError, TypeError, ...
            self._malformed(record, f"undecodable: {exc!r}"[:300])
            return
        failure: Exception | None = None
        for span in spans:
            try:
                event = extract(span, traces)
                if event is None:
                    continue
                if event.feedback is not None:
                    self._feedback(event, now)
                hold = self.store.apply(event, partition, record.offset, now)
                if hold is not None:
                    self.offsets.hold(hold, partition, record.offset)
            except Exception as exc:  # one bad span never costs the rest of the record
                failure = failure or exc
        if failure is None:
            self.prometheus.record_records("ok")
        else:
            self._malformed(record, f"a span could not be read: {failure!r}"[:300])

    def _feedback(self, event: ConversationEvent, now: float) -> None:
        assert event.feedback is not None
        known = self.store.open.get(event.conversation_id) or self.store.judging.get(event.conversation_id)
        known = known or self.store.done.get(event.conversation_id)
        agent = event.agent or (known.agent if known is not None else None) or "unknown"
        self.prometheus.record_feedback(agent, negative=event.feedback.negative)
        self.feedback.feedback(event.conversation_id, agent, event.feedback, now)

    def _malformed(self, record: Any, reason: str) -> None:
        self.prometheus.record_records("malformed")
        self._malformed_log.warning(
            "malformed record at partition %d offset %d: %s", record.partition, record.offset, reason
        )
        if self._dead_letter is not None:
            headers = [
                ("tracejudge.error", reason.encode("utf-8", "replace")[:1000]),
                ("tracejudge.source", f"{record.topic}/{record.partition}/{record.offset}".encode()),
            ]
            self._dead_letter.write(record.key, record.value or b"", headers)

    def _dispatch_ready(self) -> None:
        jobs = self.store.take_ready()
        for key in self.store.take_unreadable():
            self.offsets.release(key)
        for job in jobs:
            if self.sampler.should_judge(job):
                self.pool.submit(job)
            else:
                sampled_out = Judgement(job, OUTCOME_SAMPLED_OUT)
                self._done.put((sampled_out, self._emit(sampled_out)))

    def _drain_done(self) -> None:
        """Finish judged jobs whose outputs are durable; their offset holds go, so the commit can move past them."""
        while True:
            try:
                self._awaiting_delivery.append(self._done.get_nowait())
            except queue.Empty:
                break
        waiting = []
        for judgement, deliveries in self._awaiting_delivery:
            if all(delivered.is_set() for delivered in deliveries):
                self._finish(judgement)
            else:
                waiting.append((judgement, deliveries))
        self._awaiting_delivery = waiting

    def _finish(self, judgement: Judgement) -> None:
        job = judgement.job
        again = self.store.finished(job, judged=judgement.outcome in (OUTCOME_JUDGED, OUTCOME_FAILED))
        if again is not None and again.hold_offset is not None:  # late negative feedback: judged now, still held
            self.offsets.hold(again.key, again.partition, again.hold_offset)
        self.offsets.release(job.key)

    def _backpressure(self) -> None:
        assert self._consumer is not None
        waiting = self.pool.pending + len(self._awaiting_delivery)  # results not yet written count too
        full = self.store.over_capacity or waiting >= self.max_pending
        if full:
            unpaused = self._consumer.assignment() - self._consumer.paused()
            if unpaused:
                self._consumer.pause(*unpaused)
        if full and not self._paused:
            self._paused = True
            logger.warning(
                "backpressure: pausing partitions (%d open conversations, %d judgements pending)",
                len(self.store),
                self.pool.pending,
            )
        elif self._paused and not full:
            self._consumer.resume(*self._consumer.paused())
            self._paused = False
            logger.info("backpressure released: resuming partitions")

    def _to_commit(self, partitions: set[int] | None = None) -> dict[TopicPartition, OffsetAndMetadata]:
        assert self._consumer is not None
        assigned = {tp.partition for tp in self._consumer.assignment()}
        return {
            TopicPartition(self.settings.topic, partition): OffsetAndMetadata(offset, "", -1)
            for partition, offset in self.offsets.committable().items()
            if partition in assigned
            and (partitions is None or partition in partitions)
            and self._committed.get(partition) != offset
        }

    def _commit(self) -> None:
        if self._consumer is None:
            return
        offsets = self._to_commit()
        if not offsets:
            return
        try:
            self._consumer.commit(offsets)
        except Exception as exc:
            logger.warning("commit failed (will retry): %r", exc)
            return
        for tp, meta in offsets.items():
            self._committed[tp.partition] = meta.offset

    async def _on_revoked(self, partitions: set[int], *, commit: bool) -> None:
        """On kafka-python's IO thread, the poll thread waiting (see `_Rebalance`): commit what the revoked
        partitions finished, then forget them."""
        if not partitions or self._consumer is None:
            return
        self._drain_done()
        offsets = self._to_commit(partitions) if commit else {}
        if offsets:
            try:
                await self._consumer.commit_async(offsets)
            except Exception as exc:
                logger.warning("commit on revocation failed (the new owner re-reads from the last commit): %r", exc)
        for key in self.store.drop_partitions(partitions):
            self.offsets.release(key)
        self.offsets.forget_partitions(partitions)
        for partition in partitions:
            self._committed.pop(partition, None)
        self.prometheus.forget_partitions(partitions)
        logger.info("partitions revoked: %s (their open conversations are left to the new owner)", sorted(partitions))

    def _update_gauges(self, *, lag: bool) -> None:
        self.prometheus.sessions_open.set(len(self.store))
        self.prometheus.in_flight.set(self.pool.in_flight)
        if not lag or self._consumer is None:
            return
        assignment = self._consumer.assignment()
        # Series of partitions no longer assigned go (also those re-set while a revocation was under way).
        self.prometheus.forget_partitions(self._lag_reported - {tp.partition for tp in assignment})
        self._lag_reported = {tp.partition for tp in assignment}
        for tp in assignment:
            # Lag is the high watermark minus the consumer's position (both known once a fetch answered): a quiet
            # partition with nothing consumed since assignment is 0 behind, not its whole log.
            highwater = self._consumer.highwater(tp)
            if highwater is None:
                continue
            try:
                position = self._consumer.position(tp, timeout_ms=0)
            except Exception:  # revoked meanwhile, or no position yet
                continue
            if position is not None:
                self.prometheus.set_lag(tp.partition, highwater - position)

    # -- the pool thread -------------------------------------------------------------------------------------------

    def _judged(self, judgement: Judgement) -> None:
        self.judgements += 1
        self.feedback.verdicts(judgement)
        self._done.put((judgement, self._emit(judgement)))

    def _emit(self, judgement: Judgement) -> list[threading.Event]:
        self.prometheus.record_judgement(judgement)
        deliveries: list[threading.Event] = []
        for sink in self.sinks:
            try:
                acknowledged = sink.emit(judgement)
            except Exception:
                logger.exception("a result sink failed for conversation %s", judgement.job.conversation_id)
                continue
            if isinstance(acknowledged, list):
                deliveries.extend(acknowledged)
        return deliveries
