"""OTLP output that says when it is delivered: an exporter whose inner exporter's SUCCESS acknowledges judgements.

The SDK's BatchSpanProcessor counts a span as done when it is queued, so a judgement's offset could be committed
while the collector answered 503 and a kill -9 then loses it. Here each judgement's spans and log records carry a
`Ticket`; a batch the exporter reports FAILURE for is logged and retried with backoff (never dropped), and a
ticket is set only when everything it covers was exported. It sits behind the SDK's Simple*Processor (which hands
each finished item over synchronously, on the emitting thread, in the SDK version's own types), and batches on one
worker thread of its own, as the SDK's batch processor does; shutdown passes its deadline on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any

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
        self.max_batch = max_batch
        self.schedule_delay_s = schedule_delay_s
        self.on_error = on_error
        self.max_backoff_s = max_backoff_s
        self._queue: deque[tuple[Any, Ticket | None]] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._flush_requested = 0
        self._backoff_s = 0.0
        self.exported = 0
        self.failures = 0
        self._log = RateLimitedLog(logger, interval_s=30.0)
        self._thread = threading.Thread(target=self._run, name=f"tracejudge-{name}-export", daemon=True)
        self._thread.start()

    # -- the exporter interface the SDK's Simple*Processor calls ------------------------------------------------------

    def export(self, items: Sequence[Any]) -> Any:
        ticket = getattr(_current, "ticket", None)
        with self._cond:
            for item in items:
                self._queue.append((item, ticket))
            if len(self._queue) >= self.max_batch:
                self._cond.notify()
        return _SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        with self._cond:
            self._flush_requested += 1
            self._cond.notify()
            while self._queue and time.monotonic() < deadline:
                self._cond.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            return not self._queue

    def shutdown(self, timeout_millis: int = 30_000) -> None:
        self.force_flush(timeout_millis)
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(max(0.1, timeout_millis / 1000))
        if self._shutdown_exporter is not None:
            try:
                self._shutdown_exporter()
            except Exception as exc:
                logger.warning("shutting down the OTLP exporter: %r", exc)

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    # -- the worker --------------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._stopping and len(self._queue) < self.max_batch and not self._flush_requested:
                    self._cond.wait(self.schedule_delay_s + self._backoff_s)
                if self._stopping and (not self._queue or self._backoff_s):
                    return  # what is still unexported stays unacknowledged: its offsets are not committed
                self._flush_requested = 0
                batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
            if not batch:
                continue
            ok = self._try_export([item for item, _ in batch])
            if ok:
                self._backoff_s = 0.0
                self.exported += len(batch)
                for _, ticket in batch:
                    if ticket is not None:
                        ticket.done()
            else:
                with self._cond:
                    self._queue.extendleft(reversed(batch))  # kept, in order, for the next attempt
                self._backoff_s = min(self.max_backoff_s, max(0.5, self._backoff_s * 2))
            with self._cond:
                self._cond.notify_all()

    def _try_export(self, items: list[Any]) -> bool:
        error: Exception | None = None
        try:
            result = self._export(items)
        except Exception as exc:  # an exporter should return FAILURE; one that raises is treated the same
            result, error = None, exc
        if result is not None and getattr(result, "name", str(result)) == "SUCCESS":
            return True
        self.failures += 1
        if self.on_error is not None:
            self.on_error()
        self._log.warning(
            "OTLP export of %d evaluation items failed (%s); retrying, their offsets stay uncommitted until it "
            "succeeds: check --otlp-endpoint and the collector",
            len(items),
            error if error is not None else result,
        )
        return False
