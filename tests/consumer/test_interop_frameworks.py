"""Agent frameworks reach the judge as the conversation the user had: one rule for what a conversation is.

Every recorded fixture (tests/fixtures/interop/) replayed in-process through the consumer's own pieces (decode,
trace contexts, adapters, the conversation store, exchanges): each question and answer once and in order, no
framework state, no tool output as an answer, no system prompt as a user turn, the framework agent's own name.
(tests/consumer/test_interop.py proves the same through Tansu and the judge server.) Then the rule's parts one by one.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.assembly import assemble
from tracejudge.consumer.adapters import content, extract
from tracejudge.consumer.adapters._frameworks import answer_text, is_state, user_text
from tracejudge.consumer.adapters._kinds import Kind, framework_agent, span_kind
from tracejudge.consumer.adapters._text import exchange_input
from tracejudge.consumer.conversation.job import JudgeJob
from tracejudge.consumer.decode import DecodedSpan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "interop"
SETUPS = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.json").is_file())
# Framework state that must never reach the judge as text.
STATE_MARKERS = ("Send(", "__end__", "object at 0x", "Event(", '"type": "ai"', '"lc": 1', "ChatMessage(", "New task:")


def fake_server() -> ModuleType:
    if "fake_llm_server" not in sys.modules:
        spec = importlib.util.spec_from_file_location("fake_llm_server", FIXTURES / "fake_llm_server.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["fake_llm_server"] = module
        spec.loader.exec_module(module)
    return sys.modules["fake_llm_server"]


def replay(setup: str) -> list[JudgeJob]:
    """The fixture's records one by one, as the consumer reads them; then every conversation completes."""
    lines = (FIXTURES / setup / "records.jsonl").read_text().splitlines()
    on_arrival, idle = assemble([base64.b64decode(json.loads(line)["value_b64"]) for line in lines], 1.0)
    return on_arrival + idle


@pytest.mark.parametrize("setup", SETUPS)
def test_every_fixture_is_the_conversation_the_user_had(setup: str) -> None:
    want = json.loads((FIXTURES / setup / "expected.json").read_text())
    (job,) = replay(setup)
    assert job.conversation_id == want["conversation_id"]
    assert job.agent == want["agent"]
    assert job.version == len(job.exchanges) == len(want["turns"])
    if want.get("content_on_spans") is False:
        assert not any(t.judgeable for t in job.exchanges)
        return
    assert [(t.input, t.output) for t in job.exchanges] == [(t["user"], t["assistant"]) for t in want["turns"]]
    fake = fake_server()
    said = [text for t in job.exchanges for text in (t.input or "", t.output or "")]
    assert not [m for m in STATE_MARKERS for text in said if m in text]
    assert not [r for r in fake.TOOL_RESULTS.values() for t in job.exchanges if r in (t.output or "")]
    assert not [t for t in job.exchanges if fake.SYSTEM_PROMPT in (t.input or "")]


def _span(name: str = "s", parent: str = "", **attributes: Any) -> DecodedSpan:
    return DecodedSpan("t", name + "-id", parent, name, 0, 10, attributes)


@pytest.mark.parametrize(
    ("attributes", "kind"),
    [
        ({"openinference.span.kind": "LLM"}, Kind.MODEL),
        ({"gen_ai.operation.name": "chat"}, Kind.MODEL),
        ({"llm.request.type": "chat"}, Kind.MODEL),
        ({"openinference.span.kind": "AGENT"}, Kind.AGENT),
        ({"gen_ai.operation.name": "invoke_agent"}, Kind.AGENT),
        ({"traceloop.span.kind": "workflow"}, Kind.AGENT),
        ({"openinference.span.kind": "CHAIN"}, Kind.CHAIN),
        ({"gen_ai.operation.name": "execute_task", "traceloop.span.kind": "task"}, Kind.CHAIN),
        ({"openinference.span.kind": "TOOL"}, Kind.STEP),
        ({"openinference.span.kind": "RETRIEVER"}, Kind.STEP),
        ({"gen_ai.operation.name": "execute_tool", "openinference.span.kind": "LLM"}, Kind.STEP),
        ({"traceloop.span.kind": "tool"}, Kind.STEP),
        ({"http.method": "POST"}, Kind.UNKNOWN),
    ],
)
def test_what_a_span_is_decides_by_its_markers(attributes: dict[str, Any], kind: Kind) -> None:
    assert span_kind(_span(**attributes)) is kind


def test_a_chain_inside_a_trace_never_speaks_and_a_step_never_answers() -> None:
    text = {"input.value": "What now?", "output.value": "Fine."}
    chain = _span(parent="p", **{"openinference.span.kind": "CHAIN", **text})
    tool = _span(**{"openinference.span.kind": "TOOL", "input.value": "1042", "output.value": "order 1042: paid"})
    assert content(chain).empty and content(tool).empty
    assert extract(_span(parent="p", **{"session.id": "c", "openinference.span.kind": "CHAIN", **text})) is None
    # A trace's root chain is the application's entry: read like an agent (messages or text, never state).
    root = extract(_span(**{"session.id": "c", "openinference.span.kind": "CHAIN", **text}))
    assert root is not None and root.turn is not None and (root.turn.input, root.turn.output) == ("What now?", "Fine.")
    state = {"input.value": '{"ctx": "<Context object at 0x7f>"}', "output.value": "StopEvent(result=None)"}
    assert extract(_span(**{"session.id": "c", "openinference.span.kind": "CHAIN", **state})) is None


def test_an_agent_reads_messages_and_text_never_framework_state() -> None:
    state = json.dumps(
        {
            "messages": [
                {"type": "human", "data": {"content": "Q1"}},
                {"type": "ai", "data": {"content": "A1"}},
                {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", "HumanMessage"],
                 "kwargs": {"content": "Q2", "type": "human"}},
                {"type": "ai", "content": "", "tool_calls": [{"name": "lookup"}]},
                {"type": "tool", "content": "tool says 42"},
                {"type": "ai", "content": "A2"},
            ]
        }
    )  # fmt: skip
    assert answer_text(state) == "A2"
    assert user_text(json.dumps({"messages": json.loads(state)["messages"][:3]})) == "Q2"  # the graph's input
    assert user_text(state) is None  # a state ending in the answer asks nothing
    assert user_text(json.dumps({"task": "Q", "stream": False})) == "Q"  # smolagents' run arguments
    assert user_text(json.dumps({"ctx": "<workflows.context.Context object at 0x7f>", "ev": "StartEvent()"})) is None
    assert answer_text("__end__") is None and answer_text("[\"Send(node='tools', arg={})\"]") is None
    assert answer_text(json.dumps({"unknown": {"shape": 1}})) is None  # unknown JSON is state for an agent
    assert user_text("New task:\nWhat now?") == "What now?"
    assert (
        answer_text(json.dumps({"messages": [{"role": "assistant", "content": "A"}, {"role": "user", "content": "Q"}]}))
        is None
    )
    assert is_state("AgentInput(input=[ChatMessage(role=<MessageRole.USER: 'user'>)])") and not is_state("It is 5 EUR.")


def test_the_question_ends_at_any_earlier_act_of_the_assistant() -> None:
    """An answer given as a tool call (smolagents' final_answer) ends that exchange: questions never join."""
    history = [
        {"role": "system", "content": "You are..."},
        {"role": "user", "content": "Q1"},
        {"role": "tool-call", "content": "Calling tools: final_answer"},
        {"role": "tool-response", "content": "Observation: A1"},
        {"role": "user", "content": "Q2"},
        {"role": "tool-call", "content": "Calling tools: lookup"},
        {"role": "tool-response", "content": "Observation: 42"},
    ]
    assert exchange_input(history) == "Q2"
    assert (
        exchange_input(
            [{"role": "user", "content": "a"}, {"role": "system", "content": "s"}, {"role": "user", "content": "b"}]
        )
        == "a\nb"
    )


def test_a_model_call_with_messages_is_not_refilled_from_its_raw_body() -> None:
    """A tool-call answer has messages without text: the raw response body (LangChain's LLMResult) does not fill it."""
    span = _span(
        **{
            "openinference.span.kind": "LLM",
            "llm.input_messages.0.message.role": "user",
            "llm.input_messages.0.message.content": "Q",
            "llm.output_messages.0.message.role": "assistant",
            "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "lookup",
            "output.value": json.dumps({"generations": [[{"text": "", "type": "ChatGeneration"}]]}),
        }
    )
    found = content(span)
    assert (found.user, found.answer) == ("Q", None)


def test_framework_agent_names() -> None:
    smolagents = _span("refund_agent.run", **{"openinference.span.kind": "AGENT", "smolagents.max_steps": 5})
    graph = _span("refund_agent", **{"openinference.span.kind": "AGENT", "metadata": '{"ls_integration": "langgraph"}'})
    node = _span(
        "agent",
        **{
            "openinference.span.kind": "AGENT",
            "metadata": '{"ls_integration": "langgraph", "langgraph_node": "agent"}',
        },
    )
    unnamed = _span("LangGraph", **{"openinference.span.kind": "AGENT", "metadata": '{"ls_integration": "langgraph"}'})
    step = _span("BaseWorkflowAgent.setup_agent", **{"openinference.span.kind": "CHAIN",
                 "output.value": "AgentSetup(input=[4 items], current_agent_name='refund_agent')"})  # fmt: skip
    assert [framework_agent(s) for s in (smolagents, graph, node, unnamed, step)] == [
        "refund_agent", "refund_agent", None, None, "refund_agent"
    ]  # fmt: skip
    create_agent = '{"ls_integration": "langchain_create_agent", "lc_agent_name": "booking_agent"}'
    model_call = _span("ChatOpenAI", **{"openinference.span.kind": "LLM", "metadata": create_agent})
    assert framework_agent(model_call) == "booking_agent"  # langchain's create_agent names every run of the agent
    event = extract(_span("BaseWorkflowAgent.setup_agent", **{**step.attributes, "session.id": "c"}))
    assert event is not None and event.turn is None and event.agent == "refund_agent" and event.agent_named


def test_crewai_task_outputs_and_task_template() -> None:
    task_output = {"description": "Q", "expected_output": "one sentence", "raw": "A", "messages": []}
    crew_output = {"raw": "A", "pydantic": None, "tasks_output": [task_output]}
    agent = _span(
        "refund_agent._execute_core",
        **{
            "openinference.span.kind": "AGENT",
            "crew_key": "k",
            "graph.node.id": "refund_agent",
            "input.value": json.dumps({"agent": {"role": "refund_agent", "backstory": "You are..."}, "context": ""}),
            "output.value": json.dumps(task_output),
        },
    )
    found = content(agent)
    assert (found.user, found.answer) == ("Q", "A") and framework_agent(agent) == "refund_agent"
    root = _span("Crew_1.kickoff", **{"openinference.span.kind": "CHAIN", "output.value": json.dumps(crew_output)})
    assert (content(root).user, content(root).answer) == ("Q", "A")
    template = "\nCurrent Task: Q?\n\nThis is the expected criteria for your final answer: one sentence.\nyou MUST..."
    assert (
        exchange_input([{"role": "system", "content": "You are..."}, {"role": "user", "content": template}]) == template
    )
    model = _span(**{"openinference.span.kind": "LLM", "llm.input_messages.0.message.role": "user",
                     "llm.input_messages.0.message.content": template})  # fmt: skip
    assert content(model).user == "Q?"


def test_a_framework_helper_marked_llm_is_not_a_call() -> None:
    """LlamaIndex's `_prepare_chat_with_tools` is an LLM-kind span over framework objects: no turn, not even an empty
    one (an empty model call would count as an exchange whose text was not captured)."""
    helper = _span(
        "OpenAI._prepare_chat_with_tools",
        **{
            "session.id": "c",
            "openinference.span.kind": "LLM",
            "input.value": json.dumps({"tools": ["<FunctionTool object>"], "user_msg": None, "chat_history": []}),
            "output.value": json.dumps({"messages": ["ChatMessage(role=<MessageRole.USER: 'user'>, blocks=[])"]}),
        },
    )
    assert extract(helper) is None
    capture_off = _span(**{"session.id": "c", "openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-mini"})
    event = extract(capture_off)
    assert event is not None and event.turn is not None and not event.turn.judgeable  # still counted


def test_a_graph_named_without_agent_is_still_the_agent() -> None:
    """OpenInference marks a LangChain run AGENT only when its name contains "agent": a graph named `refund_desk` is a
    CHAIN span, and its name is the agent's all the same; its nodes (`langgraph_node`) and the default names are not."""
    desk = _span("refund_desk", **{"openinference.span.kind": "CHAIN", "metadata": '{"ls_integration": "langgraph"}'})
    tools_node = _span(
        "tools",
        **{"openinference.span.kind": "CHAIN", "metadata": '{"ls_integration": "langgraph", "langgraph_node": "x"}'},
    )
    default = _span("LangGraph", **{"openinference.span.kind": "CHAIN", "metadata": '{"ls_integration": "langgraph"}'})
    plain_chain = _span("RunnableSequence", **{"openinference.span.kind": "CHAIN", "metadata": "{}"})
    assert [framework_agent(s) for s in (desk, tools_node, default, plain_chain)] == ["refund_desk", None, None, None]


def test_a_vendor_operation_with_a_model_is_a_model_call() -> None:
    """A GenAI span naming its model or provider is a model call whatever its operation is called (agento11y's
    `generateText`/`streamText`), so a content-less one is a turn (failed empty, heard); steps stay steps."""
    from tracejudge.consumer.adapters import _conventions

    generation = _span("generateText gpt-4o-mini", **{"gen_ai.operation.name": "generateText",
                       "gen_ai.request.model": "gpt-4o-mini", "gen_ai.conversation.id": "c",
                       "agento11y.sdk.name": "sdk-python"})  # fmt: skip
    tool = _span("execute_tool x", **{"gen_ai.operation.name": "execute_tool", "gen_ai.provider.name": "openai"})
    plain = _span("GET /", **{"http.method": "GET"})
    assert _conventions.model_call(generation) is _conventions.AGENTO11Y
    assert _conventions.model_call(tool) is None and _conventions.model_call(plain) is None
    event = extract(generation)
    assert event is not None and event.turn is not None and not event.turn.judgeable
