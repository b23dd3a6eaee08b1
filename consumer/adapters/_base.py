"""What an adapter makes of a span: a conversation event (a turn, an end marker, feedback) or nothing."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..decode import DecodedSpan
from ._text import loads

MAX_AGENT_NAME = 128


@dataclass(slots=True)
class Turn:
    span_id: str
    trace_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    input: str | None
    output: str | None
    is_error: bool = False
    index: int | None = None
    # Text parsed out of a raw body (input.value, traceloop.entity.*) yields to structured messages when nested.
    input_from_body: bool = False
    output_from_body: bool = False

    @property
    def judgeable(self) -> bool:
        return self.input is not None or self.output is not None


@dataclass(slots=True)
class Feedback:
    score: float | None
    label: str | None
    comment: str | None
    span_id: str

    @property
    def negative(self) -> bool:
        if self.score is not None:  # scores are -1..1: below zero is negative
            return self.score < 0
        return (self.label or "").lower() in {"thumbs_down", "negative", "bad", "down", "dislike"}


@dataclass(slots=True)
class ConversationEvent:
    conversation_id: str
    agent: str | None
    turn: Turn | None = None
    ended: bool = False
    feedback: Feedback | None = None
    agent_named: bool = True  # False: only the resource's service.name was there


def clean_agent(value: Any) -> str | None:
    """Agent names come from spans: untrusted, so bounded and printable."""
    if value is None:
        return None
    text = (value if isinstance(value, str) else str(value))[:MAX_AGENT_NAME]
    if not text.isprintable():  # one C call for the usual name, a character walk only for one that needs it
        text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text.strip() or None


def as_text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def indexed_messages(attributes: dict[str, Any], prefix: str, role_key: str, content_key: str) -> list[dict[str, Any]]:
    """Flattened message lists as messages in N order: `<prefix>N.<role_key>`, `<prefix>N.<content_key>` and
    OpenInference's `<prefix>N.message.contents.M.message_content.{type,text}` parts."""
    found: dict[int, dict[str, Any]] = {}
    contents_key = content_key + "s."
    for key, value in attributes.items():
        if not key.startswith(prefix):
            continue
        index, _, rest = key[len(prefix) :].partition(".")
        if not index.isdigit():
            continue
        message = found.setdefault(int(index), {"parts": {}})
        if rest == role_key:
            message["role"] = value
        elif rest == content_key:
            message["content"] = value
        elif rest.startswith(contents_key):
            part, _, field = rest[len(contents_key) :].partition(".")
            if part.isdigit():
                message["parts"].setdefault(int(part), {})[field.rpartition(".")[2]] = value
    messages = []
    for _, message in sorted(found.items()):
        parts = [part for _, part in sorted(message.pop("parts").items())]
        content = message.get("content")
        if isinstance(content, str) and content[:1] == "[":  # OpenLLMetry serialises list content as JSON
            try:
                content = loads(content)
            except ValueError:
                pass
        if content is None and parts:
            content = parts
        messages.append({"role": message.get("role"), "content": content})
    return messages


def turn_from_span(
    span: DecodedSpan,
    input_text: str | None,
    output_text: str | None,
    index: Any = None,
    *,
    input_from_body: bool = False,
    output_from_body: bool = False,
) -> Turn:
    return Turn(  # positional, in the fields' order: once per turn on the hot path
        span.span_id,
        span.trace_id,
        span.parent_span_id,
        span.start_ns,
        span.end_ns,
        input_text,
        output_text,
        span.is_error,
        index if isinstance(index, int) and not isinstance(index, bool) and index >= 0 else None,
        input_from_body,
        output_from_body,
    )
