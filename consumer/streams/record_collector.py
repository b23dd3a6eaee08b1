"""The record collector (Kafka Streams' RecordCollectorImpl): every write of the stream thread to Kafka.

One producer writes the internal topics (repartition, changelog, judge queue); a KafkaWriter sets malformed input
aside in the dead-letter topic. A send that fails is remembered (`failed`) until the committer recovered from it,
so nothing is committed past a record that was never written; `flushed` says whether everything sent was answered.
The producer's answers (acknowledgements, failures) come on kafka-python's sender thread, or for librdkafka's producer
inside its poll (`serve`, at each `answers`): either way they are queued and applied on the stream thread (`answers`,
at each `flushed`, `failed` and round), so a task's state and the failure change there only.
Its producer's wake-ups are held per round of the stream thread (`kafka.wakeup.DeferredWakeup`).
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from typing import Any

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ..emit import KafkaWriter
from ..emit.prometheus import ConsumerInstruments
from ..kafka import KafkaClients, KafkaProducer, KafkaTimeoutError
from ..kafka.clients import close_now
from ..kafka.rdkafka import librdkafka_version
from ..kafka.topics import InternalTopics
from ..kafka.wakeup import DeferredWakeup
from ..settings import Settings
from . import records as R
from .task import Task

logger = logging.getLogger("tracejudge.consumer.streams")
PRODUCER_BATCH_BYTES = 256 * 1024


class RecordCollector:
    """The stream thread's producer and dead-letter writer; only the stream thread sends."""

    def __init__(
        self,
        settings: Settings,
        prometheus: ConsumerInstruments,
        topics: InternalTopics,
        clients: KafkaClients,
    ) -> None:
        self.settings = settings
        self.prometheus = prometheus
        self.topics = topics
        self.clients = clients
        self.producer: KafkaProducer | None = None
        self._wakeup: DeferredWakeup | None = None
        self._serve: Callable[[], None] | None = None
        self.dead_letter: KafkaWriter | None = None
        self._failed = False
        # The producer's answers, queued where they come (its sender thread, or `serve`): (task, next changelog offset
        # acknowledged) and (producer, topic, error).
        self._acks: queue.SimpleQueue[tuple[Task, int]] = queue.SimpleQueue()
        self._errors: queue.SimpleQueue[tuple[KafkaProducer | None, str, BaseException]] = queue.SimpleQueue()
        self._send_log = RateLimitedLog(logger, interval_s=10.0)

    @property
    def failed(self) -> bool:
        """A send failed since the producer was last renewed: nothing may be committed past it."""
        self.answers()
        return self._failed

    def answers(self) -> None:
        """The producer's answers so far, applied on the stream thread: each acknowledged changelog offset to its
        task, each failure of the current producer remembered (a renewed producer's were recovered from)."""
        if self._serve is not None:
            self._serve()
        while not self._acks.empty():
            task, offset = self._acks.get_nowait()
            task.acknowledged(offset)
        while not self._errors.empty():
            producer, topic, exc = self._errors.get_nowait()
            if producer is self.producer:
                self._send_error(topic, exc)

    def open(self) -> None:
        """The producer, and the dead-letter writer when --dead-letter-topic is set."""
        settings = self.settings
        self.producer = self._new_producer()
        if settings.dead_letter_topic:
            self.dead_letter = KafkaWriter(
                settings.bootstrap_servers,
                settings.dead_letter_topic,
                on_error=lambda: self.prometheus.record_output_error("dead_letter"),
                **settings.producer_config(),
            ).start()

    def _new_producer(self) -> KafkaProducer:
        # Large batches: a commit writes its changed conversations in a burst, and kafka-python wakes its sender
        # each time a send opens a new batch (per record, with 2 KiB states in the default 16 KiB batches).
        producer = self.clients.producer(
            "tracejudge-state",
            library=self.settings.producer_client,
            acks="all",
            linger_ms=5,
            batch_size=PRODUCER_BATCH_BYTES,
        )
        self._wakeup = DeferredWakeup.install(producer)
        self._serve = getattr(producer, "serve", None)  # librdkafka answers inside its poll, on this thread
        if self._serve is not None and self.producer is None:
            logger.info("the internal topics are written by librdkafka %s (--producer-client)", librdkafka_version())
        return producer

    def renew(self) -> None:
        """A send failed for good: a fresh producer, the failure cleared (an idempotent producer whose id the brokers
        forgot, e.g. after they lost their state, fails every later send with InitProducerId errors and never
        recovers)."""
        self._failed = False
        old = self.producer
        self.producer = self._new_producer()
        close_failed(old)

    def send(
        self, topic: str, key: str | bytes, value: bytes | None, kind: str, *, acked: Task | None = None, **kwargs: Any
    ) -> None:
        """`acked`: the task whose `changelog_acked` follows this record's acknowledgement. The stream thread (or
        the rebalance listener, while the stream thread waits in its poll)."""
        assert self.producer is not None
        raw_key = key if isinstance(key, bytes) else key.encode("utf-8", "surrogatepass")
        send = self.producer.send if self._wakeup is None else self._wakeup.send
        try:
            future = send(topic, key=raw_key, value=value, headers=R.header(kind), **kwargs)
        except Exception as exc:
            self._send_error(topic, exc)
            return
        producer = self.producer  # a renewed producer's aborted sends were already recovered from
        acks, errors = self._acks, self._errors
        future.add_errback(lambda exc: errors.put((producer, topic, exc)))  # the sender thread or `serve`: queued only
        if acked is not None:
            task = acked

            def acknowledged(meta: Any) -> None:  # the sender thread or `serve`: queued only
                offset = getattr(meta, "offset", None)
                if isinstance(offset, int) and offset >= 0:
                    acks.put((task, offset + 1))

            future.add_callback(acknowledged)

    def wake(self) -> None:
        """The producer's sender wakes for what was sent since (once a round of the stream thread); its answers so
        far are applied."""
        if self._wakeup is not None:
            self._wakeup.wake()
        self.answers()

    def _send_error(self, topic: str, exc: BaseException) -> None:
        self._failed = True
        output = "changelog" if topic == self.topics.changelog else "internal_topics"
        self.prometheus.record_output_error(output)
        self._send_log.warning(
            "writing to internal topic %s failed: %r (nothing is committed past it; check the brokers)", topic, exc
        )

    def set_aside(self, record: Any, reason: str) -> None:
        """A malformed input record into the dead-letter topic, with why and where from (if there is one)."""
        if self.dead_letter is not None:
            headers = [
                ("tracejudge.error", reason.encode("utf-8", "replace")[:1000]),
                ("tracejudge.source", f"{record.topic}/{record.partition}/{record.offset}".encode()),
            ]
            self.dead_letter.write(record.key, record.value or b"", headers)

    def flushed(self, timeout_s: float) -> bool:
        """Everything sent is acknowledged (or failed); False when the brokers did not answer in time (an outage:
        nothing is committed, the producer keeps retrying and the next commit tries again)."""
        assert self.producer is not None
        try:
            self.producer.flush(timeout=timeout_s)  # wakes the sender, also for the wake-ups held
        except KafkaTimeoutError:
            self._send_log.warning(
                "internal topics unacknowledged after %.0fs: nothing is committed until they are (check the brokers)",
                timeout_s,
            )
            return False
        finally:
            self.answers()  # what the flush waited for was answered (and queued) before it returned
        return True

    def close(self, grace_s: float) -> None:
        if self.producer is not None:
            try:
                self.producer.close(timeout=max(0.5, grace_s))
            except Exception as exc:
                logger.warning("closing the producer: %r", exc)
        if self.dead_letter is not None:
            self.dead_letter.close(max(0.5, grace_s))


def close_failed(producer: KafkaProducer | None) -> None:
    """Close a producer replaced after a failed send, without waiting for what it still holds (it is sent again)."""
    if producer is None:
        return
    try:
        close_now(producer)
    except Exception as exc:
        logger.warning("closing the failed producer: %r", exc)
