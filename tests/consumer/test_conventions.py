"""Text conventions learned from the libraries' source: Langfuse observations, MLflow span inputs/outputs and chat
messages, the Vercel AI SDK's ai.* attributes, Strands/Bedrock content blocks; and the spans that look like model
calls without text (a turn all the same, counted by convention). Real recordings: tests/consumer/test_interop.py."""

from __future__ import annotations

import json
import logging

from prometheus_client import CollectorRegistry

from tests.support.assembly import fold
from tracejudge.consumer.adapters import extract, textless_model_call
from tracejudge.consumer.adapters._text import content_text, exchange_input
from tracejudge.consumer.conversation.table import ConversationTable
from tracejudge.consumer.conversation.textless import TextlessSpans
from tracejudge.consumer.decode import DecodedSpan, SpanEvent
from tracejudge.consumer.emit.prometheus import ConsumerInstruments

HISTORY = [
    {"role": "system", "content": "be exact"},
    {"role": "user", "content": "first question"},
    {"role": "assistant", "content": "first answer"},
    {"role": "user", "content": "second question"},
]


def span(attributes: dict, *, name: str = "s", scope: str = "", events: list | None = None) -> DecodedSpan:
    return DecodedSpan(
        "ab" * 16, "cd" * 8, "", name, 1, 2, attributes, False, {"service.name": "svc"}, events or [], scope
    )


def texts(s: DecodedSpan) -> tuple[str | None, str | None]:
    event = extract(s)
    assert event is not None and event.turn is not None
    return event.turn.input, event.turn.output


def test_langfuse_generation_and_observed_function() -> None:
    # langfuse/_client/attributes.py: input/output JSON-serialised; langfuse.openai's generation output is the message.
    generation = span(
        {
            "session.id": "c1",
            "langfuse.observation.type": "generation",
            "langfuse.observation.input": json.dumps(HISTORY),
            "langfuse.observation.output": json.dumps({"role": "assistant", "content": "second answer"}),
        }
    )
    assert texts(generation) == ("second question", "second answer")
    observed = span(
        {
            "langfuse.session.id": "c1",  # v3 before session.id
            "langfuse.observation.type": "agent",
            "langfuse.observation.input": json.dumps({"args": ["second question"], "kwargs": {}}),
            "langfuse.observation.output": json.dumps("second answer"),
        }
    )
    assert texts(observed) == ("second question", "second answer")
    tool = span({"session.id": "c1", "langfuse.observation.type": "tool", "langfuse.observation.input": "{}"})
    assert extract(tool) is None  # a tool's input and output are never a turn


def test_mlflow_span_inputs_outputs_chat_messages_and_types() -> None:
    # mlflow/tracing/constant.py: every value JSON-encoded, the span type included.
    chat = span(
        {
            "gen_ai.conversation.id": "c1",
            "mlflow.spanType": '"CHAT_MODEL"',
            "mlflow.spanInputs": json.dumps({"messages": HISTORY, "model": "m"}),
            "mlflow.spanOutputs": json.dumps({"choices": [{"message": {"role": "assistant", "content": "a2"}}]}),
        }
    )
    assert texts(chat) == ("second question", "a2")
    messages = span(
        {
            "gen_ai.conversation.id": "c1",
            "mlflow.spanType": '"LLM"',
            "mlflow.chat.messages": json.dumps([*HISTORY, {"role": "assistant", "content": "a2"}]),
            "mlflow.spanInputs": json.dumps({"anything": "else"}),
        }
    )
    assert texts(messages) == ("second question", "a2")
    agent = span(
        {
            "gen_ai.conversation.id": "c1",
            "mlflow.spanType": '"AGENT"',
            "mlflow.spanInputs": json.dumps({"question": "second question"}),
            "mlflow.spanOutputs": json.dumps("a2"),
        }
    )
    assert texts(agent) == ("second question", "a2")
    tool = span({"gen_ai.conversation.id": "c1", "mlflow.spanType": '"TOOL"', "mlflow.spanOutputs": '"42"'})
    assert extract(tool) is None


def test_vercel_ai_call_and_step_spans() -> None:
    # packages/ai telemetry: the call span's ai.prompt, the step's ai.prompt.messages (content as parts).
    step_messages = [
        {"role": "system", "content": "be exact"},
        {"role": "user", "content": [{"type": "text", "text": "first question"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "first answer"}]},
        {"role": "user", "content": [{"type": "text", "text": "second question"}]},
    ]
    step = span(
        {
            "ai.telemetry.metadata.sessionId": "c1",
            "ai.operationId": "ai.generateText.doGenerate",
            "ai.prompt.messages": json.dumps(step_messages),
            "ai.response.text": "second answer",
        }
    )
    assert texts(step) == ("second question", "second answer")
    call = span(
        {
            "ai.telemetry.metadata.sessionId": "c1",
            "ai.operationId": "ai.streamText",
            "ai.prompt": json.dumps({"system": "be exact", "messages": HISTORY}),
            "ai.response.text": "second answer",
        }
    )
    assert texts(call) == ("second question", "second answer")
    prompt_only = span(
        {"ai.telemetry.metadata.sessionId": "c1", "ai.operationId": "ai.generateText", "ai.prompt": '{"prompt":"q"}'}
    )
    assert texts(prompt_only) == ("q", None)
    tool = span({"ai.telemetry.metadata.sessionId": "c1", "ai.operationId": "ai.toolCall", "ai.toolCall.result": "1"})
    assert extract(tool) is None


def test_strands_content_blocks_on_default_convention_events() -> None:
    # strands/telemetry/tracer.py (legacy conventions): gen_ai.{role}.message events, content = JSON content blocks.
    events = [
        SpanEvent("gen_ai.system.message", {"content": json.dumps([{"text": "be exact"}])}),
        SpanEvent("gen_ai.user.message", {"content": json.dumps([{"text": "first question"}])}),
        SpanEvent("gen_ai.assistant.message", {"content": json.dumps([{"text": "first answer"}])}),
        SpanEvent("gen_ai.user.message", {"content": json.dumps([{"text": "second question"}])}),
        SpanEvent("gen_ai.choice", {"message": "second answer", "finish_reason": "end_turn"}),
    ]
    agent = span(
        {"session.id": "c1", "gen_ai.operation.name": "invoke_agent", "gen_ai.system": "strands-agents"},
        events=events,
    )
    assert texts(agent) == ("second question", "second answer")


def test_content_blocks_only_when_every_item_is_a_known_block() -> None:
    assert content_text('[{"text": "a"}, {"toolUse": {"name": "t"}}, {"text": "b"}]') == "ab"
    assert content_text('[{"text": "a", "note": 1}]') == '[{"text": "a", "note": 1}]'  # the user's own JSON
    assert content_text('[{"name": "x"}]') == '[{"name": "x"}]'
    bedrock = [{"role": "user", "content": [{"text": "q"}]}, {"role": "user", "content": [{"toolResult": {}}]}]
    assert exchange_input(bedrock) == "q"


def test_text_less_model_calls_are_turns_named_by_convention() -> None:
    cases = {
        "langfuse": {"session.id": "c1", "langfuse.observation.type": "generation"},
        "mlflow": {"gen_ai.conversation.id": "c1", "mlflow.spanType": '"CHAT_MODEL"'},
        "vercel_ai": {"ai.telemetry.metadata.sessionId": "c1", "ai.operationId": "ai.generateText"},
        "openinference": {"session.id": "c1", "openinference.span.kind": "LLM"},
        "openllmetry": {"session.id": "c1", "llm.request.type": "chat"},
        "genai": {"gen_ai.conversation.id": "c1", "gen_ai.operation.name": "chat"},
        "google_adk": {"gen_ai.conversation.id": "c1", "gen_ai.system": "gcp.vertex.agent"},
    }
    for name, attributes in cases.items():
        s = span(attributes, name="call_llm" if name == "google_adk" else "s")
        event = extract(s)
        assert event is not None and event.turn is not None and not event.turn.judgeable, name
        convention = textless_model_call(s, event)
        assert convention is not None and convention.name == name and convention.hint, name
    with_text = span({"session.id": "c1", "langfuse.observation.type": "generation", "langfuse.observation.input": "q"})
    assert textless_model_call(with_text, extract(with_text)) is None
    plain = span({"session.id": "c1", "http.method": "GET"})
    assert textless_model_call(plain, extract(plain)) is None


def test_text_less_spans_counted_by_convention_and_told_once_per_scope(caplog) -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "shop"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("langfuse-sdk")
    for conversation in ("c1", "c1", None):
        attributes = {"langfuse.observation.type": "generation"}
        if conversation:
            attributes["session.id"] = conversation
        tracer.start_span("gen", attributes=attributes).end()
    registry = CollectorRegistry()
    table = ConversationTable()
    textless = TextlessSpans(ConsumerInstruments(registry).record_textless_span)
    with caplog.at_level(logging.WARNING, logger="tracejudge.consumer"):
        values = [encode_spans([finished]).SerializeToString() for finished in exporter.get_finished_spans()]
        fold(table, values, textless=textless)

    def count(outcome: str) -> float:
        labels = {"convention": "langfuse", "outcome": outcome}
        return registry.get_sample_value("tracejudge_textless_llm_spans_total", labels) or 0.0

    assert (count("counted_as_turn"), count("no_conversation_id")) == (2.0, 1.0)
    told = [r.getMessage() for r in caplog.records if "carry no text" in r.getMessage()]
    assert len(told) == 1, told  # once per service and scope
    assert "'shop'" in told[0] and "'langfuse-sdk'" in told[0] and "langfuse.observation.type" in told[0]
    assert "LANGFUSE_OBSERVE_DECORATOR_IO_CAPTURE_ENABLED" in told[0]
    state = table.get("c1")
    assert state is not None and len(state.spans) == 2


def test_content_less_agent_run_with_a_tool_is_one_exchange() -> None:
    # google-adk 2.13 without content capture (recorded adk_no_content, plus the tool step of a tool-using turn):
    # invoke_workflow > invoke_agent > generate_content (asks for the tool), execute_tool, generate_content (answers).
    def adk(span_id: str, parent: str, name: str, start: int, end: int, trace: str, **attributes: str) -> DecodedSpan:
        attributes = {"gen_ai.conversation.id": "c1", "gen_ai.agent.name": "refund_agent", **attributes}
        return DecodedSpan(
            trace * 32,
            (trace + span_id) * 8,
            (trace + parent) * 8 if parent else "",
            name,
            start,
            end,
            attributes,
            False,
            {"service.name": "svc"},
            [],
            "gcp.vertex.agent",
        )

    table = ConversationTable()
    for turn, trace in enumerate("abc"):
        base = turn * 100
        spans = [
            adk(
                "1",
                "",
                "invoke_workflow refund_agent",
                base,
                base + 90,
                trace,
                **{"gen_ai.operation.name": "invoke_workflow"},
            ),
            adk(
                "2",
                "1",
                "invoke_agent refund_agent",
                base + 1,
                base + 89,
                trace,
                **{"gen_ai.operation.name": "invoke_agent"},
            ),
            adk(
                "3",
                "2",
                "generate_content m",
                base + 2,
                base + 10,
                trace,
                **{"gen_ai.operation.name": "generate_content"},
            ),
        ]
        if turn == 0:
            spans += [
                adk(
                    "4",
                    "2",
                    "execute_tool lookup",
                    base + 11,
                    base + 20,
                    trace,
                    **{"gen_ai.operation.name": "execute_tool"},
                ),
                adk(
                    "5",
                    "2",
                    "generate_content m",
                    base + 21,
                    base + 30,
                    trace,
                    **{"gen_ai.operation.name": "generate_content"},
                ),
            ]
        for s in spans:
            event = extract(s)
            if event is not None:
                table.apply(event, 0)
    table.advance(table.idle_ms)
    [job] = [dispatch.job for dispatch in table.take_dispatches()]
    assert job.version == 3 and not job.judgeable_exchanges
