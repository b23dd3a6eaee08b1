"""A batch span processor that owns its bounded queue, so every span it drops is counted on every supported SDK.

The SDK's BatchSpanProcessor keeps its queue and drop count in private fields that changed between releases (none
readable before 1.34), so a subclass cannot count its drops. This one follows the same design and settings
(OTEL_BSP_* environment variables): the application's thread only appends to a bounded queue; one worker thread
batches and exports; force_flush and shutdown are bounded by a deadline; whatever is not exported is counted.
"""

from __future__ import annotations

import collections
import inspect
import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.sdk.environment_variables import (
    OTEL_BSP_EXPORT_TIMEOUT,
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    OTEL_BSP_MAX_QUEUE_SIZE,
    OTEL_BSP_SCHEDULE_DELAY,
)
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter

from tracejudge._shared.rate_limited_log import RateLimitedLog

from .exporter import ExporterStats

logger = logging.getLogger("tracejudge.tracer.batch")

# The key the SDK's own processors set so that instrumented clients used by an exporter do not trace the export.
_SUPPRESS_INSTRUMENTATION_KEY = getattr(otel_context, "_SUPPRESS_INSTRUMENTATION_KEY", "suppress_instrumentation")


def _env_number(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        logger.warning("tracejudge: %s is not a number; using %s", name, default)
        return default
    return value if value > 0 else default


class BoundedBatchSpanProcessor(SpanProcessor):
    """Batches finished spans to `exporter` from one worker thread; a full queue drops the new span and counts it.

    Counts go to `stats` (`queue_full_drops` and `spans_dropped`) and to the processor's own `queue_full_drops` and
    `spans_dropped` (spans still queued when shutdown's deadline passed, or whose export raised).
    """

    def __init__(
        self,
        exporter: SpanExporter,
        max_queue_size: int | None = None,
        schedule_delay_millis: float | None = None,
        max_export_batch_size: int | None = None,
        export_timeout_millis: float | None = None,
        *,
        stats: ExporterStats | None = None,
    ) -> None:
        self.span_exporter = exporter
        self.stats = stats
        self.max_queue_size = int(max_queue_size or _env_number(OTEL_BSP_MAX_QUEUE_SIZE, 2048))
        self.schedule_delay_s = (schedule_delay_millis or _env_number(OTEL_BSP_SCHEDULE_DELAY, 5000)) / 1000
        batch = int(max_export_batch_size or _env_number(OTEL_BSP_MAX_EXPORT_BATCH_SIZE, 512))
        self.max_export_batch_size = min(batch, self.max_queue_size)
        self.export_timeout_s = (export_timeout_millis or _env_number(OTEL_BSP_EXPORT_TIMEOUT, 30_000)) / 1000
        self.queue_full_drops = 0
        self.spans_dropped = 0
        self._drop_log = RateLimitedLog(logger)
        self._shutdown = False
        self._init_state()
        # A forked child (gunicorn, multiprocessing) gets fresh locks, an empty queue (the parent exports its own
        # spans) and its own worker, as the SDK's processor does; a processor already shut down stays shut down.
        reference = weakref.WeakMethod(self._init_state)
        os.register_at_fork(after_in_child=lambda: (method := reference()) and method())

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._export_lock = threading.Lock()
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._wake = threading.Event()
        self._worker = threading.Thread(target=self._run, name="tracejudge-BatchSpanProcessor", daemon=True)
        if not self._shutdown:
            self._worker.start()

    # -- the application's thread -----------------------------------------------------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if not (span.context and span.context.trace_flags.sampled):
            return
        wake = late = full = False
        with self._lock:
            if self._shutdown:  # read under the lock shutdown sets it with: each span is queued before, or counted
                late = True
                self.spans_dropped += 1
            elif len(self._queue) >= self.max_queue_size:
                full = True
                self.queue_full_drops += 1
                self.spans_dropped += 1
            else:
                self._queue.append(span)
                wake = len(self._queue) >= self.max_export_batch_size
        if wake:
            self._wake.set()
        elif full:
            if self.stats is not None:
                self.stats.add(queue_full_drops=1, spans_dropped=1)
            self._drop_log.warning(
                "tracejudge: span queue full (%d); dropped a span (%d so far)",
                self.max_queue_size,
                self.queue_full_drops,
            )
        elif late:
            if self.stats is not None:
                self.stats.add(spans_dropped=1)
            self._drop_log.warning("tracejudge: span ended after the processor shut down; dropped")

    @property
    def queued(self) -> int:
        """Spans waiting for export now (at most max_queue_size)."""
        return len(self._queue)

    # -- the worker thread ------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._shutdown:
            self._wake.wait(self.schedule_delay_s)
            self._wake.clear()
            if self._shutdown:
                break
            try:
                self._drain(None)
            except Exception:  # never let the worker die: a dead worker would turn every later span into a drop
                logger.exception("tracejudge: span export worker error")

    def _drain(self, deadline: float | None) -> bool:
        """Export everything queued, a batch at a time; False if the deadline passed first.

        Popping and exporting happen under one lock, so a flush also waits for the batch the worker has in flight.
        """
        while True:
            if deadline is None:
                self._export_lock.acquire()
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._export_lock.acquire(timeout=remaining):
                    with self._lock:
                        return not self._queue
            try:
                with self._lock:
                    if not self._queue:
                        return True
                    count = min(self.max_export_batch_size, len(self._queue))
                    batch = [self._queue.popleft() for _ in range(count)]
                self._export(batch)
            finally:
                self._export_lock.release()

    def _export(self, batch: Sequence[ReadableSpan]) -> None:
        token = otel_context.attach(otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            self.span_exporter.export(batch)
        except Exception as exc:  # an exporter must not raise; if one does, its spans are counted, not lost quietly
            self._count_dropped(len(batch), export_failures=1)
            self._drop_log.warning("tracejudge: span exporter raised %r; dropped %d span(s)", exc, len(batch))
        finally:
            otel_context.detach(token)

    def _count_dropped(self, count: int, **extra: int) -> None:
        with self._lock:
            self.spans_dropped += count
        if self.stats is not None:
            self.stats.add(spans_dropped=count, **extra)

    # -- flush and shutdown -----------------------------------------------------------------------------------------

    def force_flush(self, timeout_millis: int | None = None) -> bool:
        """Export what is queued now, on the caller's thread, within the timeout (default: the export timeout)."""
        if self._shutdown:
            return False
        timeout_s = self.export_timeout_s if timeout_millis is None else timeout_millis / 1000
        deadline = time.monotonic() + timeout_s
        drained = self._drain(deadline)
        remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
        try:
            flushed = self.span_exporter.force_flush(remaining_ms)
        except Exception:
            return False
        return drained and flushed is not False  # the SDK's base exporter answers None

    def shutdown(self) -> None:
        """Export what is queued within the export timeout; count what is left; then shut the exporter down."""
        with self._lock:  # once, even when called from several threads; on_end reads the flag under this lock
            if self._shutdown:
                return
            self._shutdown = True
        self._wake.set()
        deadline = time.monotonic() + self.export_timeout_s
        if threading.current_thread() is not self._worker:
            self._worker.join(max(0.0, deadline - time.monotonic()))
        self._drain(deadline)  # gives up at the deadline, even while a stuck export holds the lock
        with self._lock:
            left = len(self._queue)
            self._queue.clear()
        if left:
            self._count_dropped(left)
            logger.warning("tracejudge: shutdown deadline passed; dropped %d queued span(s)", left)
        try:
            shutdown = self.span_exporter.shutdown
            if "timeout_millis" in inspect.signature(shutdown).parameters:  # exporters that accept a deadline get it
                shutdown(timeout_millis=max(0, int((deadline - time.monotonic()) * 1000)))  # type: ignore[call-arg]
            else:
                shutdown()
        except Exception:  # shutdown runs at exit too: it must not raise into the application
            logger.exception("tracejudge: span exporter shutdown failed")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.span_exporter!r}, max_queue_size={self.max_queue_size})"
