"""A task: state partition p owned by this process (Kafka Streams' StreamTask), as data.

Owning input partition p makes this process the owner of state partition p: the conversations whose id hashes to p,
fed by p's own records and by repartition partition p. The task holds its table and where each of its sources
stands; the stream thread, the state manager and the committer move it along.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
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
    changelog_end: int | None = None
    repartition_position: int = 0
    input_position: int | None = None  # next input offset to process (None: nothing read since assignment)
    committed_input: int | None = None
    watermark_ms: int = 0
    caught_up_ms: int = 0  # wall time by which a fresh fetch found nothing in the input partition left to read
    highwater_dropped_ms: int | None = None  # when the group consumer's remembered high watermark was dropped
    highwater_seen: int | None = None  # the last high watermark a fetch answered (for the lag gauge)
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
