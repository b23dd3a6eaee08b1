"""The record collector (Kafka Streams' RecordCollectorImpl): every write of the stream thread to Kafka.

One producer writes the internal topics (repartition, changelog, judge queue); a KafkaWriter sets malformed input
aside in the dead-letter topic. A send that fails is remembered (`failed`) until the committer recovered from it,
so nothing is committed past a record that was never written; `flushed` says whether everything sent was answered.

kafka-python (3.0.12) wakes its sender thread each time a send opens or fills a batch: a byte down a socket pair, a
system call that gives up the GIL, and a round of the sender's loop in Python while the stream thread waits to get
the GIL back. That was a tenth of the stream thread's time (with the sender's extra rounds on top).
`DeferredWakeup` holds those wake-ups while the stream thread sends and gives the sender one per round of the stream
thread (`wake`, at the end of `Assembler.step`), as Kafka Streams' producer sends without waiting: a record waits at
most one round (and `flush` wakes the sender at once), or until `WAKE_EVERY` wake-ups were held (a large burst
goes out while it is being written). A send to a topic whose metadata the producer lacks is not deferred: its send
waits on a metadata answer that needs the sender awake.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaTimeoutError

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ..emit import KafkaWriter
from ..emit.prometheus import ConsumerInstruments
from ..settings import Settings
from . import records as R
from .task import Task
from .topics import InternalTopics

logger = logging.getLogger("tracejudge.consumer.streams")
PRODUCER_BATCH_BYTES = 256 * 1024
WAKE_EVERY = 32  # wake-ups held at most before the sender is woken anyway (32 full batches: 8 MiB)


def _acknowledged(task: Task, meta: Any) -> None:
    offset = getattr(meta, "offset", None)
    if isinstance(offset, int) and offset >= 0:
        task.changelog_acked = max(task.changelog_acked or 0, offset + 1)


class DeferredWakeup:
    """Installed on one KafkaProducer's sender: the wake-ups its sends ask for on the stream thread are held until
    `wake` (see the module's docstring); every other wake-up (flush, close, a metadata wait) goes through at once."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self._metadata = producer._metadata
        self._sender = producer._sender
        self._wakeup = self._sender.wakeup
        self._sending: tuple[int, str] | None = None  # (thread, topic) of the send in progress
        self.held = 0  # wake-ups held since the sender last was woken
        self._sender.wakeup = self._asked

    @classmethod
    def install(cls, producer: Any) -> DeferredWakeup | None:
        """None for a producer without kafka-python's sender and metadata (e.g. a fake): left alone."""
        sender, metadata = getattr(producer, "_sender", None), getattr(producer, "_metadata", None)
        if not callable(getattr(sender, "wakeup", None)):
            return None
        if not callable(getattr(metadata, "partitions_for_topic", None)):
            return None
        return cls(producer)

    def send(self, topic: str, **kwargs: Any) -> Any:
        """The producer's `send`, its wake-ups held."""
        self._sending = (threading.get_ident(), topic)
        try:
            return self.producer.send(topic, **kwargs)
        finally:
            self._sending = None
            if self.held >= WAKE_EVERY:
                self.wake()

    def _asked(self) -> None:
        sending = self._sending
        if (
            sending is not None
            and sending[0] == threading.get_ident()
            and self._metadata.partitions_for_topic(sending[1]) is not None
        ):
            self.held += 1
        else:
            self.held = 0  # woken now: for those held too
            self._wakeup()

    def wake(self) -> None:
        """The sender wakes for the wake-ups held (if any)."""
        if self.held:
            self.held = 0
            self._wakeup()


class RecordCollector:
    """The stream thread's producer and dead-letter writer; only the stream thread sends."""

    def __init__(
        self,
        settings: Settings,
        prometheus: ConsumerInstruments,
        topics: InternalTopics,
        producer_factory: Callable[..., KafkaProducer] = KafkaProducer,
    ) -> None:
        self.settings = settings
        self.prometheus = prometheus
        self.topics = topics
        self.producer_factory = producer_factory
        self.producer: KafkaProducer | None = None
        self._wakeup: DeferredWakeup | None = None
        self.dead_letter: KafkaWriter | None = None
        self._failed = False
        self._send_log = RateLimitedLog(logger, interval_s=10.0)

    @property
    def failed(self) -> bool:
        """A send failed since the producer was last renewed: nothing may be committed past it."""
        return self._failed

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
        settings = self.settings
        # Large batches: a commit writes its changed conversations in a burst, and kafka-python wakes its sender
        # each time a send opens a new batch (per record, with 2 KiB states in the default 16 KiB batches).
        config: dict[str, Any] = {
            "bootstrap_servers": settings.bootstrap_servers,
            "client_id": "tracejudge-state",
            "acks": "all",
            "linger_ms": 5,
            "batch_size": PRODUCER_BATCH_BYTES,
        }
        producer = self.producer_factory(**{**config, **settings.producer_config()})
        self._wakeup = DeferredWakeup.install(producer)
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
        """`acked`: the task whose `changelog_acked` follows this record's acknowledgement."""
        assert self.producer is not None
        raw_key = key if isinstance(key, bytes) else key.encode("utf-8", "surrogatepass")
        send = self.producer.send if self._wakeup is None else self._wakeup.send
        try:
            future = send(topic, key=raw_key, value=value, headers=R.header(kind), **kwargs)
        except Exception as exc:
            self._send_error(topic, exc)
            return
        producer = self.producer  # a renewed producer's aborted sends were already recovered from
        future.add_errback(lambda exc: self._send_error(topic, exc) if producer is self.producer else None)
        if acked is not None:
            future.add_callback(lambda meta: _acknowledged(acked, meta))

    def wake(self) -> None:
        """The producer's sender wakes for what was sent since (once a round of the stream thread)."""
        if self._wakeup is not None:
            self._wakeup.wake()

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
        producer.close(timeout=0)
    except Exception as exc:
        logger.warning("closing the failed producer: %r", exc)
