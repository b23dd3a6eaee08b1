"""Stamp the current conversation on every span, whichever instrumentation starts it.

Inside `with conversation("id", agent=...)` a span from openai-v2, pydantic-ai or any framework gets
`gen_ai.conversation.id` (the block's, even over an id the library set itself), `gen_ai.agent.name` (when not set) and
the block's `turn_index` when the caller gave one (never a counter: see `_conversation`), so a library without a
session concept needs one `with` line. Our own spans keep theirs: `@traced_agent`'s explicit
`session_id` argument wins over the block, as documented.
Outside such a block, a span whose parent names a conversation (in any convention the resolver knows) inherits it:
a child LLM span then travels in its conversation's Kafka record even when it is exported before its parent ends.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from ._conversation import current_conversation
from ._internal import handle_internal_errors
from .identity import conversation_id
from .semconv import GEN_AI_AGENT_NAME, GEN_AI_CONVERSATION_ID, TRACER_NAME, TURN_INDEX

ORIGINAL_CONVERSATION_ID = "tracejudge.conversation.original_id"


def _ours(span: object) -> bool:
    scope = getattr(span, "instrumentation_scope", None)
    return scope is not None and scope.name == TRACER_NAME


class ConversationSpanProcessor(SpanProcessor):
    """Add it first to your TracerProvider (`setup_tracing` does): it only sets attributes when a span starts."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        with handle_internal_errors():
            attributes = span.attributes or {}
            active = current_conversation.get()
            if active is not None and not _ours(span):
                # The block is the user's explicit word: it wins over an id a library made up (pydantic-ai generates
                # one per run when none is passed), which is kept under ORIGINAL_CONVERSATION_ID.
                target = active.session_id
                parent = trace.get_current_span(parent_context)
                if _ours(parent):  # inside @traced_agent: its conversation (an explicit session_id) holds
                    target = conversation_id(getattr(parent, "attributes", None)) or target
                existing = attributes.get(GEN_AI_CONVERSATION_ID)
                if existing != target:
                    if existing is not None:
                        span.set_attribute(ORIGINAL_CONVERSATION_ID, existing)
                    span.set_attribute(GEN_AI_CONVERSATION_ID, target)
                if active.agent and GEN_AI_AGENT_NAME not in attributes:
                    span.set_attribute(GEN_AI_AGENT_NAME, active.agent)
                if active.turn_index is not None and target == active.session_id and TURN_INDEX not in attributes:
                    span.set_attribute(TURN_INDEX, active.turn_index)
                return
            if active is not None:
                return  # our own spans already name their conversation (an explicit session_id may differ)
            if conversation_id(attributes) is not None:
                return
            parent = trace.get_current_span(parent_context)
            inherited = conversation_id(getattr(parent, "attributes", None))
            if inherited is not None:
                span.set_attribute(GEN_AI_CONVERSATION_ID, inherited)

    def on_end(self, span: ReadableSpan) -> None:
        return None

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
