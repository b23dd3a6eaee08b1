"""A Kafka producer behind a bounded queue and its own thread: writers never block the judge pool or the poll loop."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from tracejudge.tracer._internal import RateLimitedLog

logger = logging.getLogger("tracejudge.consumer.kafka_writer")
_STOP = object()


class KafkaWriter:
    def __init__(self, bootstrap_servers: str, topic: str, *, max_queue: int = 10_000, **producer_config: Any) -> None:
        self.topic = topic
        self.config = {"bootstrap_servers": bootstrap_servers, "client_id": "tracejudge-writer", **producer_config}
        self._queue: queue.Queue[Any] = queue.Queue(max_queue)
        self._thread = threading.Thread(target=self._run, name=f"kafka-writer-{topic}", daemon=True)
        self._producer: Any = None
        self.sent = 0
        self.dropped = 0
        self._log = RateLimitedLog(logger)

    def start(self) -> KafkaWriter:
        from kafka import KafkaProducer

        self._producer = KafkaProducer(**self.config)
        self._thread.start()
        return self

    def write(self, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]] | None = None) -> threading.Event:
        """Queue one record; the returned event is set once the broker acknowledged it (or it was counted dropped)."""
        delivered = threading.Event()
        try:
            self._queue.put_nowait((key, value, headers or [], delivered))
        except queue.Full:
            self.dropped += 1
            self._log.warning("writer queue for %r full: record dropped (total %d)", self.topic, self.dropped)
            delivered.set()
        return delivered

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            key, value, headers, delivered = item
            try:
                future = self._producer.send(self.topic, key=key, value=value, headers=headers)
                future.add_callback(lambda _metadata, done=delivered: done.set())
                future.add_errback(self._failed, delivered)
                self.sent += 1
            except Exception as exc:
                self._failed(exc, delivered)

    def _failed(self, exc: BaseException, delivered: threading.Event | None = None) -> None:
        if delivered is not None:
            delivered.set()
        self.dropped += 1
        self._log.warning("writing to %r failed: %r (total dropped %d)", self.topic, exc, self.dropped)

    def close(self, timeout_s: float = 10.0) -> None:
        if self._producer is None:
            return
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        try:
            self._producer.flush(timeout=timeout_s)
            self._producer.close(timeout=timeout_s)
        except Exception as exc:
            logger.warning("closing the writer for %r: %r", self.topic, exc)
        self._producer = None
