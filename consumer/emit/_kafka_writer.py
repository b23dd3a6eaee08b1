"""A Kafka producer behind the shared bounded worker (a queue, one thread): writers never block the judge pool or
the poll loop.

A record's `delivered` event is set only once the broker acknowledged it. A failed send is retried with exponential
backoff until it succeeds or the writer closes, and each failure is reported to `on_error` (the consumer counts it in
`tracejudge_output_errors_total`): a result that never reached Kafka keeps its conversation's offset hold, so it is
not committed past, also across a restart. A `durable` writer (the results topic) never drops a record; its memory is
bounded by the consumer's backpressure, which counts results awaiting delivery. A best-effort writer (the dead-letter
topic) drops records past `max_queue` waiting, and counts them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tracejudge._shared.bounded_worker import UNHANDLED, Backoff, BoundedWorker
from tracejudge._shared.rate_limited_log import RateLimitedLog

from ..kafka import KafkaClients

logger = logging.getLogger("tracejudge.consumer.kafka_writer")
MAX_BACKOFF_S = 30.0


@dataclass(slots=True)
class _Item:
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    on_written: Callable[[], None] | None = None
    delivered: threading.Event = field(default_factory=threading.Event)
    attempts: int = 0


class KafkaWriter:
    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        max_queue: int = 10_000,
        durable: bool = False,
        on_error: Callable[[], None] | None = None,
        base_backoff_s: float = 0.5,
        hint: str = "",
        **producer_config: Any,
    ) -> None:
        self.topic = topic
        self.hint = hint  # what to check, said with each failure (the topic's purpose and the grant it needs)
        self.durable = durable
        self.on_error = on_error
        self.max_queue = max_queue
        self.client_id = producer_config.get("client_id", "tracejudge-writer")
        self.clients = KafkaClients(bootstrap_servers, producer_config)  # builds the producer when the writer starts
        self._producer: Any = None
        self._lock = threading.Lock()  # the counters: written from the worker and the producer's thread
        self._sent = 0
        self._failed = 0
        self._log = RateLimitedLog(logger)
        self._worker: BoundedWorker[_Item] = BoundedWorker(
            self._send,
            name=f"kafka-writer-{topic}",
            max_queue=None if durable else max_queue,  # queued and awaiting a retry (not yet handed to the producer)
            backoff=Backoff(base_backoff_s, MAX_BACKOFF_S, jitter=0.2),
            on_drop=self._dropped,
            start=False,
        )

    @property
    def sent(self) -> int:
        """Records the broker acknowledged (with `failed` and `dropped`: counters for tests and diagnostics)."""
        with self._lock:
            return self._sent

    @property
    def failed(self) -> int:
        """Failed send attempts (each one retried)."""
        with self._lock:
            return self._failed

    @property
    def dropped(self) -> int:
        """Records given up: a best-effort writer's full queue, or still unwritten when the writer closed."""
        return self._worker.dropped

    def start(self) -> KafkaWriter:
        self._producer = self.clients.producer(self.client_id)
        self._worker.start()
        return self

    def write(
        self,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]] | None = None,
        *,
        on_written: Callable[[], None] | None = None,
    ) -> threading.Event:
        """Queue one record, never blocking; the returned event is set once the broker acknowledged it, and then
        `on_written` is called (on the producer's thread: it must be quick and not block)."""
        item = _Item(key, value, headers or [], on_written)
        self._worker.put(item)
        return item.delivered

    def _dropped(self, count: int, reason: str) -> None:
        if reason == UNHANDLED:
            logger.warning(
                "writer for %r closed with %d records unwritten (their offsets stay uncommitted)", self.topic, count
            )
        else:
            self._log.warning("writer for %r full or closed: record dropped (total %d)", self.topic, self.dropped)

    def _send(self, batch: list[_Item]) -> None:
        for item in batch:
            item.attempts += 1
            try:
                future = self._producer.send(self.topic, key=item.key, value=item.value, headers=item.headers)
                future.add_callback(self._acknowledged, item)  # kafka's Future calls f(item, value)
                future.add_errback(self._send_failed, item)
            except Exception as exc:
                self._send_failed(item, exc)

    def _acknowledged(self, item: _Item, _metadata: Any) -> None:
        with self._lock:
            self._sent += 1
        item.delivered.set()
        if item.on_written is not None:
            try:
                item.on_written()
            except Exception:
                logger.exception("the callback of a record written to %r failed", self.topic)

    def _send_failed(self, item: _Item, exc: BaseException) -> None:
        """Count it and retry after a backoff (from the producer's thread or the worker)."""
        with self._lock:
            self._failed += 1
            failed = self._failed
        self._worker.put(item, after_s=self._worker.backoff.delay(item.attempts))  # dropped once closing
        self._log.warning(
            "writing to %r failed: %r (retrying; %d failures so far)%s", self.topic, exc, failed, self.hint
        )
        if self.on_error is not None:
            try:
                self.on_error()
            except Exception:
                logger.exception("counting an output error failed")

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is queued within `timeout_s`, never blocking past it (a full or stuck queue included).

        Records not acknowledged by then are counted dropped; their events stay unset, so their offsets stay held.
        """
        if self._producer is None:
            return
        deadline = time.monotonic() + timeout_s
        self._worker.close(timeout_s)
        try:
            self._producer.flush(timeout=max(0.1, deadline - time.monotonic()))
        except Exception as exc:
            logger.warning("flushing the writer for %r: %r", self.topic, exc)
        try:
            self._producer.close(timeout=max(0.1, deadline - time.monotonic()))
        except Exception as exc:
            logger.warning("closing the writer for %r: %r", self.topic, exc)
        self._producer = None
