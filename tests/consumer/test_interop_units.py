"""The pieces behind interoperability, one by one: the conversation-id resolver, the exporter's record keys, the
stamping span processor and nesting by content. (Proof on real recordings: tests/consumer/test_interop.py.)"""

from __future__ import annotations

from collections import OrderedDict

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.pipeline import read_all
from tracejudge.consumer.adapters import ConversationEvent, Turn, extract, trace_contexts
from tracejudge.consumer.conversation.table import ConversationTable
from tracejudge.consumer.decode import decode_record
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.exchanges import exchanges
from tracejudge.tracer import ConversationSpanProcessor, conversation, traced_agent
from tracejudge.tracer.exporter import KafkaSpanExporter, record_keys
from tracejudge.tracer.identity import agent_name, conversation_id


@pytest.mark.parametrize(
    "key",
    [
        "gen_ai.conversation.id",
        "session.id",
        "traceloop.association.properties.session_id",
        "traceloop.association.properties.conversation_id",
        "traceloop.association.properties.thread_id",
        "traceloop.association.properties.chat_id",
        "langfuse.session.id",
        "ai.telemetry.metadata.sessionId",
        "langsmith.metadata.thread_id",
    ],
)
def test_every_known_conversation_key(key: str) -> None:
    assert conversation_id({key: "c-1", "other": "x"}) == "c-1"


def test_resolver_order_and_empty_values() -> None:
    assert conversation_id({"session.id": "s", "gen_ai.conversation.id": "g"}) == "g"
    assert conversation_id({"gen_ai.conversation.id": "", "session.id": "s"}) == "s"  # pydantic-ai writes '' too
    assert conversation_id({"gen_ai.conversation.id": 7}) == "7"
    assert conversation_id({"http.method": "GET"}) is None and conversation_id(None) is None


def test_agent_label_falls_back_to_the_framework_then_the_service() -> None:
    service = {"service.name": "refund-service"}
    assert agent_name({"gen_ai.agent.name": "a", "agent.name": "b"}, service) == "a"
    assert agent_name({"agent.name": "oi-agent"}, service) == "oi-agent"
    assert agent_name({"agent_name": "pydantic-agent"}, service) == "pydantic-agent"
    assert agent_name({"traceloop.workflow.name": "wf"}, service) == "wf"
    assert agent_name({"traceloop.span.kind": "workflow", "traceloop.entity.name": "entity"}, service) == "entity"
    assert agent_name({"traceloop.span.kind": "task", "traceloop.entity.name": "step"}, service) == "refund-service"
    assert agent_name({}, {"service.name": "unknown_service:python"}) is None
    table = ConversationTable()
    table.apply(ConversationEvent("c", None, turn("s", "", 0, 10, "q", "a"), ended=True), 0)
    assert table.take_dispatches()[0].job.agent == "unknown"  # `unknown` only when there is nothing


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(ConversationSpanProcessor())
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


def test_conversation_block_stamps_every_span() -> None:
    provider, memory = _provider()
    tracer = provider.get_tracer("any.instrumentation")
    with conversation("conv-9", agent="desk", end=True, tracer_provider=provider):
        with tracer.start_as_current_span("chat gpt-4o"):
            with tracer.start_as_current_span("POST", attributes={"gen_ai.agent.name": "own"}):
                pass
    with tracer.start_as_current_span("outside"):
        pass
    spans = {s.name: dict(s.attributes or {}) for s in memory.get_finished_spans()}
    assert spans["chat gpt-4o"]["gen_ai.conversation.id"] == "conv-9"
    assert spans["chat gpt-4o"]["gen_ai.agent.name"] == "desk"
    assert spans["POST"] == {"gen_ai.agent.name": "own", "gen_ai.conversation.id": "conv-9"}  # never overwritten
    assert spans["end_conversation"]["tracejudge.conversation.ended"] is True
    assert "gen_ai.conversation.id" not in spans["outside"]


def test_a_child_inherits_its_parents_conversation_in_any_convention() -> None:
    provider, memory = _provider()
    tracer = provider.get_tracer("any.instrumentation")
    with tracer.start_as_current_span("agent", attributes={"traceloop.association.properties.session_id": "t-1"}):
        with tracer.start_as_current_span("chat"):
            pass
    spans = {s.name: dict(s.attributes or {}) for s in memory.get_finished_spans()}
    assert spans["chat"]["gen_ai.conversation.id"] == "t-1"


def test_record_keys_follow_the_conversation_a_trace_names() -> None:
    provider, memory = _provider()
    provider._active_span_processor._span_processors = provider._active_span_processor._span_processors[
        1:
    ]  # no stamping
    tracer = provider.get_tracer("x")
    with tracer.start_as_current_span("agent", attributes={"session.id": "s-1"}):
        with tracer.start_as_current_span("chat"):
            pass
    with tracer.start_as_current_span("lonely"):
        pass
    spans = memory.get_finished_spans()
    keys = dict(zip([s.name for s in spans], record_keys(spans)[0], strict=True))
    assert keys["agent"] == keys["chat"] == b"s-1"
    assert keys["lonely"] == format(spans[-1].context.trace_id, "032x").encode()


def turn(
    span_id: str, parent: str, start: int, end: int, user: str | None, answer: str | None, trace: str = "t"
) -> Turn:
    return Turn(span_id, trace, parent, start, end, user, answer)


def pairs(turns: list[Turn]) -> list[tuple[str | None, str | None]]:
    return [(t.input, t.output) for t in turns]


def test_a_parent_without_content_yields_to_its_child() -> None:
    agent = turn("a", "", 0, 100, None, None)
    chat = turn("c", "a", 10, 90, "q", "answer")
    assert pairs(exchanges([agent, chat])) == [("q", "answer")]


def test_parent_and_child_with_content_make_one_turn_parent_first() -> None:
    agent = turn("a", "", 0, 100, "what the user typed", None)
    chat = turn("c", "x-not-a-turn", 10, 90, "prompt with context", "answer")  # linked through a span we never saw
    (one,) = exchanges([agent, chat])
    assert (one.input, one.output, one.span_id) == ("what the user typed", "answer", "a")


def test_tool_steps_merge_and_a_wrapper_of_many_exchanges_yields() -> None:
    root = turn("w", "", 0, 1000, "{unparsed wrapper}", None)
    steps = [
        turn("1", "w", 10, 20, "q1", None),  # asked for a tool
        turn("2", "w", 30, 40, "q1", "a1"),
        turn("3", "w", 50, 60, "q2", "a2"),
    ]
    assert pairs(exchanges([root, *steps])) == [("q1", "a1"), ("q2", "a2")]


def test_the_same_exchange_twice_counts_once_only_when_the_spans_overlap() -> None:
    twice = [turn("1", "", 0, 50, "q", "a"), turn("2", "", 10, 40, "q", "a", trace="u")]
    assert pairs(exchanges(twice)) == [("q", "a")]
    repeated = [turn("1", "", 0, 10, "ok", "fine"), turn("2", "", 20, 30, "ok", "fine", trace="u")]
    assert len(exchanges(repeated)) == 2


def test_turn_count_and_version_count_exchanges() -> None:
    table = ConversationTable()
    for t in [turn("a", "", 0, 100, None, None), turn("c", "a", 10, 90, "q", "x"), turn("b", "", 200, 300, "q2", "y")]:
        table.apply(ConversationEvent("c", "bot", t), 0)
    table.apply(ConversationEvent("c", "bot", ended=True), 0)
    (dispatch,) = table.take_dispatches()
    job = dispatch.job
    assert (job.version, len(job.exchanges)) == (2, 2)


def test_cycles_and_deep_chains_lose_nothing() -> None:
    cycle = [turn("a", "b", 0, 10, "q1", "a1"), turn("b", "a", 20, 30, "q2", "a2")]
    assert sorted(pairs(exchanges(cycle))) == [("q1", "a1"), ("q2", "a2")]
    chain = [turn(str(i), str(i - 1) if i else "", i, 10_000 - i, None, None) for i in range(3_000)]
    chain.append(turn("leaf", "2999", 5_000, 5_001, "deep q", "deep a"))
    assert pairs(exchanges(chain)) == [("deep q", "deep a")]


def test_structured_text_beats_a_parents_body() -> None:
    workflow = Turn(
        "w", "t", "", 0, 100, "[previous question]", "the answer", input_from_body=True, output_from_body=True
    )
    chat = turn("c", "w", 10, 90, "the question", "the answer (structured)")
    (one,) = exchanges([workflow, chat])
    assert (one.input, one.output) == ("the question", "the answer (structured)")
    structured_parent = turn("a", "", 0, 100, "typed by the user", None)
    (two,) = exchanges([structured_parent, chat])
    assert (two.input, two.output) == ("typed by the user", "the answer (structured)")


def test_a_named_agent_beats_the_service_name_a_child_fell_back_to() -> None:
    table = ConversationTable()
    child = ConversationEvent("c", "refund-service", turn("c1", "a1", 10, 20, "q", "x"), agent_named=False)
    parent = ConversationEvent("c", "refund-agent", turn("a1", "", 0, 30, None, None))
    later = ConversationEvent("c", "other-service", turn("c2", "", 40, 50, "q2", "y"), agent_named=False)
    for event in (child, parent, later):
        table.apply(event, 0)
    state = table.get("c")
    assert state is not None and state.agent == "refund-agent"


def test_the_block_wins_over_an_id_a_library_made_up_but_not_over_traced_agent() -> None:
    provider, memory = _provider()
    library = provider.get_tracer("pydantic-ai")

    @traced_agent("desk", tracer_provider=provider)
    def answer(question: str, session_id: str) -> str:
        with library.start_as_current_span("chat inner"):
            return "fine"

    with conversation("block-id", agent="desk", tracer_provider=provider):
        with library.start_as_current_span("invoke_agent", attributes={"gen_ai.conversation.id": "uuid7-made-up"}):
            pass
        answer("q", session_id="explicit-id")
    spans = {s.name: dict(s.attributes or {}) for s in memory.get_finished_spans()}
    assert spans["invoke_agent"]["gen_ai.conversation.id"] == "block-id"
    assert spans["invoke_agent"]["tracejudge.conversation.original_id"] == "uuid7-made-up"
    assert spans["invoke_agent desk"]["gen_ai.conversation.id"] == "explicit-id"
    assert spans["chat inner"]["gen_ai.conversation.id"] == "explicit-id"


def test_a_content_less_span_of_the_same_call_is_not_an_extra_turn() -> None:
    sdk_own = turn("s", "", 5, 45, None, None, trace="u")  # e.g. an SDK's own span, a sibling root
    call = turn("c", "", 0, 50, "q", "a")
    assert pairs(exchanges([call, sdk_own])) == [("q", "a")]
    assert pairs(exchanges([turn("s", "", 0, 60, None, None, trace="u"), turn("c", "", 5, 50, "q", "a")])) == [
        ("q", "a")
    ]
    capture_off = [turn(str(i), "", i * 10, i * 10 + 5, None, None, trace=str(i)) for i in range(3)]
    assert len(exchanges(capture_off)) == 3


def test_a_call_that_spoke_then_asked_for_a_tool_and_the_call_after_it_are_one_exchange() -> None:
    agent = turn("a", "", 0, 100, None, None)
    first = turn("1", "a", 10, 40, "q", "Let me check.")  # text next to a tool call (Anthropic models do this)
    second = turn("2", "a", 50, 90, None, "It shipped.")  # its history ends with that assistant message
    assert pairs(exchanges([agent, first, second])) == [("q", "Let me check.\nIt shipped.")]
    elsewhere = turn("3", "", 200, 300, None, "unprompted", trace="other")  # another trace: not a continuation
    assert len(exchanges([agent, first, second, elsewhere])) == 2


def test_the_turn_cap_counts_exchanges_not_spans() -> None:
    table = ConversationTable(max_turns=2, idle_timeout_s=10)
    # Spans end child first: chat 1, its agent span, then chat 2.
    spans = [("c1", "a1", 10, 90, "q1", "x1"), ("a1", "", 0, 100, None, None), ("c2", "a2", 210, 290, "q2", "x2")]
    for span in spans[:2]:
        table.apply(ConversationEvent("c", "bot", turn(*span)), 0)
    assert table.take_dispatches() == []  # two spans, one exchange: under the cap of two (spans counted: capped)
    table.apply(ConversationEvent("c", "bot", turn(*spans[2])), 0)
    (dispatch,) = table.take_dispatches()
    job = dispatch.job
    assert (job.completed_by, job.truncated, job.version) == ("turn_cap", True, 2)
    assert pairs(list(job.exchanges)) == [("q1", "x1"), ("q2", "x2")]


def test_an_array_is_not_a_conversation_id() -> None:
    assert conversation_id({"gen_ai.conversation.id": ["a", "b"], "session.id": "s"}) == "s"
    assert conversation_id({"gen_ai.conversation.id": ("a",)}) is None


def test_a_later_batch_of_a_trace_goes_with_its_conversation_and_says_so(broker: EmbeddedBroker, topic: str) -> None:
    """A span exported after its trace named a conversation (another batch) is keyed there, and its record names it:
    the consumer reads one record at a time."""
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("x")
    with tracer.start_as_current_span("workflow"):
        with tracer.start_as_current_span("retrieve", attributes={"session.id": "s-9"}):
            pass
        with tracer.start_as_current_span("llm", attributes={"openinference.span.kind": "LLM", "output.value": "hi"}):
            pass
    retrieve, llm, workflow = memory.get_finished_spans()
    known: OrderedDict[bytes, str] = OrderedDict()
    assert record_keys([retrieve], known)[0] == [b"s-9"]
    keys, lent = record_keys([llm, workflow], known)
    assert keys == [b"s-9", b"s-9"] and set(lent.values()) == {"s-9"} and len(lent) == 2
    assert record_keys([tracer.start_span("other trace")], known)[1] == {}

    exporter = KafkaSpanExporter(broker.bootstrap_servers, topic)
    assert exporter.export([retrieve]).name == "SUCCESS" and exporter.export([llm]).name == "SUCCESS"
    exporter.shutdown()
    records = read_all(broker.bootstrap_servers, topic)
    assert [r.key for r in records] == [b"s-9", b"s-9"] and len({r.partition for r in records}) == 1
    value = records[-1].value
    ExportTraceServiceRequest.FromString(value)  # still a valid OTLP request
    spans = decode_record(value)
    event = extract(spans[0], trace_contexts(spans))
    assert event is not None and event.conversation_id == "s-9" and event.turn is not None


def test_an_agent_loops_step_calls_are_one_exchange() -> None:
    """Model calls below an agent span that all ask its question (DSPy ReAct's steps, each wrapping the question in
    its `[[ ## question ## ]]` template) are steps of one exchange: the agent's question and answer, not theirs."""
    agent = Turn("r", "t", "", 0, 100, "Refund window?", "30 days.", input_from_body=True, output_from_body=True)
    steps = [
        turn("s1", "r", 10, 20, "[[ ## question ## ]]\nRefund window?\n\n[[ ## trajectory ## ]]", "[[ ## next_thought"),
        turn(
            "s2",
            "r",
            30,
            40,
            "[[ ## question ## ]]\nRefund window?\n\n[[ ## trajectory ## ]] obs",
            "[[ ## answer ## ]]\n30 days.\n",
        ),
    ]
    (one,) = exchanges([agent, *steps])
    assert (one.input, one.output) == ("Refund window?", "30 days.")
    # Three questions under one root are three exchanges (a conversation in one trace), as before.
    session = Turn("s", "t", "", 0, 100, "q1", None, input_from_body=True)
    asked = [turn(f"c{i}", "s", 10 * i + 1, 10 * i + 5, f"q{i}", f"a{i}") for i in (1, 2, 3)]
    assert [(t.input, t.output) for t in exchanges([session, *asked])] == [("q1", "a1"), ("q2", "a2"), ("q3", "a3")]


def test_content_less_calls_below_an_agent_with_text_keep_its_exchange() -> None:
    """Semantic Kernel's chat spans carry no text (it logs content instead); the agent span around a function call and
    the final answer has the question and answer: one exchange with them, not two empty ones."""
    agent = turn("a", "", 0, 100, "Refund window?", "30 days.")
    calls = [turn("c1", "a", 10, 20, None, None), turn("c2", "a", 30, 40, None, None)]
    (one,) = exchanges([agent, *calls])
    assert (one.input, one.output) == ("Refund window?", "30 days.")


def test_a_short_question_inside_a_later_word_is_not_a_step_of_it() -> None:
    """A span with text "hi" around two calls, "hi" and "what is this?": two exchanges, not one ("hi" is in "this")."""
    session = Turn("s", "t", "", 0, 100, "hi", None, input_from_body=True)
    asked = [turn("c1", "s", 10, 20, "hi", "hello"), turn("c2", "s", 30, 40, "what is this?", "a shop")]
    assert [(t.input, t.output) for t in exchanges([session, *asked])] == [("hi", "hello"), ("what is this?", "a shop")]
