"""Backfill's assembly: the live assembler's tables, routing and clock rule, over a range of records read once.

Backfill differs from `tracejudge consume` only in its source (an offset range, no group, no changelog) and its clock
(record timestamps only, the range's end standing for "now"). Everything else is the live consumer's: one
ConversationTable per state partition with the same settings (byte bound, turn cap, end grace, retention, feedback
dedupe), events routed to `state_partition` and "ordered" exactly when they are live (read on their own partition
from a record keyed by their conversation id), a partition's clock its highest record timestamp, routed events
completing by the slowest other partition. So a conversation gets the same content id, hence the same result ids,
from both, and backfill's skip-if-judged check finds what the live consumer judged.
"""

from __future__ import annotations

import logging

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ..conversation.job import JudgeJob
from ..conversation.reading import read_events
from ..conversation.table import OPEN, ConversationTable, Dispatch, MemoryBound
from ..conversation.textless import TextlessSpans
from ..kafka.partitioner import state_partition
from ..settings import Settings

logger = logging.getLogger("tracejudge.backfill")


class RangeAssembler:
    """The state partitions' tables for a backfill; one thread drives it (the reading one)."""

    def __init__(
        self, settings: Settings, partitions: int, start_ms: int, *, textless: TextlessSpans | None = None
    ) -> None:
        self.partitions = partitions
        self.max_record_bytes = settings.max_record_bytes
        self.textless = textless
        self.memory = MemoryBound(settings.max_state_bytes)
        self.tables = {p: ConversationTable.from_settings(settings, self.memory) for p in range(partitions)}
        self.clocks = dict.fromkeys(range(partitions), start_ms)  # per state partition: its highest record time
        self._bound_log = RateLimitedLog(logger, interval_s=10.0)

    def record(self, partition: int, key: bytes | None, value: bytes | None, ts_ms: int) -> str | None:
        """One record of input partition `partition` at record time `ts_ms`; why it is (partly) unreadable, if so."""
        events, failure = read_events(value, max_bytes=self.max_record_bytes, textless=self.textless)
        self.clocks[partition] = max(self.clocks[partition], ts_ms)
        for event in events:
            owner = state_partition(event.conversation_id, self.partitions)
            # As live: in order only if read where it belongs, from a record keyed by its conversation id; a routed
            # event does not move its owner's clock (its time is the partition it was read from, whose own input the
            # owner may not have read that far: `Processor.repartitioned`).
            ordered = owner == partition and key == event.conversation_id.encode("utf-8", "surrogatepass")
            try:
                self.tables[owner].apply(event, ts_ms, ordered=ordered)
            except Exception as exc:  # nothing a record contains may stop the backfill
                failure = failure or f"a span could not be folded in: {exc!r}"[:300]
        return failure

    def advance(self, finished: set[int], end_ms: int) -> None:
        """Complete what is idle by record time. A partition read to the end of the range stands at `end_ms` (live: a
        caught-up partition's clock is the wall time); events routed from another partition complete by the slowest
        other partition's clock, as live."""
        clocks = {p: end_ms if p in finished else ms for p, ms in self.clocks.items()}
        for p, table in self.tables.items():
            others = [ms for q, ms in clocks.items() if q != p]
            table.advance(clocks[p], min(others) if others else None)
        self._bound_memory()

    def _bound_memory(self) -> None:
        """Past --max-state-bytes the oldest completed conversations are forgotten, as live; an open one is never
        completed early here (it would be judged on part of its turns, under another content id than live's)."""
        while self.memory.over:
            kept = [(ms, t) for t in self.tables.values() if (ms := t.oldest_completed_ms()) is not None]
            if not kept:
                self._bound_log.warning(
                    "open conversations hold %d bytes, over --max-state-bytes (%d): kept, not cut; backfill a "
                    "shorter range or raise --max-state-bytes",
                    self.memory.used,
                    self.memory.max_bytes,
                )
                return
            min(kept, key=lambda c: c[0])[1].forget_oldest_completed()

    def take_dispatches(self) -> list[Dispatch]:
        return [dispatch for table in self.tables.values() for dispatch in table.take_dispatches()]

    def verdict(self, job: JudgeJob, outcome: str) -> None:
        """A snapshot's outcome back to its table (negative feedback on one not judged completes it again)."""
        owner = state_partition(job.conversation_id, self.partitions)
        self.tables[owner].verdict(job.conversation_id, job.content_id, outcome, self.clocks[owner])

    def still_open(self) -> list[str]:
        return [cid for table in self.tables.values() for cid, s in table.states.items() if s.status == OPEN]
