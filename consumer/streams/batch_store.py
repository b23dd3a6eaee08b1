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

from ..kafka import KafkaClients
from ..kafka.table import CompactedTable
from ..kafka.topics import BATCHES, TopicSpec
from ..settings import Settings
from . import records as R

logger = logging.getLogger("tracejudge.consumer.batches")
BATCH = "batch"


def batches_topic(group_id: str) -> str:
    return BATCHES.name(group_id)


def batches_topic_spec(group_id: str) -> TopicSpec:
    """One compacted partition (the registry's BATCHES): every replica reads all of it (created with the other
    internal topics' layout)."""
    return BATCHES.spec(group_id)


class KafkaBatchStore:
    """The batch records of every replica (a `kafka.table.CompactedTable`); `save` and `forget` are durable when they
    return."""

    def __init__(self, settings: Settings, clients: KafkaClients) -> None:
        self.topic = batches_topic(settings.group_id)
        self.settings = settings
        self._producer = clients.producer("tracejudge-batches", acks="all")
        self._table = CompactedTable(clients, self.topic, self._apply, what=f"the batch records {self.topic!r}")
        self._records: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loaded = False

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
        """Every batch recorded so far: the topic read to its end (once; `follow`'s thread reads after that)."""
        self._load()
        with self._lock:
            return list(self._records.values())

    def _load(self) -> None:
        if not self._loaded:
            self._table.load(self._stop)
            self._loaded = True

    def _apply(self, records: Any) -> None:
        new = []
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
        if self._thread is None:
            return  # read at start: `load`'s caller takes them all
        for value in new:
            for listener in self._listeners:
                try:
                    listener(value)
                except Exception:
                    logger.exception("a batch record listener failed")

    def follow(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Keep reading the topic on a thread; `listener` gets every record written since (by any replica)."""
        self._listeners.append(listener)
        if self._thread is None:
            self._load()
            self._thread = threading.Thread(target=self._table.follow, args=(self._stop,), name="tracejudge-batches")
            self._thread.daemon = True
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._table.close()
        try:
            self._producer.close()
        except Exception as exc:
            logger.warning("closing the batch store: %r", exc)
