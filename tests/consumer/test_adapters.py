"""Decoding (OTLP protobuf and JSON) and the three span conventions' adapters."""

from __future__ import annotations

import json

import pytest

from tracejudge.consumer.adapters import extract
from tracejudge.consumer.decode import DecodedSpan, MalformedRecord, decode_record


def span(attributes: dict, *, error: bool = False, resource: dict | None = None) -> DecodedSpan:
    return DecodedSpan("ab" * 16, "cd" * 8, "", "s", 1, 2, attributes, error, resource or {})


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
    assert extract(span({"gen_ai.conversation.id": "c", "gen_ai.operation.name": "chat"})) is None


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


@pytest.mark.parametrize("value", [b"", b"\x00\x01", b"{}", b'{"resourceSpans": 5}', b"x" * 10])
def test_unreadable_records_are_malformed(value: bytes) -> None:
    with pytest.raises(MalformedRecord):
        decode_record(value)


def test_oversized_record_is_malformed() -> None:
    with pytest.raises(MalformedRecord, match="exceeds"):
        decode_record(b"\x0a" * 100, max_bytes=50)
