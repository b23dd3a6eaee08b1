"""The memory bounds (--max-open-conversations, --max-state-bytes), held across every task of the process.

Past a bound, clean conversations leave memory for their task's local store (Kafka Streams' record cache evicting to
RocksDB), so none is judged on part of its turns because of a bound. Only what no store can take (it could not be
opened, its disk is full, a commit failed) falls back to the cut: the least recently active complete early
(`memory_bound`), counted and said.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ..conversation.table import MemoryBound
from .task import Task, active

logger = logging.getLogger("tracejudge.consumer.streams")


class MemoryBounds:
    """Spills, and cuts where it must; `commit` makes dirty conversations clean (and so spillable)."""

    def __init__(self, max_open: int, memory: MemoryBound, commit: Callable[[], None]) -> None:
        self.max_open = max_open
        self.memory = memory
        self.commit = commit
        self._bound_log = RateLimitedLog(logger, interval_s=30.0)

    @staticmethod
    def resident_open(tasks: Collection[Task]) -> int:
        """Open conversations held in memory, over every task (the bound counts these)."""
        return sum(task.table.resident_open_count for task in tasks)

    def _spill(self, tasks: Collection[Task], excess: int, *, open_only: bool) -> int:
        """Up to `excess` clean conversations leave memory for their local stores, from the tables holding the
        most; when every one left is dirty, a commit writes them first (Kafka Streams flushes its record cache when
        full). Returns what is still over."""
        for attempt in range(2):
            holders = [t for t in active(tasks) if t.table.store is not None]
            holders.sort(key=lambda t: t.table.resident_open_count if open_only else len(t.table.states), reverse=True)
            for task in holders:
                if excess <= 0:
                    return 0
                table = task.table
                excess -= table.spill_open(excess) if open_only else table.spill_oldest(excess)
            if excess <= 0 or attempt or not holders:
                return max(excess, 0)
            self.commit()
        return max(excess, 0)

    def hold_open(self, tasks: Collection[Task]) -> None:
        """Past --max-open-conversations (held in memory), the least recently active open conversations wait in the
        local store. What no store can take (it could not be opened, its disk is full, or a commit failed) completes
        early (`memory_bound`, counted and said): pausing cannot help, since a paused partition's clock stands
        still. Restoring partitions take no part: what they hold is already in the changelog."""
        running = active(tasks)
        excess = self.resident_open(running) - self.max_open
        if excess <= 0:
            return
        excess = self._spill(tasks, excess, open_only=True)
        if excess > 0:
            self._cut("--max-open-conversations", excess)
        while excess > 0 and running:
            busiest = max(running, key=lambda t: t.table.resident_open_count)
            if busiest.table.resident_open_count == 0 or not busiest.table.complete_oldest(busiest.watermark_ms):
                return
            excess -= 1

    def _cut(self, bound: str, excess: int) -> None:
        self._bound_log.warning(
            "past %s with %d conversations the local store cannot take (see tracejudge_state_store_errors_total):"
            " the least recently active complete early on the turns read so far (completed_by=memory_bound);"
            " free space under --state-dir, or raise the bound",
            bound,
            excess,
        )

    def hold_bytes(self, tasks: Collection[Task]) -> None:
        """Past --max-state-bytes, process-wide: the oldest clean conversations leave memory for the local store
        (completed first). Without a store to take them, as before it: the oldest completed conversation of any
        partition is forgotten first, then the least recently active open ones complete (`memory_bound`, counted),
        to be forgotten in turn once they were dispatched."""
        running = active(tasks)
        while self.memory.over and running:
            if self._spill(tasks, 64, open_only=False) < 64:
                continue
            break
        if self.memory.over and running:
            self._cut("--max-state-bytes", 1)
        while self.memory.over and running:
            kept = [(t.table.oldest_completed_ms(), t) for t in running]
            candidates = [(ms, t) for ms, t in kept if ms is not None]
            if candidates:
                min(candidates, key=lambda c: c[0])[1].table.forget_oldest_completed()
                continue
            busiest = max(running, key=lambda t: t.table.open_count)
            if busiest.table.open_count == 0 or not busiest.table.complete_oldest(busiest.watermark_ms):
                return
