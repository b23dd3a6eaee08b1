"""The Vercel AI SDK's telemetry (`experimental_telemetry` in ai 4-6, `LegacyOpenTelemetry` in ai 7): the call span
(`ai.generateText`, `ai.streamText`, `ai.generateObject`, ...) has `ai.prompt` (JSON: `{"system", "prompt"}` or
`{"system", "messages"}`) and `ai.response.text`; each model step (`ai.generateText.doGenerate`,
`ai.streamText.doStream`) has `ai.prompt.messages` (JSON list of the messages sent, content as parts) and
`ai.response.text`; tools run in `ai.toolCall` spans. The operation is in `ai.operationId`; the conversation id in
`ai.telemetry.metadata.sessionId` and the agent in `ai.telemetry.functionId` (identity resolver)."""

from __future__ import annotations

from ..decode import DecodedSpan
from ._text import answer_text, exchange_input, input_from_body, load_json, output_from_body

Content = tuple[str | None, str | None]
OPERATION_ID = "ai.operationId"
MODEL_CALLS = frozenset(
    {
        "ai.generateText",
        "ai.streamText",
        "ai.generateObject",
        "ai.streamObject",
        "ai.generateText.doGenerate",
        "ai.streamText.doStream",
        "ai.generateObject.doGenerate",
        "ai.streamObject.doStream",
    }
)
STEPS = frozenset({"ai.toolCall", "ai.embed", "ai.embedMany", "ai.embed.doEmbed", "ai.embedMany.doEmbed", "ai.rerank"})


def messages(span: DecodedSpan) -> Content:
    """A model step: the messages it sent and the text it got back."""
    attributes = span.attributes
    sent = load_json(attributes.get("ai.prompt.messages"))
    if not isinstance(sent, list):
        return None, None
    text = attributes.get("ai.response.text")
    return exchange_input(sent), answer_text([{"role": "assistant", "content": text}]) if text else None


def bodies(span: DecodedSpan) -> Content:
    """The call span: `ai.prompt` and its final text (`ai.response.object` for structured output)."""
    attributes = span.attributes
    answer = attributes.get("ai.response.text") or attributes.get("ai.response.object")
    return input_from_body(attributes.get("ai.prompt")), output_from_body(answer) if answer else None
