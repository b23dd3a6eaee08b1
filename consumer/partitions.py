"""The consumer's assigned partitions: commit, rebalance, backpressure (pause/resume) and the lag gauge.

kafka-python 3 runs the rebalance callbacks on its IO thread while the poll thread waits inside `consumer.poll()` or
`consumer.close()` (so they never race the poll loop), and there a blocking consumer call raises RuntimeError: hence
an async listener, with the revocation commit awaited (`commit_async`) instead of a blocking `commit()`. Everything
else here runs on the poll thread.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kafka import AsyncConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from .emit.prometheus import ConsumerMetrics
from .pipeline import Pipeline

logger = logging.getLogger("tracejudge.consumer")


class Partitions(AsyncConsumerRebalanceListener):
    def __init__(self, topic: str, pipeline: Pipeline, prometheus: ConsumerMetrics, *, max_pending: int) -> None:
        self.topic = topic
        self.pipeline = pipeline
        self.prometheus = prometheus
        self.max_pending = max_pending
        self.consumer: KafkaConsumer | None = None
        self.paused = False
        self._committed: dict[int, int] = {}
        self._lag_reported: set[int] = set()
        self.assigned = threading.Event()  # set at the first assignment of one of the topic's partitions: "ready"

    # -- rebalance (kafka-python's IO thread, the poll thread waiting) -----------------------------------------------

    def _mine(self, partitions: Any) -> set[int]:
        return {tp.partition for tp in partitions if tp.topic == self.topic}

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._revoked(self._mine(revoked), commit=True)

    async def on_partitions_lost(self, lost: Any) -> None:
        await self._revoked(self._mine(lost), commit=False)  # evicted: a commit would be refused

    async def on_partitions_assigned(self, assigned: Any) -> None:
        mine = sorted(self._mine(assigned))
        if mine and not self.assigned.is_set():
            self.assigned.set()
            logger.info("ready: consuming partitions %s of %r", mine, self.topic)
        else:
            logger.info("partitions assigned: %s", mine)
        if self.paused and self.consumer is not None and assigned:
            self.consumer.pause(*assigned)  # backpressure holds across a rebalance: new partitions start paused

    async def _revoked(self, partitions: set[int], *, commit: bool) -> None:
        """Commit what the revoked partitions finished, then forget them."""
        if not partitions or self.consumer is None:
            return
        self.pipeline.drain()
        offsets = self._to_commit(partitions) if commit else {}
        if offsets:
            try:
                await self.consumer.commit_async(offsets)
            except Exception as exc:
                logger.warning("commit on revocation failed (the new owner re-reads from the last commit): %r", exc)
        self.pipeline.ingest.revoke(partitions)
        for partition in partitions:
            self._committed.pop(partition, None)
        self.prometheus.forget_partitions(partitions)
        logger.info("partitions revoked: %s (their open conversations are left to the new owner)", sorted(partitions))

    # -- the poll thread -------------------------------------------------------------------------------------------

    def _to_commit(self, partitions: set[int] | None = None) -> dict[TopicPartition, OffsetAndMetadata]:
        assert self.consumer is not None
        assigned = {tp.partition for tp in self.consumer.assignment()}
        return {
            TopicPartition(self.topic, partition): OffsetAndMetadata(offset, "", -1)
            for partition, offset in self.pipeline.offsets.committable().items()
            if partition in assigned
            and (partitions is None or partition in partitions)
            and self._committed.get(partition) != offset
        }

    def commit(self) -> None:
        if self.consumer is None:
            return
        offsets = self._to_commit()
        if not offsets:
            return
        try:
            self.consumer.commit(offsets)
        except Exception as exc:
            logger.warning("commit failed (will retry): %r", exc)
            return
        for tp, meta in offsets.items():
            self._committed[tp.partition] = meta.offset

    def backpressure(self) -> None:
        """Pause every partition while too many conversations are open or too many judgements wait."""
        consumer, store = self.consumer, self.pipeline.store
        assert consumer is not None
        full = store.over_capacity or self.pipeline.pending >= self.max_pending  # unwritten results count too
        if full:
            unpaused = consumer.assignment() - consumer.paused()
            if unpaused:
                consumer.pause(*unpaused)
        if full and not self.paused:
            self.paused = True
            logger.warning(
                "backpressure: pausing partitions (%d open conversations, %d judgements pending)",
                len(store),
                self.pipeline.pool.pending,
            )
        elif self.paused and not full:
            consumer.resume(*consumer.paused())
            self.paused = False
            logger.info("backpressure released: resuming partitions")

    def update_gauges(self, *, lag: bool) -> None:
        self.prometheus.sessions_open.set(len(self.pipeline.store))
        self.prometheus.in_flight.set(self.pipeline.pool.in_flight)
        if not lag or self.consumer is None:
            return
        assignment = self.consumer.assignment()
        # Series of partitions no longer assigned go (also those re-set while a revocation was under way).
        self.prometheus.forget_partitions(self._lag_reported - {tp.partition for tp in assignment})
        self._lag_reported = {tp.partition for tp in assignment}
        for tp in assignment:
            # Lag is the high watermark minus the consumer's position (both known once a fetch answered): a quiet
            # partition with nothing consumed since assignment is 0 behind, not its whole log.
            highwater = self.consumer.highwater(tp)
            if highwater is None:
                continue
            try:
                position = self.consumer.position(tp, timeout_ms=0)
            except Exception:  # revoked meanwhile, or no position yet
                continue
            if position is not None:
                self.prometheus.set_lag(tp.partition, highwater - position)
