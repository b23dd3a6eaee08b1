"""A compacted topic read as a table (Kafka Streams' GlobalKTable): every replica reads all of it to its end at
start, then follows what any replica writes; the latest record of a key is its value, a tombstone deletes it.

Two tables live in internal topics: the batch tier's submitted batches (`<group>-judge-batches`) and the delivered
notifications (`<group>-notifications`). Both are read to their end by the one reader (`reader.TopicReader`: the high
watermark a fetch answered, the stall bound), and followed on a thread of the caller's."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .clients import KafkaClients
from .reader import TopicReader, partitions_for, stall_bound_s, topic_partitions

logger = logging.getLogger("tracejudge.consumer.kafka")
POLL_MS = 500


class CompactedTable:
    """Reads `topic` with a consumer of its own (no group). `apply(records)` folds a batch of records into the
    caller's state; it is called on the thread that runs `load` or `follow` (one at a time: a consumer is not shared
    between threads)."""

    def __init__(self, clients: KafkaClients, topic: str, apply: Callable[[Sequence[Any]], None], *, what: str):
        self.topic = topic
        self.what = what
        self.apply = apply  # may be replaced between `load` and `follow` (on the thread that runs them)
        self._stall_s = stall_bound_s(clients.consumer_config())
        self._consumer: Any = clients.consumer(f"tracejudge-table-{topic}"[:100])

    def load(self, stop: threading.Event | None = None) -> None:
        """Read the topic to its end (a topic without partitions yet holds nothing: `follow` waits for them);
        ReadStalled (KafkaUnreachable) when the brokers stop answering for the stall bound."""
        partitions = partitions_for(self._consumer, self.topic, what=self.what, stall_s=self._stall_s)
        if not partitions:
            return
        reader = TopicReader(
            self._consumer, topic_partitions(self.topic, partitions), what=self.what, stop=stop, stall_s=self._stall_s
        )
        for _, records in reader:
            self.apply(records)

    def follow(self, stop: threading.Event) -> None:
        """Keep reading what any replica writes, until `stop` (on the caller's thread); partitions not known yet (a
        topic just created) are waited for, then read from their beginning. A broker outage is waited out."""
        consumer = self._consumer
        while not consumer.assignment() and not stop.is_set():
            try:
                partitions = consumer.partitions_for_topic(self.topic)  # asks the cluster while unknown
            except Exception as exc:
                logger.debug("looking up %s: %r", self.topic, exc)
                partitions = None
            if partitions:
                assigned = topic_partitions(self.topic, partitions)
                consumer.assign(assigned)
                consumer.seek_to_beginning(*assigned)
            else:
                stop.wait(1.0)
        while not stop.is_set():
            try:
                batches = consumer.poll(timeout_ms=POLL_MS)
            except Exception as exc:  # an outage: what was read stays, reading goes on once the brokers answer
                logger.warning("following %s: %r", self.topic, exc)
                stop.wait(1.0)
                continue
            for records in batches.values():
                self.apply(records)

    def close(self) -> None:
        try:
            self._consumer.close()
        except Exception as exc:
            logger.warning("closing the reader of %s: %r", self.topic, exc)
