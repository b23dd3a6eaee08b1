"""From a decoded span to a conversation event (a turn, an end marker, feedback) or nothing, whatever the convention.

The conversation id and the agent come from one resolver (`tracejudge.tracer.identity`, shared with the exporter's
record key). What a span IS decides what its text may become (`_kinds.py`): a model call gives its messages, an
agent its messages or plain text (`_frameworks.py`: never framework state), a chain or a tool nothing. Clean text
comes first: GenAI messages (attributes, then span events), OpenInference and OpenLLMetry message attributes; raw
bodies (`input.value`, `traceloop.entity.*`, pydantic-ai's `final_result`) only fill a side that none of those has
(and, on a model call, only one it wrote no messages for).

The hot path (consumer/conversation/reading.py) works out what a span is and where it goes once (`classify`) and
hands that to `trace_contexts`, `extract` and `textless_model_call`; a record none of whose bytes is one of
RECORD_MARKERS cannot make an event or a text-less report and is skipped before any span is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tracejudge.tracer.identity import CONVERSATION_ID_KEYS, agent_name, conversation_id, service_name
from tracejudge.tracer.semconv import GEN_AI_OPERATION_NAME, OPERATION_INVOKE_AGENT, TURN_INDEX

from ..decode import DecodedSpan
from . import _conventions, genai, langfuse, mlflow, openinference, openllmetry, vercel_ai
from ._base import ConversationEvent, Feedback, Turn, clean_agent, turn_from_span
from ._frameworks import answer_text, clean_task, is_state, output_task, user_text
from ._kinds import (
    INPUT_MESSAGE_PREFIXES,
    OUTPUT_MESSAGE_PREFIXES,
    Kind,
    framework_agent,
    has_messages,
    span_kind,
)

__all__ = [
    "RECORD_MARKERS",
    "Classified",
    "Convention",
    "ConversationEvent",
    "Feedback",
    "TraceContext",
    "Turn",
    "classify",
    "extract",
    "may_matter",
    "present_attributes",
    "textless_model_call",
    "trace_contexts",
]
Convention = _conventions.Convention
present_attributes = _conventions.present

Reader = Callable[[DecodedSpan], tuple[str | None, str | None]]
STRUCTURED: tuple[Reader, ...] = (
    genai.messages,
    genai.events,
    openinference.messages,
    openllmetry.messages,
    vercel_ai.messages,
    langfuse.messages,
    mlflow.messages,
)
BODIES: tuple[Reader, ...] = (
    genai.agent_bodies,
    openinference.bodies,
    openllmetry.bodies,
    vercel_ai.bodies,
    langfuse.bodies,
    mlflow.bodies,
)

# Spans that are a turn even without content (capture off): counted, then judged `empty_conversation`, never dropped.
_CALL_OPERATIONS = frozenset({OPERATION_INVOKE_AGENT, "chat", "text_completion", "generate_content"})
# An agent's text: not `llm.*_messages` (a model call's; OpenInference's LangChain copies one onto every chain) and
# not the raw bodies of model calls, but its messages and its input/output when they are messages or text.
_MODEL_CALL_READERS = (openinference.messages, openllmetry.messages, openinference.bodies, openllmetry.bodies)
AGENT_STRUCTURED: tuple[Reader, ...] = tuple(r for r in STRUCTURED if r not in _MODEL_CALL_READERS)


# Byte strings one of which every key or scope name that can make an event holds: a conversation id's keys (an event
# needs one, its own or its trace's) and the model-call markers (a text-less model call is reported even without
# one). OTLP protobuf keeps keys and names as their own UTF-8 bytes, so a record without any of these is skipped
# unread. The most common first; tests/consumer/test_read_events_golden.py checks they cover every key.
RECORD_MARKERS: tuple[bytes, ...] = (
    b"gen_ai.",
    b"session",
    b"association.properties.",
    b"langsmith.metadata.",
    b"openinference.span.kind",
    b"llm.request.type",
    b"ai.operationId",
    b"langfuse.observation.type",
    b"mlflow.spanType",
    b"gcp.vertex.agent",
    b"strands",
)
_MARKED_KEYS = (*CONVERSATION_ID_KEYS, *_conventions.MARKERS)


def may_matter(value: bytes) -> bool:
    """Whether a protobuf record's bytes hold a key that can make a conversation event (False: skip it unread)."""
    for marker in RECORD_MARKERS:  # a plain loop: `any` over a generator costs a resumption per marker
        if marker in value:
            return True
    return False


@dataclass(slots=True)
class Classified:
    """What a span is and where it goes, worked out once per span: its kind, its conversation id, its agent names,
    and (on first asking) the convention that marks it a model call."""

    span: DecodedSpan
    kind: Kind
    conversation_id: str | None
    agent_name: str | None
    framework_agent: str | None
    _convention: _conventions.Convention | None = None
    _convention_known: bool = False

    def convention(self) -> _conventions.Convention | None:
        """`_conventions.model_call` of the span, worked out once (most spans are judged without asking)."""
        if not self._convention_known:
            self._convention, self._convention_known = _conventions.model_call(self.span), True
        return self._convention


def classify(span: DecodedSpan) -> Classified:
    kind = span_kind(span)
    attributes = span.attributes
    # Positional, in the fields' order (span, kind, conversation_id, agent_name, framework_agent): once per span.
    return Classified(span, kind, conversation_id(attributes), agent_name(attributes), framework_agent(span, kind))


@dataclass(slots=True)
class TraceContext:
    """What the other spans of a trace in the same record say: a child LLM span without an id or a name of its
    own belongs to the conversation and agent its trace names."""

    conversation_id: str | None = None
    agent: str | None = None


def trace_contexts(
    spans: Iterable[DecodedSpan], classified: Iterable[Classified] | None = None
) -> dict[str, TraceContext]:
    """`classified`: the spans' `classify`, in the same order, when the caller has them."""
    contexts: dict[str, TraceContext] = {}
    spans = list(spans)
    for span, facts in zip(spans, classified if classified is not None else map(classify, spans), strict=True):
        conversation = facts.conversation_id
        agent = facts.agent_name or facts.framework_agent
        if conversation is None and agent is None:
            continue
        context = contexts.setdefault(span.trace_id, TraceContext())
        context.conversation_id = context.conversation_id or conversation
        context.agent = context.agent or agent
    return contexts


def _attribute(span: DecodedSpan, key: str) -> str | None:
    value = span.attributes.get(key)
    return value if isinstance(value, str) else None


def _is_step(span: DecodedSpan, kind: Kind) -> bool:
    """A step inside a turn; `kind` (the span's `span_kind`) is STEP already for a GenAI step operation or an
    OpenInference step kind, so only the conventions it does not weigh are asked."""
    return kind is Kind.STEP or span.attributes.get(openllmetry.SPAN_KIND) == "tool" or _conventions.is_step(span)


@dataclass(slots=True)
class Content:
    user: str | None = None
    answer: str | None = None
    user_from_body: bool = False
    answer_from_body: bool = False

    @property
    def empty(self) -> bool:
        return self.user is None and self.answer is None


def _agent_bodies(span: DecodedSpan) -> tuple[str | None, str | None]:
    """An agent span's input/output when it is a message, a message list or plain text (never framework state)."""
    attributes = span.attributes
    user = answer = None
    for in_key, out_key in (("input.value", "output.value"), ("traceloop.entity.input", "traceloop.entity.output")):
        user = user or user_text(attributes.get(in_key)) or output_task(attributes.get(out_key))
        answer = answer or answer_text(attributes.get(out_key))
    return user, answer


_AGENT_BODIES: tuple[Reader, ...] = (*(r for r in BODIES if r not in _MODEL_CALL_READERS), _agent_bodies)


def content(span: DecodedSpan, kind: Kind | None = None) -> Content:
    """The user's text and the answer's text of one span, by what the span is (consumer/adapters/_kinds.py):
    structured messages first; a model call's raw body only for a side it wrote no messages for; an agent's body only
    when it is a message or text; nothing from a chain or a step."""
    kind = span_kind(span) if kind is None else kind
    found = Content()
    if kind is Kind.CHAIN and not span.parent_span_id:
        kind = Kind.AGENT  # a trace's root chain is the application's entry (`@tracer.chain def answer(q)`)
    if kind in (Kind.CHAIN, Kind.STEP):
        return found
    structured, bodies = STRUCTURED, BODIES
    if kind is Kind.AGENT:
        structured, bodies = AGENT_STRUCTURED, _AGENT_BODIES
    skip_user = kind is Kind.MODEL and has_messages(span.attributes, INPUT_MESSAGE_PREFIXES)
    skip_answer = kind is Kind.MODEL and has_messages(span.attributes, OUTPUT_MESSAGE_PREFIXES)
    for readers, from_body in ((structured, False), (bodies, True)):
        if found.user is not None and found.answer is not None:
            break  # the messages gave both sides: no body is read
        for reader in readers:
            user, answer = reader(span)
            if from_body and (skip_user or is_state(user)):
                user = None
            if from_body and (skip_answer or is_state(answer)):
                answer = None
            if found.user is None and user is not None:
                found.user, found.user_from_body = user, from_body
            if found.answer is None and answer is not None:
                found.answer, found.answer_from_body = answer, from_body
            if found.user is not None and found.answer is not None:
                break
    if found.user is not None:
        found.user = clean_task(found.user) or None  # a framework's wrapping of the user's words
    return found


def extract(
    span: DecodedSpan, traces: dict[str, TraceContext] | None = None, facts: Classified | None = None
) -> ConversationEvent | None:
    """The span's conversation event; `traces` (from `trace_contexts` over the span's record) lends ids and names;
    `facts`: the span's `classify`, when the caller has it."""
    attributes = span.attributes
    context = traces.get(span.trace_id) if traces else None
    if facts is None:
        if conversation_id(attributes) is None and context is None:
            return None
        facts = classify(span)
    conversation = facts.conversation_id or (context.conversation_id if context else None)
    if conversation is None:
        return None
    own_name = facts.framework_agent
    named = facts.agent_name or own_name or (context.agent if context else None)
    event = ConversationEvent(  # positional (conversation_id, agent, turn, ended, feedback, agent_named)
        conversation,
        clean_agent(named or service_name(span.resource)),
        None,
        genai.ended(span),
        genai.feedback(span),
        named is not None,
    )
    kind = facts.kind
    if not (_is_step(span, kind) or (kind is Kind.CHAIN and span.parent_span_id)):  # see content()
        found = content(span, kind)
        is_call = (
            _attribute(span, GEN_AI_OPERATION_NAME) in _CALL_OPERATIONS
            or _attribute(span, openinference.SPAN_KIND) == "LLM"
            or facts.convention() is not None
        )
        # A framework's helper marked as a model call (LlamaIndex's `_prepare_chat_with_tools`) calls no model.
        is_call = (is_call or kind is Kind.MODEL) and not is_state(_attribute(span, "input.value"))
        if not found.empty or is_call:
            event.turn = turn_from_span(
                span,
                found.user,
                found.answer,
                attributes.get(TURN_INDEX),
                input_from_body=found.user_from_body,
                output_from_body=found.answer_from_body,
            )
    if event.turn is None and not event.ended and event.feedback is None and own_name is None:
        return None  # (a framework step that names the agent is kept for the name alone)
    if event.turn is None and not event.agent_named:
        event.agent = None  # a marker names no agent of its own: the conversation's agent stands
    return event


def textless_model_call(
    span: DecodedSpan, event: ConversationEvent | None, facts: Classified | None = None
) -> _conventions.Convention | None:
    """The convention of a span that looks like a model call or an agent run but gave no text (`event`: what
    `extract` made of it), else None: such spans are counted and heard, never dropped in silence."""
    if event is not None and event.turn is not None and event.turn.judgeable:
        return None
    return facts.convention() if facts is not None else _conventions.model_call(span)
