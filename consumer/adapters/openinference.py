"""OpenInference (Arize Phoenix) spans: session.id, input.value/output.value, llm.input_messages.N.*."""

from __future__ import annotations

from ..decode import DecodedSpan
from ._base import ConversationEvent, as_text, clean_agent, indexed_messages, turn_from_span

SESSION_ID = "session.id"


def extract(span: DecodedSpan) -> ConversationEvent | None:
    attributes = span.attributes
    session = attributes.get(SESSION_ID)
    if session is None:
        return None
    user = as_text(attributes.get("input.value"))
    if user is None:
        messages = [
            c
            for role, c in indexed_messages(attributes, "llm.input_messages.", "message.role", "message.content")
            if role in (None, "user")
        ]
        user = messages[-1] if messages else None
    answer = as_text(attributes.get("output.value"))
    if answer is None:
        messages = [
            c for _, c in indexed_messages(attributes, "llm.output_messages.", "message.role", "message.content")
        ]
        answer = "\n".join(messages) if messages else None
    if user is None and answer is None:
        return None
    agent = attributes.get("agent.name") or attributes.get("graph.node.name") or span.resource.get("service.name")
    return ConversationEvent(
        conversation_id=str(session), agent=clean_agent(agent), turn=turn_from_span(span, user, answer)
    )
