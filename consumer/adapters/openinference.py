"""OpenInference (Arize Phoenix) spans: session.id, input.value/output.value, llm.input_messages.N.*."""

from __future__ import annotations

from typing import Any

from ..decode import DecodedSpan
from ._base import ConversationEvent, as_text, clean_agent, turn_from_span

SESSION_ID = "session.id"


def _indexed_messages(attributes: dict[str, Any], prefix: str) -> list[tuple[str | None, str]]:
    found: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        if not key.startswith(prefix):
            continue
        index, _, rest = key[len(prefix) :].partition(".")
        if index.isdigit() and rest in ("message.role", "message.content"):
            found.setdefault(int(index), {})[rest] = value
    return [
        (m.get("message.role"), m["message.content"])
        for _, m in sorted(found.items())
        if isinstance(m.get("message.content"), str)
    ]


def extract(span: DecodedSpan) -> ConversationEvent | None:
    attributes = span.attributes
    session = attributes.get(SESSION_ID)
    if session is None:
        return None
    user = as_text(attributes.get("input.value"))
    if user is None:
        messages = [c for role, c in _indexed_messages(attributes, "llm.input_messages.") if role in (None, "user")]
        user = messages[-1] if messages else None
    answer = as_text(attributes.get("output.value"))
    if answer is None:
        messages = [c for _, c in _indexed_messages(attributes, "llm.output_messages.")]
        answer = "\n".join(messages) if messages else None
    if user is None and answer is None:
        return None
    agent = attributes.get("agent.name") or attributes.get("graph.node.name") or span.resource.get("service.name")
    return ConversationEvent(
        conversation_id=str(session), agent=clean_agent(agent), turn=turn_from_span(span, user, answer)
    )
