"""Which conversation a turn belongs to (contextvars: tasks and threads never mix ids) and its turn numbers."""

from __future__ import annotations

import contextvars
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, TracerProvider

from ._internal import handle_internal_errors
from .semconv import CONVERSATION_ENDED, END_CONVERSATION_SPAN, GEN_AI_AGENT_NAME, GEN_AI_CONVERSATION_ID, TRACER_NAME

_MAX_TRACKED_CONVERSATIONS = 100_000


@dataclass(frozen=True, slots=True)
class ActiveConversation:
    session_id: str
    agent: str | None


current_conversation: contextvars.ContextVar[ActiveConversation | None] = contextvars.ContextVar(
    "tracejudge_conversation", default=None
)


class TurnCounter:
    """0-based turn numbers per conversation in this process; bounded (oldest conversations forgotten first)."""

    def __init__(self, max_conversations: int = _MAX_TRACKED_CONVERSATIONS) -> None:
        self._next: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        self._max = max_conversations

    def next_index(self, session_id: str) -> int:
        with self._lock:
            index = self._next.get(session_id, 0)
            self._next[session_id] = index + 1
            if index == 0 and len(self._next) > self._max:
                self._next.popitem(last=False)
            return index

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._next.pop(session_id, None)


turn_counter = TurnCounter()


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
    session_id: str, *, agent: str | None = None, tracer_provider: TracerProvider | None = None
) -> None:
    """Tell the consumer the conversation is complete, so it is judged now rather than after the idle timeout."""
    turn_counter.forget(str(session_id))
    emit_marker(END_CONVERSATION_SPAN, session_id, agent, {CONVERSATION_ENDED: True}, tracer_provider)


class conversation:
    """Make `session_id` the current conversation (sync or async `with`); ends the conversation on exit."""

    def __init__(
        self, session_id: str, *, agent: str | None = None, tracer_provider: TracerProvider | None = None
    ) -> None:
        self.session_id = str(session_id)
        self.agent = agent
        self.tracer_provider = tracer_provider
        self._tokens: list[contextvars.Token[ActiveConversation | None]] = []

    def __enter__(self) -> conversation:
        self._tokens.append(current_conversation.set(ActiveConversation(self.session_id, self.agent)))
        return self

    def __exit__(self, *exc: object) -> None:
        token = self._tokens.pop()
        try:
            current_conversation.reset(token)
        except ValueError:  # exited in another context than entered: leave that context alone
            pass
        end_conversation(self.session_id, agent=self.agent, tracer_provider=self.tracer_provider)

    async def __aenter__(self) -> conversation:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)
