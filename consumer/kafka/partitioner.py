"""Which state partition owns a conversation: Kafka's default partitioner on the conversation id.

The Java client and kafka-python both place a keyed record at murmur2(key) mod partitions, so records our exporter
keys by conversation id already sit on their conversation's state partition and skip the repartition hop.
"""

from __future__ import annotations

from functools import lru_cache

from kafka.partitioner.default import murmur2


@lru_cache(maxsize=8192)  # kafka-python's murmur2 is pure Python (~4 µs); a conversation's turns come close together
def state_partition(conversation_id: str, partitions: int) -> int:
    return (murmur2(conversation_id.encode("utf-8", "surrogatepass")) & 0x7FFFFFFF) % partitions
