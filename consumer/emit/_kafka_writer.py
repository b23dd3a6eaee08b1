"""A Kafka producer behind a queue and its own thread: writers never block the judge pool or the poll loop.

A record's `delivered` event is set only once the broker acknowledged it. A failed send is retried with exponential
backoff until it succeeds or the writer closes, and each failure is reported to `on_error` (the consumer counts it in
`tracejudge_output_errors_total`): a result that never reached Kafka keeps its conversation's offset hold, so it is
not committed past, also across a restart. A `durable` writer (the results topic) never drops a record; its memory is
bounded by the consumer's backpressure, which counts results awaiting delivery. A best-effort writer (the dead-letter
topic) drops records past `max_queue` waiting, and counts them.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from tracejudge._shared.rate_limited_log import RateLimitedLog

logger = logging.getLogger("tracejudge.consumer.kafka_writer")
MAX_BACKOFF_S = 30.0


class _Item:
    __slots__ = ("attempts", "delivered", "headers", "key", "on_written", "value")

    def __init__(
        self,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
        on_written: Callable[[], None] | None = None,
    ) -> None:
        self.key, self.value, self.headers = key, value, headers
        self.delivered = threading.Event()
        self.on_written = on_written
        self.attempts = 0


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
        self.base_backoff_s = base_backoff_s
        self.config = {"bootstrap_servers": bootstrap_servers, "client_id": "tracejudge-writer", **producer_config}
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()  # C: a put takes no Python-level lock or condition
        self._retry: list[tuple[float, int, _Item]] = []
        self._order = itertools.count()
        self._lock = threading.Lock()  # counters and the retry heap: written from callers, the worker, the producer
        self._closing = threading.Event()
        self._deadline = float("inf")
        self._thread = threading.Thread(target=self._run, name=f"kafka-writer-{topic}", daemon=True)
        self._producer: Any = None
        self._waiting = 0  # queued or awaiting a retry (not yet handed to the producer)
        self._sent = 0
        self._failed = 0
        self._dropped = 0
        self._log = RateLimitedLog(logger)

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
        with self._lock:
            return self._dropped

    def start(self) -> KafkaWriter:
        from kafka import KafkaProducer

        self._producer = KafkaProducer(**self.config)
        self._thread.start()
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
        with self._lock:
            if self._closing.is_set() or (not self.durable and self._waiting >= self.max_queue):
                self._dropped += 1
                dropped = self._dropped
            else:
                self._waiting += 1
                dropped = 0
        if dropped:
            self._log.warning("writer for %r full or closed: record dropped (total %d)", self.topic, dropped)
        else:
            self._queue.put_nowait(item)
        return item.delivered

    def _next(self) -> _Item | None:
        with self._lock:
            now = time.monotonic()
            if self._retry and self._retry[0][0] <= now:
                return heapq.heappop(self._retry)[2]
            wait = min(0.1, self._retry[0][0] - now) if self._retry else 0.1
        try:
            return self._queue.get(timeout=max(0.001, wait))
        except queue.Empty:
            return None

    def _run(self) -> None:
        while not self._closing.is_set() or (not self._queue.empty() and time.monotonic() < self._deadline):
            item = self._next()
            if item is None:
                continue
            with self._lock:
                self._waiting = max(0, self._waiting - 1)
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
        backoff = min(MAX_BACKOFF_S, self.base_backoff_s * 2 ** min(item.attempts - 1, 16))
        with self._lock:
            self._failed += 1
            failed = self._failed
            if self._closing.is_set() or (not self.durable and len(self._retry) >= self.max_queue):
                self._dropped += 1
            else:
                self._waiting += 1
                due = time.monotonic() + backoff * random.uniform(0.8, 1.2)
                heapq.heappush(self._retry, (due, next(self._order), item))
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
        deadline = self._deadline = time.monotonic() + timeout_s
        self._closing.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        try:
            self._producer.flush(timeout=max(0.1, deadline - time.monotonic()))
        except Exception as exc:
            logger.warning("flushing the writer for %r: %r", self.topic, exc)
        try:
            self._producer.close(timeout=max(0.1, deadline - time.monotonic()))
        except Exception as exc:
            logger.warning("closing the writer for %r: %r", self.topic, exc)
        with self._lock:
            left = self._waiting
            self._waiting = 0
            self._dropped += left
            self._retry.clear()
        if left:
            logger.warning(
                "writer for %r closed with %d records unwritten (their offsets stay uncommitted)", self.topic, left
            )
        self._producer = None
