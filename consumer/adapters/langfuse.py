"""Langfuse Python SDK (v3 and later, OpenTelemetry based): `langfuse.observation.input`/`output`, JSON of whatever
the observation was given: a generation's message list and reply (`langfuse.openai`, `start_observation(as_type=
"generation")`), an `@observe`d function's `{"args": [...], "kwargs": {...}}` and its return value. The type is in
`langfuse.observation.type` (generation, agent, tool, chain, retriever, embedding, evaluator, guardrail, span, event);
the session is `session.id` (`propagate_attributes(session_id=...)`, `langfuse.session.id` before v3.3), read by the
identity resolver."""

from __future__ import annotations

from ..decode import DecodedSpan
from ._text import input_from_body, output_from_body

Content = tuple[str | None, str | None]
OBSERVATION_TYPE = "langfuse.observation.type"
INPUT = "langfuse.observation.input"
OUTPUT = "langfuse.observation.output"
MODEL_CALLS = frozenset({"generation"})
AGENTS = frozenset({"agent"})
STEPS = frozenset({"tool", "retriever", "embedding", "evaluator", "guardrail", "event"})


def _observed(span: DecodedSpan) -> Content:
    attributes = span.attributes
    return input_from_body(attributes.get(INPUT)), output_from_body(attributes.get(OUTPUT))


def messages(span: DecodedSpan) -> Content:
    """A generation's input and output are the messages the model saw and said."""
    if span.attributes.get(OBSERVATION_TYPE) not in MODEL_CALLS:
        return None, None
    return _observed(span)


def bodies(span: DecodedSpan) -> Content:
    """Any other observation's input and output: a function's arguments and return value, as a fallback."""
    if span.attributes.get(OBSERVATION_TYPE) in MODEL_CALLS:
        return None, None
    return _observed(span)
