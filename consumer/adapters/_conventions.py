"""Which instrumentation convention wrote a span, whether it is a model call or an agent run (a turn even without
text) or a step inside one, and what a user sets when such a span carries no text.

A span "looks like LLM instrumentation" when one convention's own marker says it is a model call or an agent run.
Without text it is still a turn (so its conversation ends `failed`/`empty_conversation`, never in silence), and it
is counted and logged with the hint below (consumer/conversation/textless.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tracejudge.tracer.semconv import GEN_AI_OPERATION_NAME

from ..decode import DecodedSpan
from . import langfuse, mlflow, vercel_ai
from ._kinds import STEP_OPERATIONS

_GENAI_CALLS = frozenset({"chat", "text_completion", "generate_content", "invoke_agent"})
_GENAI_MARKERS = ("gen_ai.system", "gen_ai.provider.name", "gen_ai.request.model")
_MODEL_MARKER = "gen_ai.request.model"
# Model operations without a conversation's text (OpenLIT's and Spring AI's names among them): never a text-less turn.
_NOT_TEXT_CALLS = frozenset({"embedding", "embeddings", "image", "audio", "speech", "transcription", "moderation"})
_AGENTO11Y_MARKERS = ("agento11y.sdk.name", "agento11y.generation.id")
_OPENINFERENCE_CALLS = frozenset({"LLM", "AGENT"})
_OPENLLMETRY_CALLS = frozenset({"chat", "completion"})
_ADK_SCOPE = "gcp.vertex.agent"
_STRANDS_SCOPE = "strands"
# Every attribute key and scope-name prefix `model_call` reads: a record holding none of them has no model call
# (consumer/adapters/__init__.py's RECORD_MARKERS must cover each; tests/consumer/test_read_events_golden.py checks).
MARKERS: tuple[str, ...] = (
    GEN_AI_OPERATION_NAME,
    *_GENAI_MARKERS,
    _ADK_SCOPE,
    _STRANDS_SCOPE,
    vercel_ai.OPERATION_ID,
    langfuse.OBSERVATION_TYPE,
    mlflow.SPAN_TYPE,
    "openinference.span.kind",
    "llm.request.type",
)


@dataclass(frozen=True, slots=True)
class Convention:
    name: str
    hint: str  # what to set so the text reaches the spans


ADK = Convention(
    "google_adk",
    "ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS=true (the default; false keeps text off), or "
    "OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental with "
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY",
)
STRANDS = Convention(
    "strands",
    "nothing for Strands' default conventions (text is on span events); with "
    "OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental the text is on the same events",
)
VERCEL_AI = Convention(
    "vercel_ai",
    "experimental_telemetry: { isEnabled: true, recordInputs: true, recordOutputs: true } (ai 7: telemetry: {...} "
    "with LegacyOpenTelemetry or OpenTelemetry from @ai-sdk/otel)",
)
LANGFUSE = Convention(
    "langfuse",
    "capture_input/capture_output left on (@observe, LANGFUSE_OBSERVE_DECORATOR_IO_CAPTURE_ENABLED=true) and no "
    "mask= that blanks the text; generations need input=/output= (langfuse.openai sets them)",
)
MLFLOW = Convention(
    "mlflow",
    "span inputs and outputs (mlflow.<flavor>.autolog(), @mlflow.trace, or span.set_inputs()/set_outputs())",
)
OPENINFERENCE = Convention(
    "openinference",
    "OPENINFERENCE_HIDE_INPUTS, OPENINFERENCE_HIDE_OUTPUTS, OPENINFERENCE_HIDE_INPUT_MESSAGES and "
    "OPENINFERENCE_HIDE_OUTPUT_MESSAGES unset or false (TraceConfig(hide_inputs=False, ...))",
)
AGENTO11Y = Convention(
    "agento11y",
    "AGENTO11Y_USE_EXPERIMENTAL_OTEL=true (ClientConfig(use_experimental_otel=True)): by default the SDK sends "
    "the messages to its own ingest endpoint and writes none on spans",
)
OPENLLMETRY = Convention("openllmetry", "TRACELOOP_TRACE_CONTENT=true (Traceloop.init(trace_content=True))")
GENAI = Convention(
    "genai",
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=span_only with "
    "OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental (=true for instrumentations on older conventions); "
    "event_only content goes to log records, which tracejudge does not read",
)


def _text(attributes: dict[str, Any], key: str) -> str | None:
    value = attributes.get(key)
    return value if isinstance(value, str) else None


def model_call(span: DecodedSpan) -> Convention | None:
    """The convention that marks this span a model call or an agent run, or None."""
    attributes = span.attributes
    operation = _text(attributes, GEN_AI_OPERATION_NAME)
    system = _text(attributes, "gen_ai.system") or _text(attributes, "gen_ai.provider.name")
    if system == _ADK_SCOPE or span.scope.startswith(_ADK_SCOPE):
        return ADK if operation in _GENAI_CALLS or span.name == "call_llm" else None
    if system == "strands-agents" or span.scope.startswith(_STRANDS_SCOPE):
        return STRANDS if operation in _GENAI_CALLS or span.name == "chat" else None
    if _text(attributes, vercel_ai.OPERATION_ID) in vercel_ai.MODEL_CALLS:
        return VERCEL_AI
    if _text(attributes, langfuse.OBSERVATION_TYPE) in langfuse.MODEL_CALLS | langfuse.AGENTS:
        return LANGFUSE
    if mlflow.span_type(span) in mlflow.MODEL_CALLS | mlflow.AGENTS:
        return MLFLOW
    if _text(attributes, "openinference.span.kind") in _OPENINFERENCE_CALLS:
        return OPENINFERENCE
    if _text(attributes, "llm.request.type") in _OPENLLMETRY_CALLS:
        return OPENLLMETRY
    if operation in _GENAI_CALLS or (operation is None and any(k in attributes for k in _GENAI_MARKERS)):
        return AGENTO11Y if any(k in attributes for k in _AGENTO11Y_MARKERS) else GENAI
    # Any other operation name (a vendor's own, e.g. agento11y's `generateText`/`streamText`) on a span that names the
    # model it asked is a model call too, unless the name says it is a step (a tool run, an embedding) or another
    # convention says what the span is (OpenLLMetry's `execute_task` chains name their provider, never a model).
    if (
        operation not in STEP_OPERATIONS
        and operation not in _NOT_TEXT_CALLS
        and _MODEL_MARKER in attributes
        and "traceloop.span.kind" not in attributes
        and "openinference.span.kind" not in attributes
    ):
        return AGENTO11Y if any(k in attributes for k in _AGENTO11Y_MARKERS) else GENAI
    return None


def is_step(span: DecodedSpan) -> bool:
    """A tool run, retrieval or embedding in these conventions: part of a turn, never a turn of its own."""
    attributes = span.attributes
    return (
        _text(attributes, vercel_ai.OPERATION_ID) in vercel_ai.STEPS
        or _text(attributes, langfuse.OBSERVATION_TYPE) in langfuse.STEPS
        or mlflow.span_type(span) in mlflow.STEPS
    )


MAX_PRESENT = 12  # attribute names listed in the what-to-set log line


def present(span: DecodedSpan) -> list[str]:
    """The attribute names a text-less model-call span had (names only: values may be private)."""
    return sorted(span.attributes)[:MAX_PRESENT]
