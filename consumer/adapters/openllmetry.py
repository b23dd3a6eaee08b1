"""OpenLLMetry (Traceloop) spans: gen_ai.prompt.N.* / gen_ai.completion.N.*, traceloop.association.properties.*."""

from __future__ import annotations

from ..decode import DecodedSpan
from ._base import ConversationEvent, as_text, clean_agent, indexed_messages, turn_from_span

ASSOCIATION = "traceloop.association.properties."
SESSION_KEYS = tuple(ASSOCIATION + k for k in ("session_id", "conversation_id", "thread_id", "chat_id"))


def extract(span: DecodedSpan) -> ConversationEvent | None:
    attributes = span.attributes
    session = next((attributes[k] for k in SESSION_KEYS if k in attributes), None)
    if session is None:
        return None
    prompts = [
        content
        for role, content in indexed_messages(attributes, "gen_ai.prompt.", "role", "content")
        if role in (None, "user")
    ]
    completions = [content for _, content in indexed_messages(attributes, "gen_ai.completion.", "role", "content")]
    user = prompts[-1] if prompts else as_text(attributes.get("traceloop.entity.input"))
    answer = "\n".join(completions) if completions else as_text(attributes.get("traceloop.entity.output"))
    if user is None and answer is None:
        return None
    agent = (
        attributes.get(ASSOCIATION + "agent")
        or attributes.get("traceloop.workflow.name")
        or attributes.get("traceloop.entity.name")
        or span.resource.get("service.name")
    )
    return ConversationEvent(
        conversation_id=str(session), agent=clean_agent(agent), turn=turn_from_span(span, user, answer)
    )
