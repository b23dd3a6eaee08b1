"""What may be committed: per partition, nothing past the first offset an open or in-flight conversation needs.

Written only on the poll thread (positions as records are read, holds as conversations open and as their outputs
become durable) and by the rebalance listener, which runs while the poll thread waits in `poll()`. The lock is for
readers on other threads: `held()` and `positions()` (tests, the ingest benchmark).
"""

from __future__ import annotations

import threading


class OffsetTracker:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._positions: dict[int, int] = {}
        self._holds: dict[int, dict[str, int]] = {}
        self._partition_of: dict[str, int] = {}

    def consumed(self, partition: int, next_offset: int) -> None:
        with self._lock:
            if next_offset > self._positions.get(partition, -1):
                self._positions[partition] = next_offset

    def hold(self, key: str, partition: int, offset: int) -> None:
        with self._lock:
            holds = self._holds.setdefault(partition, {})
            if key not in holds or offset < holds[key]:
                holds[key] = offset
            self._partition_of[key] = partition

    def release(self, key: str) -> None:
        with self._lock:
            partition = self._partition_of.pop(key, None)
            if partition is not None:
                self._holds.get(partition, {}).pop(key, None)

    def positions(self) -> dict[int, int]:
        with self._lock:
            return dict(self._positions)

    def held(self) -> int:
        with self._lock:
            return len(self._partition_of)

    def committable(self) -> dict[int, int]:
        """Per partition, the offset to commit: the lowest still needed, else the next one to consume."""
        with self._lock:
            result: dict[int, int] = {}
            for partition, position in self._positions.items():
                holds = self._holds.get(partition)
                result[partition] = min(min(holds.values()), position) if holds else position
            return result

    def forget_partitions(self, partitions: set[int]) -> None:
        with self._lock:
            for partition in partitions:
                self._positions.pop(partition, None)
                for key in self._holds.pop(partition, {}):
                    self._partition_of.pop(key, None)
