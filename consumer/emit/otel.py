"""Verdicts as OpenTelemetry: an `evaluate {metric}` span inside the judged trace and a gen_ai.evaluation.result event.

The span's parent is the conversation's last turn span (a remote parent from its trace and span ids), so trace
backends show the verdict inside the trace it judged.

The SDK's batch processors export in the background and an OTLP exporter reports a failed export by returning
FAILURE, never by raising, so an unreachable collector would go unnoticed: `CountedSpanExporter` and
`CountedLogExporter` count each failed batch (`tracejudge_output_errors_total{output="otlp"}`) and say so in a
rate-limited line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry._logs import LoggerProvider
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TracerProvider

from tracejudge._shared.rate_limited_log import RateLimitedLog
from tracejudge.metrics import MetricResult
from tracejudge.tracer.semconv import ERROR_TYPE, GEN_AI_AGENT_NAME, GEN_AI_CONVERSATION_ID

from ..judging.judgement import OUTCOME_RETRYING, Judgement
from ..judging.results import key_of, result_id
from .acknowledged import Ticket, ticket_for

EVALUATION_EVENT = "gen_ai.evaluation.result"
OPERATION_EVALUATION = "evaluation"  # gen_ai.operation.name of the evaluation span: the judge's call is the operation
SCOPE = "tracejudge.consumer"
OUTPUT = "otlp"  # the `output` label of tracejudge_output_errors_total
logger = logging.getLogger("tracejudge.consumer.otlp")


class _FailureCounter:
    """Calls `on_error()` once per failed export and logs it at most every 30 s (with a suppressed count)."""

    def __init__(self, what: str, endpoint: str, on_error: Callable[[], None] | None) -> None:
        self.what, self.endpoint, self.on_error = what, endpoint, on_error
        self._log = RateLimitedLog(logger, interval_s=30.0)

    def failed(self, items: int, error: BaseException | None = None) -> None:
        if self.on_error is not None:
            try:
                self.on_error()
            except Exception:
                logger.exception("counting an OTLP export error failed")
        cause = f": {error!r}" if error is not None else ""
        self._log.warning(
            'OTLP export of %d %s to %s failed%s (counted in tracejudge_output_errors_total{output="otlp"}; the '
            "batch is dropped): check --otlp-endpoint / OTEL_EXPORTER_OTLP_ENDPOINT and that the collector is up",
            items,
            self.what,
            self.endpoint,
            cause,
        )


class CountedSpanExporter(SpanExporter):
    def __init__(self, inner: SpanExporter, endpoint: str, on_error: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self._failures = _FailureCounter("evaluation spans", endpoint, on_error)

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # not the SDK's contract, but a batch processor must never die of it
            self._failures.failed(len(spans), exc)
            return SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._failures.failed(len(spans))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class CountedLogExporter(LogRecordExporter):
    def __init__(self, inner: LogRecordExporter, endpoint: str, on_error: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self._failures = _FailureCounter("evaluation events", endpoint, on_error)

    def export(self, batch: Sequence[Any]) -> LogRecordExportResult:
        try:
            result = self.inner.export(batch)
        except Exception as exc:
            self._failures.failed(len(batch), exc)
            return LogRecordExportResult.FAILURE
        if getattr(result, "name", None) != "SUCCESS":  # LogRecordExportResult, or the deprecated LogExportResult
            self._failures.failed(len(batch))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _parent_context(trace_id: str, span_id: str) -> Any:
    try:
        context = SpanContext(
            trace_id=int(trace_id, 16),
            span_id=int(span_id, 16),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
    except ValueError:
        return None
    if not context.is_valid:
        return None
    return trace.set_span_in_context(NonRecordingSpan(context))


def evaluation_attributes(judgement: Judgement, result: MetricResult) -> dict[str, Any]:
    """The semantic conventions' gen_ai.evaluation.* attributes, shared by the span and the event."""
    job = judgement.job
    attributes: dict[str, Any] = {
        "gen_ai.evaluation.name": result.name,
        GEN_AI_CONVERSATION_ID: job.conversation_id,
        GEN_AI_AGENT_NAME: job.agent,
        "gen_ai.evaluation.explanation": result.reason,
    }
    if result.rubric_version is not None:
        attributes["tracejudge.evaluation.rubric_version"] = result.rubric_version
    if result.score is not None:
        attributes["gen_ai.evaluation.score.value"] = result.score
    if result.verdict is not None:
        attributes["gen_ai.evaluation.score.label"] = result.verdict
    if result.failure_mode is not None:
        attributes["tracejudge.evaluation.failure_mode"] = result.failure_mode
    return attributes


class EvaluationEmitter:
    """`acknowledged`: the providers' processors are AcknowledgingProcessors, so `emit` returns the event set once
    the exporter delivered the judgement's spans and events (its offset waits for it)."""

    def __init__(
        self,
        tracer_provider: TracerProvider,
        logger_provider: LoggerProvider | None = None,
        *,
        acknowledged: bool = False,
    ) -> None:
        self.tracer = tracer_provider.get_tracer(SCOPE)
        self.logger = logger_provider.get_logger(SCOPE) if logger_provider is not None else None
        self.acknowledged = acknowledged

    def emit(self, judgement: Judgement) -> list[threading.Event] | None:
        if judgement.outcome == OUTCOME_RETRYING:
            return None  # not an evaluation yet: its final attempt's results are emitted
        per_result = 1 + (self.logger is not None)
        ticket = Ticket(len(judgement.results) * per_result)
        with ticket_for(ticket):
            self._emit(judgement)
        return [ticket.event] if self.acknowledged else None

    def _emit(self, judgement: Judgement) -> None:
        job = judgement.job
        parent = _parent_context(job.last_exchange.trace_id, job.last_exchange.span_id)
        end_ns = int(judgement.judged_at * 1e9)
        for result in judgement.results:
            attributes = evaluation_attributes(judgement, result)
            span_attributes = {
                **attributes,
                "gen_ai.operation.name": OPERATION_EVALUATION,
                "tracejudge.evaluation.evidence": list(result.evidence),
                "tracejudge.evaluation.passed": result.success,
                "tracejudge.evaluation.threshold": result.threshold,
                "tracejudge.evaluation.model": result.model,
                "tracejudge.evaluation.id": result_id(job.conversation_id, key_of(result), job.content_id),
                "tracejudge.evaluation.version": job.version,
            }
            if result.model:
                span_attributes["gen_ai.request.model"] = result.model  # the judge's model (the span's operation)
            if result.cost_usd is not None:
                span_attributes["tracejudge.evaluation.cost_usd"] = result.cost_usd
            if result.error is not None:
                span_attributes[ERROR_TYPE] = result.error_kind or "error"
            span = self.tracer.start_span(
                f"evaluate {result.name}",
                context=parent,
                kind=SpanKind.INTERNAL,
                attributes=span_attributes,
                start_time=end_ns - int(result.latency_s * 1e9),
            )
            if result.error is not None:
                span.set_status(Status(StatusCode.ERROR, result.error[:512]))
            span.end(end_time=end_ns)
            if self.logger is not None:
                if result.error is not None:
                    attributes[ERROR_TYPE] = result.error_kind or "error"
                self.logger.emit(
                    timestamp=time.time_ns(),
                    context=parent,
                    event_name=EVALUATION_EVENT,
                    attributes=attributes,
                )
