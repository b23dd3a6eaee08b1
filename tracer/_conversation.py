"""Which conversation a turn belongs to (contextvars: tasks and threads never mix ids), and its end.

A `conversation()` block only stamps, like Langfuse's `propagate_attributes` and OpenLLMetry's association
properties: one block per web request is the normal pattern, so leaving it ends nothing unless asked (`end=True`,
`end_conversation()`). No turn index is counted here: the turns of one conversation may be served by many processes,
so the consumer orders them by span start time; a caller that knows the turn number passes it (`turn_index=`).
"""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, TracerProvider

from ._internal import handle_internal_errors, report_misuse
from .semconv import CONVERSATION_ENDED, END_CONVERSATION_SPAN, GEN_AI_AGENT_NAME, GEN_AI_CONVERSATION_ID, TRACER_NAME


@dataclass(frozen=True, slots=True)
class ActiveConversation:
    session_id: str
    agent: str | None
    turn_index: int | None = None
    tracer_provider: TracerProvider | None = None


current_conversation: contextvars.ContextVar[ActiveConversation | None] = contextvars.ContextVar(
    "tracejudge_conversation", default=None
)


def valid_turn_index(value: Any) -> int | None:
    """A caller's turn index if it is one (an int >= 0); anything else is dropped, said once, never raised."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    report_misuse("turn_index", f"turn_index={value!r} is not an int >= 0: the turn is recorded without an index")
    return None


def get_tracer(tracer_provider: TracerProvider | None) -> trace.Tracer:
    if tracer_provider is not None:
        return tracer_provider.get_tracer(TRACER_NAME)
    return trace.get_tracer(TRACER_NAME)


def emit_marker(
    name: str,
    session_id: str,
    agent: str | None,
    attributes: dict[str, Any],
    tracer_provider: TracerProvider | None,
) -> None:
    """A zero-length span that carries a conversation-level fact (its end, user feedback)."""
    with handle_internal_errors():
        attrs: dict[str, Any] = {GEN_AI_CONVERSATION_ID: str(session_id), **attributes}
        if agent:
            attrs[GEN_AI_AGENT_NAME] = agent
        now = time.time_ns()
        span = get_tracer(tracer_provider).start_span(name, kind=SpanKind.INTERNAL, attributes=attrs, start_time=now)
        span.end(end_time=now)


def end_conversation(
    session_id: str | None = None, *, agent: str | None = None, tracer_provider: TracerProvider | None = None
) -> None:
    """Tell the consumer the conversation is complete, so it is judged now rather than after the idle timeout.

    Without an id, inside a `conversation()` block: that block's conversation (its agent and provider too).
    """
    with handle_internal_errors():
        active = current_conversation.get()
        if session_id is None:
            if active is None:
                report_misuse(
                    "end_conversation",
                    "end_conversation() without an id, outside any `with conversation(id):` block: nothing was "
                    "ended; pass the conversation id",
                )
                return
            session_id = active.session_id
        session_id = str(session_id)
        if active is not None and active.session_id == session_id:
            agent = agent or active.agent
            tracer_provider = tracer_provider or active.tracer_provider
        emit_marker(END_CONVERSATION_SPAN, session_id, agent, {CONVERSATION_ENDED: True}, tracer_provider)


class conversation:
    """Make `session_id` the current conversation (sync or async `with`) for every span started inside.

    It only stamps: leaving it ends nothing, so one block per web request is fine. `end=True` ends the conversation
    when the block is left; `turn_index` (0-based), when you know it, is recorded on the turn the block serves.
    """

    def __init__(
        self,
        session_id: str,
        *,
        agent: str | None = None,
        end: bool = False,
        turn_index: int | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.session_id = str(session_id)
        self.agent = agent
        self.end = bool(end)
        self.turn_index = valid_turn_index(turn_index)
        self.tracer_provider = tracer_provider
        self._tokens: list[contextvars.Token[ActiveConversation | None]] = []

    def __enter__(self) -> conversation:
        active = ActiveConversation(self.session_id, self.agent, self.turn_index, self.tracer_provider)
        self._tokens.append(current_conversation.set(active))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._tokens:
            token = self._tokens.pop()
            try:
                current_conversation.reset(token)
            except ValueError:  # exited in another context than entered: leave that context alone
                pass
        if self.end:
            end_conversation(self.session_id, agent=self.agent, tracer_provider=self.tracer_provider)

    async def __aenter__(self) -> conversation:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)
