"""`<group>-judge-batches`: the batch tier's durable state, a compacted topic with one record per submitted batch.

A batch is recorded before it is submitted (its local key, which also goes into the provider batch's metadata, and
its requests' ids) and again with the provider's batch id; `save` returns once the broker acknowledged the record.
Every replica reads the whole topic at start and keeps following it, so a judgement moved to another replica (a
rebalance, a kill -9) waits for the batch it is already in instead of being paid for twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from ..settings import Settings
from . import records as R
from .topics import COMPACT, TopicSpec

logger = logging.getLogger("tracejudge.consumer.batches")
BATCH = "batch"


def batches_topic(group_id: str) -> str:
    return f"{group_id}-judge-batches"


def batches_topic_spec(group_id: str) -> TopicSpec:
    """One compacted partition: every replica reads all of it (created with the other internal topics' layout)."""
    return TopicSpec(batches_topic(group_id), 1, COMPACT)


class KafkaBatchStore:
    def __init__(
        self,
        settings: Settings,
        *,
        consumer_factory: Callable[..., KafkaConsumer] = KafkaConsumer,
        producer_factory: Callable[..., KafkaProducer] = KafkaProducer,
    ) -> None:
        self.topic = batches_topic(settings.group_id)
        self.settings = settings
        self._tp = TopicPartition(self.topic, 0)
        self._producer = producer_factory(
            bootstrap_servers=settings.bootstrap_servers,
            client_id="tracejudge-batches",
            acks="all",
            **settings.producer_config(),
        )
        self._consumer = consumer_factory(
            bootstrap_servers=settings.bootstrap_servers,
            client_id="tracejudge-batches-reader",
            group_id=None,
            enable_auto_commit=False,
            **{k: v for k, v in settings.consumer_config().items() if k != "group_id"},
        )
        self._consumer.assign([self._tp])
        self._consumer.seek_to_beginning(self._tp)
        self._records: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def save(self, record: dict[str, Any]) -> None:
        """Durable when it returns (the broker acknowledged it); raises if it could not be written."""
        key = str(record["key"]).encode()
        self._producer.send(self.topic, key=key, value=R.dumps(record), headers=R.header(BATCH), partition=0).get(30)
        with self._lock:
            self._records[record["key"]] = dict(record)

    def forget(self, key: str) -> None:
        """A tombstone: compaction drops the batch's records; every replica forgets it as it reads this."""
        self._producer.send(self.topic, key=key.encode(), value=None, headers=R.header(BATCH), partition=0).get(30)
        with self._lock:
            self._records.pop(key, None)

    def load(self) -> list[dict[str, Any]]:
        """Every batch recorded so far: the topic read to its end (a fetch returning nothing at the high watermark);
        once `follow` runs, its thread reads (a consumer is not shared between threads)."""
        if self._thread is None:
            self._read_to_end()
        with self._lock:
            return list(self._records.values())

    def _read_to_end(self, timeout_s: float = 30.0) -> None:
        import time

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batches = self._consumer.poll(timeout_ms=200)
            self._apply(batches)
            end = self._consumer.highwater(self._tp)
            position = self._consumer.position(self._tp, timeout_ms=1000)
            if end is not None and position is not None and position >= end and not batches:
                return
        logger.warning("reading %s to its end took over %gs: resumed with what was read", self.topic, timeout_s)

    def _apply(self, batches: dict[Any, list[Any]]) -> list[dict[str, Any]]:
        new = []
        for records in batches.values():
            for record in records:
                if record.value is None:  # a tombstone
                    with self._lock:
                        self._records.pop(record.key.decode("utf-8", "replace") if record.key else "", None)
                    continue
                try:
                    value = R.loads(record.value)
                except ValueError:
                    continue
                with self._lock:
                    known = self._records.get(value.get("key"))
                    self._records[value["key"]] = value
                if known != value:
                    new.append(value)
        return new

    def follow(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Keep reading the topic on a thread; `listener` gets every record written since (by any replica)."""
        self._listeners.append(listener)
        if self._thread is None:
            self._read_to_end()
            self._thread = threading.Thread(target=self._run, name="tracejudge-batches", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                new = self._apply(self._consumer.poll(timeout_ms=500))
            except Exception as exc:
                logger.warning("following %s: %r", self.topic, exc)
                self._stop.wait(1.0)
                continue
            for value in new:
                for listener in self._listeners:
                    try:
                        listener(value)
                    except Exception:
                        logger.exception("a batch record listener failed")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for client in (self._consumer, self._producer):
            try:
                client.close()
            except Exception as exc:
                logger.warning("closing the batch store: %r", exc)
