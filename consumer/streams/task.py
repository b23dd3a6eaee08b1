"""A task: state partition p owned by this process (Kafka Streams' StreamTask).

Owning input partition p makes this process the owner of state partition p: the conversations whose id hashes to p,
fed by p's own records and by repartition partition p. The task holds its table and where each of its sources
stands. Its state changes only through the methods below, and only on the stream thread: the rebalance listener
(kafka-python's IO thread) and the producer's callbacks (its sender thread) hand what they learn to the stream
thread, which applies it here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..conversation.store import LocalStore
from ..conversation.table import ConversationState, ConversationTable


@dataclass(slots=True)
class Task:
    """State partition p owned here: its table, where its sources stand, its clock."""

    partition: int
    table: ConversationTable
    restoring: bool = True
    restore_started: float = field(default_factory=time.monotonic)
    changelog_position: int = 0
    repartition_position: int = 0
    input_position: int | None = None  # next input offset to process (None: nothing read since assignment)
    committed_input: int | None = None
    # The highest record time read from the task's OWN input partition: how far it has routed its input (what it
    # broadcasts) and its conversations' clock. Never moved by routed events (they carry another partition's
    # time: taking theirs claimed input not yet read, tests/consumer/test_trace_keyed_windows.py) nor by wall time.
    watermark_ms: int = 0
    caught_up_ms: int = 0  # wall time by which a fetch found nothing in the input partition left to read
    unflushed: dict[str, ConversationState | None] = field(default_factory=dict)
    # While restoring: the changelog's latest record per conversation (kind, value), decoded once at the end (a
    # state the changelog holds several times, not compacted yet, is read once).
    restored: dict[bytes, tuple[str | None, bytes | None]] = field(default_factory=dict)
    store: LocalStore | None = None  # the local store on disk (None: it could not be opened; memory only)
    store_failing: bool = False  # its last write failed (a full disk): no checkpoint until one succeeds
    checkpointed: int | None = None  # the changelog offset the store was restored from (its checkpoint)
    changelog_acked: int | None = None  # next offset after this task's last acknowledged changelog write
    positions_dirty: bool = False
    reported: dict[str, int] = field(default_factory=dict)  # table counts already exported
    sources: dict[int, int] = field(default_factory=dict)  # input partition → its routed watermark (ms)

    # -- reading its sources ---------------------------------------------------------------------------------------

    def input_record(self, ts_ms: int) -> None:
        """A record of its own input partition, at record time `ts_ms`: the task's clock."""
        if ts_ms > self.watermark_ms:
            self.watermark_ms = ts_ms

    def input_read(self, next_offset: int) -> None:
        """Its input partition was processed up to `next_offset` (committed at the next commit)."""
        self.input_position = next_offset
        self.positions_dirty = True

    def repartition_read(self, next_offset: int) -> None:
        self.repartition_position = next_offset
        self.positions_dirty = True

    def source_watermark(self, source: int, ms: int) -> None:
        """Input partition `source` has routed every record up to `ms` (record time) here."""
        if ms > self.sources.get(source, 0):
            self.sources[source] = ms

    # -- the clock's probe -----------------------------------------------------------------------------------------

    def caught_up(self, at_ms: int) -> None:
        """A fetch sent at wall time `at_ms` found the input read to its end."""
        if at_ms > self.caught_up_ms:
            self.caught_up_ms = at_ms

    # -- restoration -----------------------------------------------------------------------------------------------

    def start_from_checkpoint(self, changelog: int, positions: Mapping[str, Any]) -> None:
        """The local store reflects the changelog up to `changelog`: restoration reads on from there."""
        self.changelog_position = self.checkpointed = changelog
        self.repartition_position = int(positions.get("repartition") or 0)
        self.watermark_ms = int(positions.get("watermark") or 0)
        self.sources = {int(k): int(v) for k, v in (positions.get("sources") or {}).items()}

    def restore_positions(self, positions: Mapping[str, Any]) -> None:
        """A positions record read from the changelog (the latest one wins for the repartition position)."""
        self.repartition_position = int(positions["repartition"])
        self.input_record(int(positions.get("watermark", 0)))
        for source, ms in (positions.get("sources") or {}).items():
            self.source_watermark(int(source), int(ms))

    def restore_state(self, key: bytes, kind: str | None, value: bytes | None) -> None:
        """A conversation's changelog record, kept raw until the restore ends (its latest record is decoded once)."""
        self.restored[key] = (kind, value)

    def changelog_read(self, next_offset: int) -> None:
        self.changelog_position = next_offset

    def take_restored(self) -> dict[bytes, tuple[str | None, bytes | None]]:
        restored, self.restored = self.restored, {}
        return restored

    def activate(self) -> None:
        """Restored: from now on it processes records, completes, dispatches and commits."""
        self.restoring = False

    # -- commit ----------------------------------------------------------------------------------------------------

    def stage_changes(self) -> dict[str, ConversationState | None]:
        """The table's changes since the last commit joined to those not yet acknowledged (a failed commit's): what
        this commit writes to the changelog, once per conversation."""
        changed, removed = self.table.take_changes()
        for state in changed:
            self.unflushed[state.id] = state
        for cid in removed:
            self.unflushed[cid] = None
        return self.unflushed

    def changes_flushed(self) -> None:
        """The changelog acknowledged the staged changes: the positions record follows them."""
        if self.unflushed:
            self.positions_dirty = True
        self.unflushed.clear()

    def positions_written(self) -> None:
        self.positions_dirty = False

    def acknowledged(self, next_offset: int) -> None:
        """The changelog acknowledged a write of this task's up to `next_offset` (handed over from the sender
        thread by the record collector)."""
        if self.changelog_acked is None or next_offset > self.changelog_acked:
            self.changelog_acked = next_offset

    def committed(self, offset: int) -> None:
        self.committed_input = offset

    def store_wrote(self, ok: bool) -> bool:
        """Whether the local store's last write succeeded; True when it writes again after failing."""
        again = ok and self.store_failing
        self.store_failing = not ok
        return again

    def counted_since_reported(self) -> dict[str, int]:
        """What the table counted since the last call, by count (the gauges export the differences)."""
        deltas: dict[str, int] = {}
        for key, count in self.table.counts.items():
            deltas[key] = count - self.reported.get(key, 0)
            self.reported[key] = count
        return deltas

    def positions(self) -> dict[str, Any]:
        """Where the task's sources stand, as the changelog's positions record and the checkpoint carry them."""
        return {
            "input": self.input_position,
            "repartition": self.repartition_position,
            "watermark": self.watermark_ms,
            "sources": {str(k): v for k, v in self.sources.items()},
        }


def active(tasks: Iterable[Task]) -> list[Task]:
    """The tasks done restoring: only these process records, complete, dispatch and commit."""
    return [task for task in tasks if not task.restoring]
