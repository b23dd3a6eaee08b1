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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from tracejudge.metrics import HolisticJudgeMetric

from ._errors import ConsumerError
from ._logging import quiet_kafka_connections
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

EXIT_UNAVAILABLE = 69  # sysexits' EX_UNAVAILABLE: a service the command needs (Kafka) did not answer

__all__ = ["ConsumerService", "JudgementSink"]  # JudgementSink re-exported from delivery.py, its new home


def outcome_summary(prometheus: ConsumerMetrics) -> str:
    """This run's conversations by outcome, read from tracejudge_sessions_total: the log says what /metrics says."""
    count = {o: int(family_total(prometheus.registry, "tracejudge_sessions", outcome=o)) for o in OUTCOMES}
    return (
        f"{count['judged']} conversations judged, {count['failed']} failed, {count['sampled_out']} sampled out, "
        f"{count['skipped_budget']} skipped for budget in this run"
    )


class StartupError(ConsumerError):
    """The command cannot start for a reason the user can fix: the CLI prints it as one line and exits `exit_code`."""

    exit_code = 1


class KafkaUnreachable(StartupError):
    exit_code = EXIT_UNAVAILABLE


@contextmanager
def reaching_kafka(bootstrap_servers: str, config: dict[str, Any] | None = None) -> Iterator[None]:
    """Around a Kafka client's construction (it connects there): kafka-python's retry lines are dropped, and a
    broker that does not answer within `bootstrap_timeout_ms` becomes one KafkaUnreachable saying what to check."""
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError, MetadataEmptyBrokerList, NodeNotReadyError

    timeout_ms = (config or {}).get("bootstrap_timeout_ms")
    within = f" within {int(timeout_ms) / 1000:g} s" if timeout_ms else ""
    with quiet_kafka_connections():
        try:
            yield
        except (KafkaTimeoutError, KafkaConnectionError, MetadataEmptyBrokerList, NodeNotReadyError) as exc:
            raise KafkaUnreachable(
                f"cannot reach Kafka at {bootstrap_servers}{within} ({type(exc).__name__}): check "
                "--bootstrap-servers / TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS and that the brokers are up "
                "(wait longer with --kafka-config bootstrap_timeout_ms=MS)"
            ) from None


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

        def select(job: Any) -> bool:
            if not sampler.should_judge(job):
                return False
            prometheus.record_submitted()  # TracejudgeJudgeStalled: submitted, and neither verdicts nor errors
            return True

        self.pipeline = Pipeline(settings, judges, prometheus, select, sinks=sinks, feedback=self.feedback)
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

    def connect(self) -> None:
        """Connect to the brokers and subscribe (the group is joined by the first polls). Raises KafkaUnreachable
        when the brokers do not answer within `bootstrap_timeout_ms` (5 s unless --kafka-config says otherwise)."""
        if self._consumer is not None:
            return
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
        with reaching_kafka(settings.bootstrap_servers, config):
            consumer = self.consumer_factory(**config)
            try:
                if settings.dead_letter_topic:
                    self._dead_letter = self.pipeline.ingest.dead_letter = KafkaWriter(
                        settings.bootstrap_servers,
                        settings.dead_letter_topic,
                        on_error=lambda: self.prometheus.record_output_error("dead_letter"),
                        **settings.producer_config(),
                    ).start()
            except BaseException:
                consumer.close(autocommit=False)
                raise
        self._consumer = self.partitions.consumer = consumer
        self._consumer.subscribe([settings.topic], listener=self.partitions)
        self._announce_join()

    def _announce_join(self) -> None:
        """Say before the (possibly long) group join what a new group means: records produced before its partitions
        are assigned are skipped under --start-from latest. "ready" follows once partitions are assigned."""
        settings = self.settings
        where = f"topic {settings.topic!r} as group {settings.group_id!r} on {settings.bootstrap_servers}"
        committed = self._group_has_commits()
        if committed is False and settings.start_from == "latest":
            logger.warning(
                "joining %s: the group has no committed offsets, so it starts at the end of the topic. Joining can "
                "take a while (~20 s on some brokers); records produced before its partitions are assigned are "
                'skipped with --start-from latest (use --start-from earliest to read them). "ready" follows once '
                "partitions are assigned",
                where,
            )
        elif committed is False:
            logger.info(
                "joining %s: the group has no committed offsets; it reads the topic from the beginning once its "
                "partitions are assigned (joining can take a while, ~20 s on some brokers)",
                where,
            )
        else:
            logger.info('joining %s; "ready" follows once partitions are assigned', where)

    def _group_has_commits(self) -> bool | None:
        """Whether the group committed an offset on any partition of the topic; None when that cannot be told."""
        consumer = self._consumer
        assert consumer is not None
        try:
            partitions = sorted(consumer.partitions_for_topic(self.settings.topic) or ())
            for partition in partitions:
                if consumer.committed(TopicPartition(self.settings.topic, partition), timeout_ms=5_000) is not None:
                    return True
            return False if partitions else None  # no such topic (yet): nothing to say about its offsets
        except Exception as exc:
            logger.debug("could not read the group's committed offsets: %r", exc)
            return None

    def run(self) -> None:
        self.connect()
        settings = self.settings
        self.pool.start()
        self.ready.set()
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
