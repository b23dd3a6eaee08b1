"""OpenLLMetry (Traceloop) spans: gen_ai.prompt.N.* / gen_ai.completion.N.*, traceloop.association.properties.*."""

from __future__ import annotations

from typing import Any

from ..decode import DecodedSpan
from ._base import ConversationEvent, as_text, clean_agent, turn_from_span

ASSOCIATION = "traceloop.association.properties."
SESSION_KEYS = tuple(ASSOCIATION + k for k in ("session_id", "conversation_id", "thread_id", "chat_id"))


def _indexed(attributes: dict[str, Any], prefix: str) -> list[tuple[str | None, str]]:
    found: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        if not key.startswith(prefix):
            continue
        index, _, rest = key[len(prefix) :].partition(".")
        if index.isdigit() and rest in ("role", "content"):
            found.setdefault(int(index), {})[rest] = value
    return [(m.get("role"), m["content"]) for _, m in sorted(found.items()) if isinstance(m.get("content"), str)]


def extract(span: DecodedSpan) -> ConversationEvent | None:
    attributes = span.attributes
    session = next((attributes[k] for k in SESSION_KEYS if k in attributes), None)
    if session is None:
        return None
    prompts = [content for role, content in _indexed(attributes, "gen_ai.prompt.") if role in (None, "user")]
    completions = [content for _, content in _indexed(attributes, "gen_ai.completion.")]
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
