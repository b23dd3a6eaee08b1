"""What a failure of the conversation state costs, counted and said (rate-limited, with what to do): a restored
state that cannot be read costs that conversation, a local store that fails costs its spilling, never the partition."""

from __future__ import annotations

import logging
from typing import Any

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ..conversation.store import StoreError
from .instruments import StreamsInstruments

logger = logging.getLogger("tracejudge.consumer.streams")


class StateFailures:
    def __init__(self, instruments: StreamsInstruments, state_dir: Any) -> None:
        self.instruments = instruments
        self.state_dir = state_dir
        self._store_log = RateLimitedLog(logger, interval_s=30.0)
        self._unreadable_log = RateLimitedLog(logger, interval_s=30.0)

    def unreadable(self, what: str, cid: str, exc: BaseException) -> None:
        """A restored state that cannot be read costs that conversation (counted), never the partition."""
        self.instruments.forgotten.labels(reason="unreadable").inc()
        self._unreadable_log.warning(
            "unreadable %s of conversation %r, left out of the restore: %r (a changelog written by another program or"
            " a newer tracejudge? its later spans start it again; check what writes the changelog topic)",
            what,
            cid,
            exc,
        )

    def store_failed(self, exc: BaseException, partition: int) -> None:
        reason = exc.reason if isinstance(exc, StoreError) else "io"
        self.instruments.store_errors.labels(reason=reason).inc()
        self._store_log.warning(
            "partition %d: the local store under --state-dir %s failed (%s): %s. Its conversations stay in memory,"
            " and past --max-open-conversations / --max-state-bytes the least recently active complete early"
            " (completed_by=memory_bound); free space on that volume or grow it (docs/state.md, the local store)",
            partition,
            self.state_dir,
            reason,
            exc,
        )
