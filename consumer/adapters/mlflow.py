"""MLflow 3 tracing (`mlflow`, `mlflow-tracing`): `mlflow.spanInputs`/`mlflow.spanOutputs` (JSON of the call's
inputs and outputs: for autologged OpenAI calls the request kwargs and the ChatCompletion), `mlflow.chat.messages`
(the full chat, input and output messages, from MLflow 2.x chat spans) and `mlflow.spanType` (a JSON string:
"CHAT_MODEL", "LLM", "AGENT", "CHAIN", "TOOL", "RETRIEVER", ...). MLflow keeps its session (`mlflow.trace.session`)
in trace metadata that its OTLP export does not put on spans: the conversation id comes from the shared provider's
stamping (`tracejudge.tracer.conversation`) or an attribute the app sets."""

from __future__ import annotations

from typing import Any

from ..decode import DecodedSpan
from ._text import answer_text, exchange_input, input_from_body, load_json, loads, output_from_body

Content = tuple[str | None, str | None]
SPAN_TYPE = "mlflow.spanType"
INPUTS = "mlflow.spanInputs"
OUTPUTS = "mlflow.spanOutputs"
CHAT_MESSAGES = "mlflow.chat.messages"
MODEL_CALLS = frozenset({"CHAT_MODEL", "LLM"})
AGENTS = frozenset({"AGENT"})
STEPS = frozenset({"TOOL", "RETRIEVER", "EMBEDDING", "RERANKER", "PARSER", "MEMORY", "GUARDRAIL", "EVALUATOR"})


def span_type(span: DecodedSpan) -> str | None:
    """MLflow writes every attribute value as JSON, so the type is `"CHAT_MODEL"` with its quotes."""
    value = span.attributes.get(SPAN_TYPE)
    if not isinstance(value, str):
        return None
    try:
        decoded: Any = loads(value)
    except ValueError:
        decoded = value
    return decoded if isinstance(decoded, str) else None


def messages(span: DecodedSpan) -> Content:
    """`mlflow.chat.messages`: the input messages and the answer in one list; the answer is what follows the
    question. A model call's span inputs and outputs are messages too."""
    chat = load_json(span.attributes.get(CHAT_MESSAGES))
    if isinstance(chat, list) and chat:
        last = chat[-1]
        ends_with_answer = isinstance(last, dict) and last.get("role") == "assistant"
        asked = chat[:-1] if ends_with_answer else chat
        return exchange_input(asked), answer_text([last]) if ends_with_answer else None
    if span_type(span) in MODEL_CALLS:
        return bodies(span)
    return None, None


def bodies(span: DecodedSpan) -> Content:
    attributes = span.attributes
    return input_from_body(attributes.get(INPUTS)), output_from_body(attributes.get(OUTPUTS))
