"""Decoding (OTLP protobuf and JSON), the span conventions' readers and the body parsers (their shapes come from
the libraries' source; proof on real recordings is tests/consumer/test_interop.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracejudge.consumer.adapters import extract, trace_contexts
from tracejudge.consumer.adapters._text import exchange_input, input_from_body, output_from_body
from tracejudge.consumer.decode import DecodedSpan, MalformedRecord, SpanEvent, decode_record


def span(attributes: dict, *, error: bool = False, resource: dict | None = None) -> DecodedSpan:
    return DecodedSpan("ab" * 16, "cd" * 8, "", "s", 1, 2, attributes, error, resource or {})


def test_trailing_user_messages_join_by_line_and_a_messages_text_parts_join_as_they_are() -> None:
    """The joins the golden fixtures do not pin (each of their messages is one part): the user's trailing messages
    join with a newline, one message's text parts with nothing, and a tool call between them is not text."""
    event = extract(
        span(
            {
                "gen_ai.conversation.id": "c1",
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.input.messages": json.dumps(
                    [
                        {"role": "user", "parts": [{"type": "text", "content": "first"}]},
                        {
                            "role": "user",
                            "parts": [{"type": "text", "content": "Hello "}, {"type": "text", "content": "world"}],
                        },
                    ]
                ),
                "gen_ai.output.messages": json.dumps(
                    [
                        {
                            "role": "assistant",
                            "parts": [
                                {"type": "text", "content": "one"},
                                {"type": "tool_call", "name": "lookup"},
                                {"type": "text", "content": " two"},
                            ],
                        }
                    ]
                ),
            }
        )
    )
    assert event is not None and event.turn is not None
    assert (event.turn.input, event.turn.output) == ("first\nHello world", "one two")


def test_genai_span_of_another_instrumentation() -> None:
    event = extract(
        span(
            {
                "gen_ai.conversation.id": "c1",
                "gen_ai.operation.name": "chat",
                "gen_ai.input.messages": json.dumps(
                    [
                        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
                        {"role": "user", "parts": [{"type": "text", "content": "first"}]},
                        {"role": "assistant", "parts": [{"type": "text", "content": "earlier answer"}]},
                        {"role": "user", "parts": [{"type": "text", "content": "latest question"}]},
                    ]
                ),
                "gen_ai.output.messages": json.dumps([{"role": "assistant", "content": "the answer"}]),
            }
        )
    )
    assert event is not None and event.turn is not None
    assert (event.conversation_id, event.turn.input, event.turn.output) == ("c1", "latest question", "the answer")


def test_openinference_span() -> None:
    event = extract(
        span(
            {
                "session.id": "s-9",
                "openinference.span.kind": "LLM",
                "llm.input_messages.0.message.role": "system",
                "llm.input_messages.0.message.content": "sys",
                "llm.input_messages.1.message.role": "user",
                "llm.input_messages.1.message.content": "hello there",
                "llm.output_messages.0.message.role": "assistant",
                "llm.output_messages.0.message.content": "hi!",
            },
            resource={"service.name": "phoenix-app"},
        )
    )
    assert event is not None and event.turn is not None
    assert (event.conversation_id, event.agent, event.turn.input, event.turn.output) == (
        "s-9",
        "phoenix-app",
        "hello there",
        "hi!",
    )
    simple = extract(span({"session.id": "s-10", "input.value": "q", "output.value": "a", "agent.name": "bot"}))
    assert simple is not None and simple.turn is not None and (simple.agent, simple.turn.input) == ("bot", "q")


def test_openllmetry_span() -> None:
    event = extract(
        span(
            {
                "traceloop.association.properties.session_id": "t-1",
                "traceloop.workflow.name": "support",
                "gen_ai.prompt.0.role": "user",
                "gen_ai.prompt.0.content": "where is my order?",
                "gen_ai.completion.0.role": "assistant",
                "gen_ai.completion.0.content": "on its way",
            },
            error=True,
        )
    )
    assert event is not None and event.turn is not None
    assert (event.conversation_id, event.agent, event.turn.input, event.turn.output, event.turn.is_error) == (
        "t-1",
        "support",
        "where is my order?",
        "on its way",
        True,
    )


def test_other_spans_are_skipped() -> None:
    assert extract(span({"http.method": "GET"})) is None
    assert extract(span({"gen_ai.conversation.id": "c", "gen_ai.operation.name": "execute_tool"})) is None
    # A model call without captured content is still a turn: counted, then judged `empty_conversation`.
    silent = extract(span({"gen_ai.conversation.id": "c", "gen_ai.operation.name": "chat"}))
    assert silent is not None and silent.turn is not None and not silent.turn.judgeable


def test_otlp_json_record() -> None:
    document = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "name": "invoke_agent x",
                                "startTimeUnixNano": "1700000000000000000",
                                "endTimeUnixNano": "1700000000100000000",
                                "status": {"code": 2},
                                "attributes": [
                                    {"key": "gen_ai.conversation.id", "value": {"stringValue": "json-1"}},
                                    {"key": "tracejudge.turn.index", "value": {"intValue": "3"}},
                                    {
                                        "key": "gen_ai.input.messages",
                                        "value": {"stringValue": '[{"role":"user","content":"q"}]'},
                                    },
                                ],
                            }
                        ]
                    }
                ],
            }
        ]
    }
    (decoded,) = decode_record(json.dumps(document).encode())
    assert decoded.trace_id == "5b8efff798038103d269b633813fc60c" and decoded.is_error
    assert decoded.resource == {"service.name": "svc"} and decoded.attributes["tracejudge.turn.index"] == 3
    event = extract(decoded)
    assert event is not None and event.turn is not None and event.turn.index == 3 and event.turn.input == "q"


def _protobuf_record(resource: list[tuple[str, str]], spans: int = 2) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    for key, value in resource:
        pair = resource_spans.resource.attributes.add()
        pair.key, pair.value.string_value = key, value
    scope_spans = resource_spans.scope_spans.add()
    for i in range(spans):
        one = scope_spans.spans.add()
        one.trace_id, one.span_id, one.name = b"\x01" * 16, bytes([i + 1]) * 8, "chat"
        pair = one.attributes.add()
        pair.key, pair.value.string_value = "gen_ai.conversation.id", "c"
    return request.SerializeToString()


@pytest.mark.parametrize(
    "resource",
    [
        [("service.name", "svc"), ("host.name", "h")],
        [("service.name", "first"), ("telemetry.sdk.name", "opentelemetry"), ("service.name", "last")],
        [("host.name", "h")],
        [],
    ],
)
def test_the_hot_path_reads_the_resources_service_name_as_the_full_decode_does(resource: list[tuple[str, str]]) -> None:
    """The hot path (`relevant` given) reads only `service.name`, on first asking, once per resource: it must say
    what the whole resource's attributes say (the last one wins), to every span of the record, asked or not."""
    from tracejudge.consumer.adapters import may_matter
    from tracejudge.tracer.identity import service_name

    value = _protobuf_record(resource)
    full = decode_record(value)
    hot = decode_record(value, relevant=may_matter)
    expected = full[0].resource.get("service.name")
    assert expected == dict(resource).get("service.name")
    assert [span.resource.get("service.name") for span in hot] == [expected, expected]
    assert dict(hot[1].resource) == ({"service.name": expected} if expected is not None else {})
    assert service_name(hot[0].resource) == service_name(full[0].resource)


@pytest.mark.parametrize("value", [b"", b"\x00\x01", b"{}", b'{"resourceSpans": 5}', b"x" * 10])
def test_unreadable_records_are_malformed(value: bytes) -> None:
    with pytest.raises(MalformedRecord):
        decode_record(value)


def test_oversized_record_is_malformed() -> None:
    with pytest.raises(MalformedRecord, match="exceeds"):
        decode_record(b"\x0a" * 100, max_bytes=50)


# -- clean text first, bodies as a fallback (issue 13) -----------------------------------------------------------

HISTORY = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "first question"},
    {"role": "assistant", "content": "first answer"},
    {"role": "user", "content": "second question"},
]


def test_a_turn_is_the_last_exchange_never_the_history_or_the_system_prompt() -> None:
    assert exchange_input(HISTORY) == "second question"
    assert exchange_input(HISTORY[:2]) == "first question"
    assert exchange_input([{"role": "system", "content": "only a system prompt"}]) is None
    tool_loop = [
        *HISTORY,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {"name": "f"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "1"},
    ]
    assert exchange_input(tool_loop) == "second question"
    two_user_messages = [*HISTORY, {"role": "user", "content": "and a follow-up"}]
    assert exchange_input(two_user_messages) == "second question\nand a follow-up"


@pytest.mark.parametrize(
    ("body", "want"),
    [
        (json.dumps({"model": "m", "messages": HISTORY}), "second question"),  # chat completions request
        (json.dumps({"model": "m", "input": "plain input"}), "plain input"),  # Responses API, string input
        (
            json.dumps(
                {
                    "model": "m",
                    "input": [
                        {"role": "user", "content": [{"type": "input_text", "text": "old"}]},
                        {
                            "type": "message",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": "old answer"}],
                        },
                        {"type": "function_call", "name": "f", "arguments": "{}"},
                        {"role": "user", "content": [{"type": "input_text", "text": "new question"}]},
                    ],
                }
            ),
            "new question",
        ),
        (
            json.dumps(
                {"system": "be nice", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
            ),
            "hi",
        ),  # Anthropic messages
        (json.dumps({"args": ["What is my balance?"], "kwargs": {}}), "What is my balance?"),  # @workflow wrapper
        (json.dumps({"args": [], "kwargs": {"session_id": "s1", "question": "kw question"}}), "kw question"),
        (json.dumps({"args": ["RefundDesk", "on a method"], "kwargs": {}}), "on a method"),  # self: class name
        (json.dumps("a JSON-quoted string"), "a JSON-quoted string"),
        ("plain text stays { as it is", "plain text stays { as it is"),
        ("[1] starts like JSON but is not", "[1] starts like JSON but is not"),
        (json.dumps({"messages": [{"role": "system", "content": "s"}]}), None),  # known shape, no user text
        ('{"unknown": 1, "shape": 2}', '{"unknown": 1, "shape": 2}'),  # unknown JSON stays: no lost turn
    ],
)
def test_input_bodies(body: str, want: str | None) -> None:
    assert input_from_body(body) == want


COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "the answer"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1},
}
CHUNKS = [
    {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
    {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "the "}}]},
    {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "answer"}}]},
]


@pytest.mark.parametrize(
    ("body", "want"),
    [
        (json.dumps(COMPLETION), "the answer"),
        (json.dumps(CHUNKS), "the answer"),  # joined stream chunks, as a list
        ("".join(json.dumps(c) for c in CHUNKS), "the answer"),  # ...concatenated
        ("\n\n".join(f"data: {json.dumps(c)}" for c in CHUNKS) + "\n\ndata: [DONE]", "the answer"),  # ...SSE
        (
            json.dumps(
                {
                    "id": "resp_1",
                    "object": "response",
                    "output": [
                        {"type": "reasoning", "summary": []},
                        {
                            "type": "message",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": "the answer", "annotations": []}],
                        },
                    ],
                }
            ),
            "the answer",
        ),  # Responses API
        (
            json.dumps(
                [
                    {"type": "response.created", "response": {}},
                    {"type": "response.output_text.delta", "delta": "the "},
                    {"type": "response.output_text.delta", "delta": "answer"},
                ]
            ),
            "the answer",
        ),
        (
            json.dumps({"type": "message", "role": "assistant", "content": [{"type": "text", "text": "the answer"}]}),
            "the answer",
        ),  # Anthropic
        (json.dumps("the answer"), "the answer"),  # a JSON-quoted return value
        ("the answer", "the answer"),
        ('{"answer_json": {"a": 1}}', '{"answer_json": {"a": 1}}'),  # a structured output, as it is
        (json.dumps({"choices": [{"message": {"role": "assistant", "tool_calls": [{"id": "1"}]}}]}), None),
        ("[" * 5000, "[" * 5000),  # too deep for the JSON parser: plain text
    ],
)
def test_output_bodies(body: str, want: str | None) -> None:
    assert output_from_body(body) == want


KEYS_SEEN = [
    "role", "content", "parts", "type", "text", "messages", "input", "output", "choices", "message", "delta",
    "args", "kwargs", "output_text", "candidates", "response", "final_output", "contents", "x",
]  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS_SEEN), inner, max_size=4),
        max_leaves=25,
    )
)
def test_body_parsers_never_raise(value: object) -> None:
    for candidate in (value, json.dumps(value)):
        for parse in (input_from_body, output_from_body, exchange_input):
            result = parse(candidate)
            assert result is None or isinstance(result, str)


def test_openinference_message_contents_and_history() -> None:
    event = extract(
        span(
            {
                "session.id": "s",
                "openinference.span.kind": "LLM",
                "input.value": json.dumps({"messages": HISTORY}),
                "output.value": json.dumps(COMPLETION),
                "llm.input_messages.0.message.role": "system",
                "llm.input_messages.0.message.content": "sys",
                "llm.input_messages.1.message.role": "user",
                "llm.input_messages.1.message.contents.0.message_content.type": "text",
                "llm.input_messages.1.message.contents.0.message_content.text": "from ",
                "llm.input_messages.1.message.contents.1.message_content.type": "image",
                "llm.input_messages.1.message.contents.1.message_content.image.image.url": "data:...",
                "llm.input_messages.1.message.contents.2.message_content.type": "text",
                "llm.input_messages.1.message.contents.2.message_content.text": "parts",
                "llm.output_messages.0.message.role": "assistant",
                "llm.output_messages.0.message.contents.0.message_content.type": "text",
                "llm.output_messages.0.message.contents.0.message_content.text": "clean answer",
            }
        )
    )
    assert event is not None and event.turn is not None
    assert (event.turn.input, event.turn.output) == ("from parts", "clean answer")


def test_openinference_bodies_only_when_no_messages() -> None:
    event = extract(
        span({"session.id": "s", "input.value": json.dumps({"messages": HISTORY}), "output.value": json.dumps(CHUNKS)})
    )
    assert event is not None and event.turn is not None
    assert (event.turn.input, event.turn.output) == ("second question", "the answer")


def test_openllmetry_workflow_wrapper_and_list_content() -> None:
    workflow = extract(
        span(
            {
                "traceloop.association.properties.session_id": "t",
                "traceloop.span.kind": "workflow",
                "traceloop.entity.name": "refund_desk",
                "traceloop.entity.input": json.dumps({"args": ["a question"], "kwargs": {}}),
                "traceloop.entity.output": json.dumps("an answer"),
            }
        )
    )
    assert workflow is not None and workflow.turn is not None
    assert (workflow.agent, workflow.turn.input, workflow.turn.output) == ("refund_desk", "a question", "an answer")
    listed = extract(
        span(
            {
                "traceloop.association.properties.chat_id": "t2",
                "gen_ai.prompt.0.role": "user",
                "gen_ai.prompt.0.content": json.dumps([{"type": "text", "text": "list content"}]),
                "gen_ai.completion.0.content": "reply",
            }
        )
    )
    assert listed is not None and listed.turn is not None
    assert (listed.conversation_id, listed.turn.input, listed.turn.output) == ("t2", "list content", "reply")


def test_genai_parts_leave_out_reasoning_and_tool_calls() -> None:
    output = [
        {
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "content": "thinking..."},
                {"type": "tool_call", "name": "f", "arguments": {}},
                {"type": "text", "content": "visible answer"},
            ],
        }
    ]
    event = extract(
        span(
            {
                "gen_ai.conversation.id": "g",
                "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "q"}]}]),
                "gen_ai.output.messages": json.dumps(output),
            }
        )
    )
    assert event is not None and event.turn is not None and event.turn.output == "visible answer"


def test_genai_content_on_span_events() -> None:
    details = span({"gen_ai.conversation.id": "e1", "gen_ai.operation.name": "chat"})
    details.events = [
        SpanEvent(
            "gen_ai.client.inference.operation.details",
            {
                "gen_ai.input.messages": [
                    {"role": "user", "parts": [{"type": "text", "content": "event question"}]},
                ],
                "gen_ai.output.messages": [
                    {"role": "assistant", "parts": [{"type": "text", "content": "event answer"}]},
                ],
            },
        )
    ]
    event = extract(details)
    assert event is not None and event.turn is not None
    assert (event.turn.input, event.turn.output) == ("event question", "event answer")
    legacy = span({"session.id": "e2"})
    legacy.events = [
        SpanEvent("gen_ai.system.message", {"content": "system prompt"}),
        SpanEvent("gen_ai.user.message", {"content": "legacy question"}),
        SpanEvent("gen_ai.choice", {"gen_ai.event.content": json.dumps({"message": {"content": "legacy answer"}})}),
    ]
    event = extract(legacy)
    assert event is not None and event.turn is not None
    assert (event.turn.input, event.turn.output) == ("legacy question", "legacy answer")


def test_pydantic_ai_agent_run_span() -> None:
    history = [
        {"role": "user", "parts": [{"type": "text", "content": "q1"}]},
        {"role": "assistant", "parts": [{"type": "text", "content": "a1"}]},
        {"role": "user", "parts": [{"type": "text", "content": "q2"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "name": "lookup"}]},
        {"role": "user", "parts": [{"type": "tool_call_response", "response": "42"}]},
        {"role": "assistant", "parts": [{"type": "text", "content": "a2"}]},
    ]
    event = extract(
        span(
            {
                "gen_ai.conversation.id": "p",
                "gen_ai.operation.name": "invoke_agent",
                "agent_name": "refunds",
                "pydantic_ai.all_messages": json.dumps(history),
                "final_result": "a2",
            }
        )
    )
    assert event is not None and event.turn is not None
    assert (event.agent, event.turn.input, event.turn.output) == ("refunds", "q2", "a2")


def test_a_span_without_an_id_goes_with_its_trace() -> None:
    parent = span({"gen_ai.conversation.id": "c", "gen_ai.agent.name": "bot", "gen_ai.operation.name": "invoke_agent"})
    child = DecodedSpan(
        "ab" * 16,
        "ef" * 8,
        "cd" * 8,
        "chat",
        1,
        2,
        {"gen_ai.input.messages": json.dumps(HISTORY), "gen_ai.output.messages": json.dumps([{"content": "a"}])},
        resource={"service.name": "svc"},
    )
    traces = trace_contexts([child, parent])
    assert extract(child) is None
    event = extract(child, traces)
    assert event is not None and event.turn is not None
    assert (event.conversation_id, event.agent, event.turn.input) == ("c", "bot", "second question")


def test_tool_spans_are_steps_not_turns() -> None:
    assert (
        extract(span({"session.id": "s", "openinference.span.kind": "TOOL", "input.value": "x", "output.value": "y"}))
        is None
    )
    assert extract(span({"gen_ai.conversation.id": "s", "gen_ai.operation.name": ["unhashable"]})) is None
