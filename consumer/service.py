"""The consumer service: the poll loop composing the pipeline (ingest → judge → deliver) and the partitions (commit,
rebalance, backpressure, lag).

Only this module's poll thread touches the Kafka consumer (kafka-python's consumer is not thread-safe), and the
rebalance listener (`partitions.py`), which kafka-python runs on its IO thread while the poll thread waits in
`poll()`. Judgements finish on the pool's thread, go out there, then come back through the delivery queue so the poll
thread can release their offset holds and commit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kafka import KafkaConsumer

from tracejudge.metrics import HolisticJudgeMetric

from .delivery import JudgementSink
from .emit import KafkaWriter
from .emit.prometheus import OUTCOMES, ConsumerMetrics, family_total
from .feedback import FeedbackJoiner
from .partitions import Partitions
from .pipeline import Pipeline
from .sampling import Sampler
from .settings import Settings

logger = logging.getLogger("tracejudge.consumer")
LAG_INTERVAL_S = 0.2  # one poll's timeout: lag is never staler than a poll
IDLE_CHECK_S = 0.5

__all__ = ["ConsumerService", "JudgementSink"]  # JudgementSink re-exported from delivery.py, its new home


def outcome_summary(prometheus: ConsumerMetrics) -> str:
    """This run's conversations by outcome, read from tracejudge_sessions_total: the log says what /metrics says."""
    count = {o: int(family_total(prometheus.registry, "tracejudge_sessions", outcome=o)) for o in OUTCOMES}
    return (
        f"{count['judged']} conversations judged, {count['failed']} failed, {count['sampled_out']} sampled out, "
        f"{count['skipped_budget']} skipped for budget in this run"
    )


class ConsumerService:
    """Runs until `request_stop()`; library code: registry, judges and sinks come in as arguments."""

    def __init__(
        self,
        settings: Settings,
        judges: Sequence[HolisticJudgeMetric],
        prometheus: ConsumerMetrics,
        *,
        sinks: Sequence[JudgementSink] = (),
        consumer_factory: Callable[..., KafkaConsumer] = KafkaConsumer,
    ) -> None:
        self.settings = settings
        self.prometheus = prometheus
        self.consumer_factory = consumer_factory
        self.feedback = FeedbackJoiner(prometheus.record_agreement)
        sampler = Sampler(settings.sample_rate, settings.agent_sample_rates)
        self.pipeline = Pipeline(
            settings, judges, prometheus, sampler.should_judge, sinks=sinks, feedback=self.feedback
        )
        self.store, self.offsets, self.pool = self.pipeline.store, self.pipeline.offsets, self.pipeline.pool
        prometheus.record_judges(self.pool.judges)  # tracejudge_judge_info: whoever builds the service
        self.partitions = Partitions(
            settings.topic, self.pipeline, prometheus, max_pending=settings.max_concurrency * 4 + 1_000
        )
        self._stop = threading.Event()
        self._consumer: KafkaConsumer | None = None
        self._dead_letter: KafkaWriter | None = None
        self.stop_deadline: float | None = None  # set when the shutdown starts: the end of the grace period
        self.ready = threading.Event()

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
        self._consumer = self.partitions.consumer = self.consumer_factory(**config)
        self._consumer.subscribe([settings.topic], listener=self.partitions)
        if settings.dead_letter_topic:
            self._dead_letter = self.pipeline.ingest.dead_letter = KafkaWriter(
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
                if now - last_idle >= IDLE_CHECK_S:
                    self.pipeline.ingest.expire(now)
                    last_idle = now
                self.pipeline.dispatch()
                self.pipeline.drain()
                self.partitions.backpressure()
                if now - last_commit >= settings.commit_interval:
                    self.partitions.commit()
                    last_commit = now
                self.partitions.update_gauges(lag=now - last_lag >= LAG_INTERVAL_S)
                if now - last_lag >= LAG_INTERVAL_S:
                    last_lag = now
        finally:
            self._shutdown()

    def _poll_once(self) -> None:
        assert self._consumer is not None
        batches = self._consumer.poll(timeout_ms=200, max_records=500)
        now = time.monotonic()
        for tp, records in batches.items():
            for record in records:
                self.pipeline.record(tp.partition, record, now)
            self.offsets.consumed(tp.partition, records[-1].offset + 1)

    def _shutdown(self) -> None:
        """Everything within `--shutdown-grace`: judgements in flight, then results still unwritten (an output that
        keeps failing retries forever; what it has not written by the deadline stays uncommitted)."""
        grace_end = self.stop_deadline = time.monotonic() + self.settings.shutdown_grace
        if not self.pool.stop(self.settings.shutdown_grace):
            logger.warning(
                "judgements still running after the %.0fs grace period are left uncommitted",
                self.settings.shutdown_grace,
            )
        deadline = max(grace_end, time.monotonic() + 0.5)  # results just emitted get a moment to land
        self.pipeline.drain()
        while self.pipeline.delivery.awaiting and time.monotonic() < deadline:
            time.sleep(0.02)
            self.pipeline.drain()
        try:
            self.partitions.commit()
        except Exception as exc:
            logger.warning("final commit failed: %r", exc)
        if self._consumer is not None:
            try:
                self._consumer.close(autocommit=False)
            except Exception as exc:
                logger.warning("closing the consumer: %r", exc)
        if self._dead_letter is not None:
            self._dead_letter.close(max(0.5, grace_end - time.monotonic()))
        logger.info("stopped: %s", outcome_summary(self.prometheus))
