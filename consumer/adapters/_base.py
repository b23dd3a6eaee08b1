"""What an adapter makes of a span: a conversation event (a turn, an end marker, feedback) or nothing."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..decode import DecodedSpan

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


def clean_agent(value: Any) -> str | None:
    """Agent names come from spans: untrusted, so bounded and printable."""
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    text = "".join(ch if ch.isprintable() else "?" for ch in text[:MAX_AGENT_NAME]).strip()
    return text or None


def as_text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def messages_text(value: Any, roles: frozenset[str], *, last_only: bool) -> str | None:
    """Text of GenAI-convention messages (`parts` or plain `content`) with the given roles."""
    if value is None:
        return None
    messages = value
    if isinstance(value, str):
        try:
            messages = json.loads(value)
        except ValueError:
            return value
    if isinstance(messages, dict):
        messages = [messages]
    if not isinstance(messages, list):
        return as_text(messages)
    texts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role is not None and role not in roles:
            continue
        text = _message_content(message)
        if text:
            texts.append(text)
    if not texts:
        return None
    return texts[-1] if last_only else "\n".join(texts)


def _message_content(message: dict[str, Any]) -> str:
    parts = message.get("parts")
    if isinstance(parts, list):
        out = []
        for part in parts:
            if isinstance(part, dict):
                content = part.get("content", part.get("text"))
                if isinstance(content, str):
                    out.append(content)
        return "".join(out)
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def indexed_messages(
    attributes: dict[str, Any], prefix: str, role_key: str, content_key: str
) -> list[tuple[str | None, str]]:
    """Flattened message lists (`<prefix>N.<role_key>`, `<prefix>N.<content_key>`) as (role, content) in N order."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        if not key.startswith(prefix):
            continue
        index, _, rest = key[len(prefix) :].partition(".")
        if index.isdigit() and rest in (role_key, content_key):
            found.setdefault(int(index), {})[rest] = value
    return [(m.get(role_key), m[content_key]) for _, m in sorted(found.items()) if isinstance(m.get(content_key), str)]


def turn_from_span(span: DecodedSpan, input_text: str | None, output_text: str | None, index: Any = None) -> Turn:
    return Turn(
        span_id=span.span_id,
        trace_id=span.trace_id,
        parent_span_id=span.parent_span_id,
        start_ns=span.start_ns,
        end_ns=span.end_ns,
        input=input_text,
        output=output_text,
        is_error=span.is_error,
        index=index if isinstance(index, int) and not isinstance(index, bool) and index >= 0 else None,
    )
