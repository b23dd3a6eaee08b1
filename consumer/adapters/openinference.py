"""OpenInference (Arize Phoenix): `llm.input_messages.N.message.*` (also `message.contents.M.message_content.text`)
first, `input.value`/`output.value` bodies only when no messages exist."""

from __future__ import annotations

from ..decode import DecodedSpan
from ._base import indexed_messages
from ._text import answer_text, exchange_input, input_from_body, output_from_body

Content = tuple[str | None, str | None]
SPAN_KIND = "openinference.span.kind"


def messages(span: DecodedSpan) -> Content:
    attributes = span.attributes
    return (
        exchange_input(indexed_messages(attributes, "llm.input_messages.", "message.role", "message.content")),
        answer_text(indexed_messages(attributes, "llm.output_messages.", "message.role", "message.content")),
    )


def bodies(span: DecodedSpan) -> Content:
    attributes = span.attributes
    return input_from_body(attributes.get("input.value")), output_from_body(attributes.get("output.value"))
