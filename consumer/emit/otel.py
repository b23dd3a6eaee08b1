"""Verdicts as OpenTelemetry: an `evaluate {metric}` span inside the judged trace and a gen_ai.evaluation.result event.

The span's parent is the conversation's last turn span (a remote parent from its trace and span ids), so trace
backends show the verdict inside the trace it judged.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from opentelemetry import trace
from opentelemetry._logs import LoggerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TracerProvider

from tracejudge.metrics import MetricResult
from tracejudge.tracer.semconv import ERROR_TYPE, GEN_AI_AGENT_NAME, GEN_AI_CONVERSATION_ID

from ..pool import Judgement
from ..results import result_id
from .acknowledged import Ticket, ticket_for

EVALUATION_EVENT = "gen_ai.evaluation.result"
SCOPE = "tracejudge.consumer"


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
        per_result = 1 + (self.logger is not None)
        ticket = Ticket(len(judgement.results) * per_result)
        with ticket_for(ticket):
            self._emit(judgement)
        return [ticket.event] if self.acknowledged else None

    def _emit(self, judgement: Judgement) -> None:
        job = judgement.job
        parent = _parent_context(job.last_turn.trace_id, job.last_turn.span_id)
        end_ns = int(judgement.judged_at * 1e9)
        for result in judgement.results:
            attributes = evaluation_attributes(judgement, result)
            span_attributes = {
                **attributes,
                "tracejudge.evaluation.evidence": list(result.evidence),
                "tracejudge.evaluation.passed": result.success,
                "tracejudge.evaluation.threshold": result.threshold,
                "tracejudge.evaluation.model": result.model,
                "tracejudge.evaluation.id": result_id(job.conversation_id, result.name, job.content_id),
                "tracejudge.evaluation.version": job.version,
            }
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
