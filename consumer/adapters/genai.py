"""OpenTelemetry GenAI conventions: our tracer's spans and any span with gen_ai.conversation.id and messages."""

from __future__ import annotations

from tracejudge.tracer._semconv import (
    CONVERSATION_ENDED,
    FEEDBACK_COMMENT,
    FEEDBACK_LABEL,
    FEEDBACK_SCORE,
    GEN_AI_AGENT_NAME,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_INPUT_MESSAGES,
    GEN_AI_OPERATION_NAME,
    GEN_AI_OUTPUT_MESSAGES,
    OPERATION_INVOKE_AGENT,
    TURN_INDEX,
)

from ..decode import DecodedSpan
from ._base import ConversationEvent, Feedback, as_text, clean_agent, messages_text, turn_from_span

USER_ROLES = frozenset({"user", "human"})
ASSISTANT_ROLES = frozenset({"assistant", "model", "ai"})


def _feedback(span: DecodedSpan) -> Feedback | None:
    attributes = span.attributes
    if FEEDBACK_SCORE not in attributes and FEEDBACK_LABEL not in attributes:
        return None
    score = attributes.get(FEEDBACK_SCORE)
    return Feedback(
        score=float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None,
        label=as_text(attributes.get(FEEDBACK_LABEL)),
        comment=as_text(attributes.get(FEEDBACK_COMMENT)),
        span_id=span.span_id,
    )


def extract(span: DecodedSpan) -> ConversationEvent | None:
    attributes = span.attributes
    conversation = attributes.get(GEN_AI_CONVERSATION_ID)
    if conversation is None:
        return None
    event = ConversationEvent(
        conversation_id=str(conversation),
        agent=clean_agent(attributes.get(GEN_AI_AGENT_NAME)),
        ended=attributes.get(CONVERSATION_ENDED) is True,
        feedback=_feedback(span),
    )
    has_messages = GEN_AI_INPUT_MESSAGES in attributes or GEN_AI_OUTPUT_MESSAGES in attributes
    if has_messages or attributes.get(GEN_AI_OPERATION_NAME) == OPERATION_INVOKE_AGENT:
        event.turn = turn_from_span(
            span,
            messages_text(attributes.get(GEN_AI_INPUT_MESSAGES), USER_ROLES, last_only=True),
            messages_text(attributes.get(GEN_AI_OUTPUT_MESSAGES), ASSISTANT_ROLES, last_only=False),
            attributes.get(TURN_INDEX),
        )
    if event.turn is None and not event.ended and event.feedback is None:
        return None
    return event
