"""OpenLLMetry (Traceloop): `gen_ai.prompt.N.*`/`gen_ai.completion.N.*` (before 0.55; later releases write
`gen_ai.input.messages`, read by the GenAI reader) first, `traceloop.entity.input`/`output` bodies as a fallback."""

from __future__ import annotations

from ..decode import DecodedSpan
from ._base import indexed_messages
from ._text import answer_text, exchange_input, input_from_body, output_from_body

Content = tuple[str | None, str | None]
SPAN_KIND = "traceloop.span.kind"


def messages(span: DecodedSpan) -> Content:
    attributes = span.attributes
    return (
        exchange_input(indexed_messages(attributes, "gen_ai.prompt.", "role", "content")),
        answer_text(indexed_messages(attributes, "gen_ai.completion.", "role", "content")),
    )


def bodies(span: DecodedSpan) -> Content:
    attributes = span.attributes
    return (
        input_from_body(attributes.get("traceloop.entity.input")),
        output_from_body(attributes.get("traceloop.entity.output")),
    )
