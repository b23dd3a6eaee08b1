"""OpenTelemetry GenAI conventions: `gen_ai.input.messages`/`gen_ai.output.messages` (attributes or span events),
end markers and feedback (ours), and the agent-level bodies of frameworks that keep their text elsewhere."""

from __future__ import annotations

from typing import Any

from tracejudge.tracer.semconv import (
    CONVERSATION_ENDED,
    FEEDBACK_COMMENT,
    FEEDBACK_LABEL,
    FEEDBACK_SCORE,
    GEN_AI_INPUT_MESSAGES,
    GEN_AI_OUTPUT_MESSAGES,
)

from ..decode import DecodedSpan
from ._base import Feedback, as_text
from ._text import NOT_JSON, answer_text, exchange_input, load_json, output_from_body

Content = tuple[str | None, str | None]

_DETAILS_EVENTS = frozenset({"gen_ai.client.inference.operation.details", "gen_ai.client.agent.invoke.details"})


def feedback(span: DecodedSpan) -> Feedback | None:
    attributes = span.attributes
    if FEEDBACK_SCORE not in attributes and FEEDBACK_LABEL not in attributes:
        return None
    score = attributes.get(FEEDBACK_SCORE)
    return Feedback(
        score=float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None,
        label=as_text(attributes.get(FEEDBACK_LABEL)),
        comment=as_text(attributes.get(FEEDBACK_COMMENT)),
        span_id=span.span_id,
    )


def ended(span: DecodedSpan) -> bool:
    return span.attributes.get(CONVERSATION_ENDED) is True


def _messages(value: Any) -> Any:
    """Messages as the instrumentation wrote them: a JSON string on spans, a list of maps on events."""
    data = load_json(value)
    if data is NOT_JSON:
        return [{"role": None, "content": value}] if isinstance(value, str) else None
    return data


def messages(span: DecodedSpan) -> Content:
    attributes = span.attributes
    return (
        exchange_input(_messages(attributes.get(GEN_AI_INPUT_MESSAGES))),
        answer_text(_messages(attributes.get(GEN_AI_OUTPUT_MESSAGES))),
    )


def _event_message(name: str, attributes: dict[str, Any]) -> dict[str, Any] | None:
    """One `gen_ai.{role}.message` / `gen_ai.choice` span event as a message (content in `content`, `message`
    or `gen_ai.event.content`, as the instrumentations of each semantic-conventions release wrote it)."""
    role = "assistant" if name == "gen_ai.choice" else name[len("gen_ai.") : -len(".message")]
    for key in ("gen_ai.event.content", "message", "content"):
        if key not in attributes:
            continue
        value = load_json(attributes[key]) if key != "content" else attributes[key]
        if value is NOT_JSON:
            value = attributes[key]
        if isinstance(value, dict):
            message = value.get("message")
            inner = message if isinstance(message, dict) else value
            return {"role": inner.get("role") or role, **{k: v for k, v in inner.items() if k != "role"}}
        return {"role": role, "content": value}
    return None


def events(span: DecodedSpan) -> Content:
    """Content a library put on span events instead of attributes."""
    inputs: list[Any] = []
    outputs: list[Any] = []
    for event in span.events:
        name, attributes = event.name, event.attributes
        if name in _DETAILS_EVENTS:
            found_in = _messages(attributes.get(GEN_AI_INPUT_MESSAGES))
            found_out = _messages(attributes.get(GEN_AI_OUTPUT_MESSAGES))
            inputs.extend(found_in if isinstance(found_in, list) else [])
            outputs.extend(found_out if isinstance(found_out, list) else [])
        elif name == "gen_ai.content.prompt":  # semantic conventions before 1.28
            found = _messages(attributes.get("gen_ai.prompt"))
            inputs.extend(found if isinstance(found, list) else [])
        elif name == "gen_ai.content.completion":
            found = _messages(attributes.get("gen_ai.completion"))
            outputs.extend(found if isinstance(found, list) else [])
        elif name == "gen_ai.choice" or (name.startswith("gen_ai.") and name.endswith(".message")):
            message = _event_message(name, attributes)
            if message is not None:
                (outputs if name == "gen_ai.choice" else inputs).append(message)
    return (exchange_input(inputs) if inputs else None, answer_text(outputs) if outputs else None)


def agent_bodies(span: DecodedSpan) -> Content:
    """pydantic-ai's agent run span: `pydantic_ai.all_messages` (the history and this run) and `final_result`."""
    attributes = span.attributes
    history = _messages(attributes.get("pydantic_ai.all_messages"))
    user = None
    if isinstance(history, list):
        # The run's own messages end the history: the question is what came after the previous answer.
        last_assistant = max(
            (i for i, m in enumerate(history) if isinstance(m, dict) and m.get("role") in ("assistant", "model")),
            default=None,
        )
        user = exchange_input(history[:last_assistant] if last_assistant is not None else history)
    answer = output_from_body(attributes["final_result"]) if "final_result" in attributes else None
    return user, answer
