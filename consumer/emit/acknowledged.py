"""OTLP output that says when it is delivered: an exporter whose inner exporter's SUCCESS acknowledges judgements.

The SDK's BatchSpanProcessor counts a span as done when it is queued, so a judgement's offset could be committed
while the collector answered 503 and a kill -9 then loses it. Here each judgement's spans and log records carry a
`Ticket`; a batch the exporter reports FAILURE for is logged and retried with backoff (never dropped), and a
ticket is set only when everything it covers was exported. It sits behind the SDK's Simple*Processor (which hands
each finished item over synchronously, on the emitting thread, in the SDK version's own types), and batches on the
shared bounded worker (one thread, as the SDK's batch processor); shutdown passes its deadline on. Its queue is not
bounded here: the consumer's backpressure bounds the judgements awaiting their tickets.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any

from tracejudge._shared.bounded_worker import Backoff, BoundedWorker
from tracejudge._shared.rate_limited_log import RateLimitedLog

logger = logging.getLogger("tracejudge.consumer.outputs")


class _Success:
    """What SpanExportResult.SUCCESS and LogExportResult.SUCCESS share: the name (the processors ignore the value)."""

    name = "SUCCESS"


_SUCCESS = _Success()
_current = threading.local()


class Ticket:
    """Set once `expected` items were exported."""

    def __init__(self, expected: int) -> None:
        self.event = threading.Event()
        self._left = expected
        self._lock = threading.Lock()
        if expected <= 0:
            self.event.set()

    def done(self, count: int = 1) -> None:
        with self._lock:
            self._left -= count
            if self._left <= 0:
                self.event.set()


@contextmanager
def ticket_for(ticket: Ticket) -> Any:
    """Spans ended and log records emitted on this thread inside the block belong to `ticket`."""
    previous = getattr(_current, "ticket", None)
    _current.ticket = ticket
    try:
        yield
    finally:
        _current.ticket = previous


class AcknowledgingExporter:
    """A span or log exporter for a Simple*Processor: `export` queues (with the emitting thread's ticket) and
    returns at once; the worker batches to the real `export`, retrying failures."""

    def __init__(
        self,
        export: Callable[[Sequence[Any]], Any],
        *,
        shutdown_exporter: Callable[[], Any] | None = None,
        name: str = "otlp",
        max_batch: int = 512,
        schedule_delay_s: float = 0.5,
        on_error: Callable[[], None] | None = None,
        max_backoff_s: float = 30.0,
    ) -> None:
        self._export = export
        self._shutdown_exporter = shutdown_exporter
        self.on_error = on_error
        self.exported = 0
        self.failures = 0
        self._log = RateLimitedLog(logger, interval_s=30.0)
        self._worker: BoundedWorker[tuple[Any, Ticket | None]] = BoundedWorker(
            self._send,
            name=f"tracejudge-{name}-export",
            max_batch=max_batch,
            linger_s=schedule_delay_s,
            backoff=Backoff(0.5, max_backoff_s),
        )

    # -- the exporter interface the SDK's Simple*Processor calls ------------------------------------------------------

    def export(self, items: Sequence[Any]) -> Any:
        ticket = getattr(_current, "ticket", None)
        for item in items:
            self._worker.put((item, ticket))
        return _SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._worker.flush(timeout_millis / 1000)

    def shutdown(self, timeout_millis: int = 30_000) -> None:
        """Exports what is queued and not waiting for a backoff, within the deadline; what is still unexported then
        stays unacknowledged (its offsets are not committed: a restart judges it again). `force_flush` first (the
        outputs' close does, through `FlushingProcessor`) waits out the backoffs of a collector's blip."""
        self._worker.close(timeout_millis / 1000)
        if self._shutdown_exporter is not None:
            try:
                self._shutdown_exporter()
            except Exception as exc:
                logger.warning("shutting down the OTLP exporter: %r", exc)

    @property
    def pending(self) -> int:
        return self._worker.pending

    # -- the worker --------------------------------------------------------------------------------------------------

    def _send(self, batch: list[tuple[Any, Ticket | None]]) -> bool:
        """False (the batch is kept, in order, and tried again after a backoff) unless the exporter said SUCCESS."""
        error: Exception | None = None
        try:
            result = self._export([item for item, _ in batch])
        except Exception as exc:  # an exporter should return FAILURE; one that raises is treated the same
            result, error = None, exc
        if result is None or getattr(result, "name", str(result)) != "SUCCESS":
            self.failures += 1
            if self.on_error is not None:
                self.on_error()
            self._log.warning(
                "OTLP export of %d evaluation items failed (%s); retrying, their offsets stay uncommitted until it "
                "succeeds: check --otlp-endpoint and the collector",
                len(batch),
                error if error is not None else result,
            )
            return False
        self.exported += len(batch)
        for _, ticket in batch:
            if ticket is not None:
                ticket.done()
        return True
