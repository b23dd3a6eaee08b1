"""A batch span processor that owns its bounded queue, so every span it drops is counted on every supported SDK.

The SDK's BatchSpanProcessor keeps its queue and drop count in private fields that changed between releases (none
readable before 1.34), so a subclass cannot count its drops. This one follows the same design and settings
(OTEL_BSP_* environment variables) on the shared bounded worker: the application's thread only appends to a bounded
queue; one worker thread batches and exports; force_flush and shutdown are bounded by a deadline; whatever is not
exported is counted. Its policy: no retry (a failed export is the exporter's to count), an exporter that raises has
its spans counted dropped, exports are not traced themselves.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time

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

from tracejudge._shared.bounded_worker import FULL, UNHANDLED, BoundedWorker
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
        self._raised = 0  # spans whose export raised (counted on the worker thread only)
        self._drop_log = RateLimitedLog(logger)
        self._shutdown_once = threading.Lock()  # held for good by the first shutdown (a forked child's copy too)
        # A forked child gets its own empty queue and worker (the parent exports its own spans), as with the SDK's.
        self._worker: BoundedWorker[ReadableSpan] = BoundedWorker(
            self._export,
            name="tracejudge-BatchSpanProcessor",
            max_queue=self.max_queue_size,
            max_batch=self.max_export_batch_size,
            linger_s=self.schedule_delay_s,
            on_drop=self._dropped,
        )

    @property
    def queue_full_drops(self) -> int:
        return self._worker.drops[FULL]

    @property
    def spans_dropped(self) -> int:
        return self._worker.dropped + self._raised

    @property
    def queued(self) -> int:
        """Spans waiting for export now (at most max_queue_size)."""
        return self._worker.pending

    # -- the application's thread -----------------------------------------------------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if span.context and span.context.trace_flags.sampled:
            self._worker.put(span)  # never blocks; a drop is counted (`_dropped`)

    def _dropped(self, count: int, reason: str) -> None:
        if self.stats is not None:
            self.stats.add(spans_dropped=count, **({"queue_full_drops": count} if reason == FULL else {}))
        if reason == FULL:
            self._drop_log.warning(
                "tracejudge: span queue full (%d); dropped a span (%d so far)",
                self.max_queue_size,
                self.queue_full_drops,
            )
        elif reason == UNHANDLED:
            logger.warning("tracejudge: shutdown deadline passed; dropped %d queued span(s)", count)
        else:
            self._drop_log.warning("tracejudge: span ended after the processor shut down; dropped")

    # -- the worker thread ------------------------------------------------------------------------------------------

    def _export(self, batch: list[ReadableSpan]) -> None:
        token = otel_context.attach(otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            self.span_exporter.export(batch)
        except Exception as exc:  # an exporter must not raise; if one does, its spans are counted, not lost quietly
            self._raised += len(batch)
            if self.stats is not None:
                self.stats.add(spans_dropped=len(batch), export_failures=1)
            self._drop_log.warning("tracejudge: span exporter raised %r; dropped %d span(s)", exc, len(batch))
        finally:
            otel_context.detach(token)

    # -- flush and shutdown -----------------------------------------------------------------------------------------

    def force_flush(self, timeout_millis: int | None = None) -> bool:
        """Export what is queued now (the worker does), within the timeout (default: the export timeout)."""
        if self._worker.closed:
            return False
        timeout_s = self.export_timeout_s if timeout_millis is None else timeout_millis / 1000
        deadline = time.monotonic() + timeout_s
        drained = self._worker.flush(timeout_s)
        remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
        try:
            flushed = self.span_exporter.force_flush(remaining_ms)
        except Exception:
            return False
        return drained and flushed is not False  # the SDK's base exporter answers None

    def shutdown(self) -> None:
        """Export what is queued within the export timeout; count what is left; then shut the exporter down."""
        if not self._shutdown_once.acquire(blocking=False):  # once, even when called from several threads
            return
        deadline = time.monotonic() + self.export_timeout_s
        self._worker.close(self.export_timeout_s)  # gives up at the deadline, even while an export is stuck
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
