"""Every recorded fixture still reads as it did: the events `read_events` yields for each record (conversation id,
agent, turn text and span fields, end markers, feedback), what it says is unreadable, the text-less model calls it
reports (and what the log line would name), and the exchanges each conversation's turns make, over both routes: the
records as our exporter wrote them and re-cut per trace as the OpenTelemetry Collector writes them.

The golden file was written by the decode path before the lazy hot path replaced it (issue 31), so this compares the
old code's outputs with the new code's over all of them. Regenerate ONLY for a deliberate change of the extraction
rules (and say so in the commit): `.venv/bin/python -m tests.consumer.test_read_events_golden`.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider

from tests.consumer.test_interop import FIXTURES_DIR, SETUPS, collector_records, records
from tracejudge.consumer.adapters import (
    RECORD_MARKERS,
    Convention,
    ConversationEvent,
    Turn,
    _conventions,
    may_matter,
    present_attributes,
)
from tracejudge.consumer.conversation.reading import read_events
from tracejudge.consumer.conversation.textless import TextlessSpans
from tracejudge.consumer.decode import DEFAULT_MAX_RECORD_BYTES, decode_record
from tracejudge.consumer.exchanges import exchanges
from tracejudge.tracer.identity import CONVERSATION_ID_KEYS

GOLDEN = FIXTURES_DIR.parent / "read_events_golden.json.gz"
ROUTES = ("exporter", "collector")


class _Recorder(TextlessSpans):
    """What `TextlessSpans.seen` is told, with what its log line would name (service, scope, attributes present)."""

    def __init__(self) -> None:
        super().__init__(lambda convention, outcome: None)
        self.calls: list[dict[str, Any]] = []

    def seen(self, span: Any, convention: Convention, event: ConversationEvent | None) -> None:
        self.calls.append(
            {
                "convention": convention.name,
                "counted": event is not None and event.turn is not None,
                "service": str(span.resource.get("service.name") or "?"),
                "scope": span.scope,
                "present": present_attributes(span),
            }
        )


def _route(setup: str, route: str) -> list[bytes]:
    values = [value for _, value in records(setup)]
    if route == "collector":
        values = [cut for value in values for _, cut in collector_records(value)]
    return values


def _turn(turn: Turn) -> dict[str, Any]:
    return dataclasses.asdict(turn)


def capture(setup: str, route: str) -> dict[str, Any]:
    """What the decode path makes of one fixture over one route."""
    per_record = []
    turns: dict[str, list[Turn]] = {}
    for value in _route(setup, route):
        textless = _Recorder()
        events, failure = read_events(value, max_bytes=DEFAULT_MAX_RECORD_BYTES, textless=textless)
        per_record.append(
            {"events": [dataclasses.asdict(e) for e in events], "failure": failure, "textless": textless.calls}
        )
        for event in events:
            if event.turn is not None:
                turns.setdefault(event.conversation_id, []).append(event.turn)
    return {
        "records": per_record,
        "exchanges": {cid: [_turn(t) for t in exchanges(ts)] for cid, ts in sorted(turns.items())},
    }


def _golden() -> dict[str, Any]:
    return json.loads(gzip.decompress(GOLDEN.read_bytes()))


def test_the_golden_file_covers_every_fixture() -> None:
    assert sorted(_golden()) == sorted(f"{setup}/{route}" for setup in SETUPS for route in ROUTES)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("setup", SETUPS)
def test_read_events_yields_what_it_did(setup: str, route: str) -> None:
    want = _golden()[f"{setup}/{route}"]
    got = json.loads(json.dumps(capture(setup, route)))  # tuples and lists alike, as stored
    assert len(got["records"]) == len(want["records"])
    for index, (new, old) in enumerate(zip(got["records"], want["records"], strict=True)):
        assert new == old, f"record {index}"
    assert got["exchanges"] == want["exchanges"]


# -- the skip: a record that holds nothing for a conversation is parsed (so a broken one is still told), not read --


def test_every_key_that_can_make_an_event_holds_a_record_marker() -> None:
    """A conversation id's keys and the model-call markers: a key a later rule reads must be covered too, or the
    records that carry only it would be skipped unread."""
    keys = (*CONVERSATION_ID_KEYS, *_conventions.MARKERS)
    assert [key for key in keys if not any(marker.decode() in key for marker in RECORD_MARKERS)] == []


def _record(name: str, attributes: dict[str, Any], scope: str = "app") -> bytes:
    span = TracerProvider().get_tracer(scope).start_span(name, attributes=attributes)
    span.end()
    return encode_spans([span]).SerializeToString()


HTTP = {"http.request.method": "GET", "url.full": "http://orders:8080/api/orders", "http.response.status_code": 200}


def test_a_record_without_markers_is_skipped_and_one_with_them_is_read() -> None:
    textless = _Recorder()
    assert not may_matter(_record("GET /api/orders", HTTP))
    assert read_events(_record("GET /api/orders", HTTP), max_bytes=1 << 20, textless=textless) == ([], None)
    # Each kind of marker brings the record back to the full path: a conversation id, a model call without one.
    events, failure = read_events(
        _record("turn", {**HTTP, "session.id": "c-1", "input.value": "hi"}), max_bytes=1 << 20
    )
    assert failure is None and [(e.conversation_id, e.turn and e.turn.input) for e in events] == [("c-1", "hi")]
    assert read_events(
        _record("call_llm", {"gen_ai.operation.name": "chat"}), max_bytes=1 << 20, textless=textless
    ) == ([], None)
    assert [call["convention"] for call in textless.calls] == ["genai"]  # counted and heard, not skipped
    read_events(_record("chat", {}, scope="strands.telemetry.tracer"), max_bytes=1 << 20, textless=textless)
    assert [call["convention"] for call in textless.calls] == ["genai", "strands"]


def test_a_skipped_record_is_still_checked() -> None:
    """Only a record that parses and holds spans is skipped quietly; the others say why, as before."""
    assert read_events(ExportTraceServiceRequest().SerializeToString() or b"\x0a\x00", max_bytes=1 << 20)[1] == (
        "the record holds no spans"
    )
    assert (read_events(b"\x0a\xff\xff", max_bytes=1 << 20)[1] or "").startswith("not an OTLP protobuf trace export")
    assert read_events(_record("GET /", HTTP), max_bytes=10)[1] is not None  # the size limit first


# -- the sift: of a record of several spans, the spans of traces none of whose spans can matter go unbuilt ----------


def _others(count: int) -> ExportTraceServiceRequest:
    """An application's HTTP spans, each its own trace, as the Collector batches them beside an agent's."""
    tracer = TracerProvider().get_tracer("app")
    spans = []
    for n in range(count):
        span = tracer.start_span(f"GET /api/orders/{n}", attributes=HTTP)
        span.end()
        spans.append(span)
    return encode_spans(spans)


def _with_others(value: bytes, count: int = 3) -> bytes:
    merged = ExportTraceServiceRequest.FromString(value)
    merged.resource_spans.extend(_others(count).resource_spans)
    return merged.SerializeToString()


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("setup", SETUPS)
def test_every_fixture_reads_the_same_beside_other_traces_spans(setup: str, route: str) -> None:
    """Each recorded record, batched with other traces' HTTP spans in one export, yields exactly what it yields alone
    (events, failure, text-less reports): the sift drops only spans that could not matter, over every library."""
    for index, value in enumerate(_route(setup, route)):
        if value[:1] == b"{":
            continue  # OTLP JSON is read whole
        alone, beside = _Recorder(), _Recorder()
        got = read_events(_with_others(value), max_bytes=DEFAULT_MAX_RECORD_BYTES, textless=beside)
        assert got == read_events(value, max_bytes=DEFAULT_MAX_RECORD_BYTES, textless=alone), f"record {index}"
        assert beside.calls == alone.calls, f"record {index}"


def test_a_marker_less_span_stays_when_its_trace_holds_a_marked_one() -> None:
    """A span's trace decides, not the span: a child without markers beside its conversation's agent span is built
    (its trace lends it the conversation), other traces' spans are not; a span whose marker stands in a value is kept
    (a span's bytes are searched, as a record's are: a value can only keep more) and yields nothing, quietly."""
    tracer = TracerProvider().get_tracer("agent")
    agent = tracer.start_span("invoke_agent a", attributes={"gen_ai.conversation.id": "c9", "gen_ai.agent.name": "a"})
    child = tracer.start_span("fetch", context=trace.set_span_in_context(agent), attributes=HTTP)
    child.end()
    agent.end()
    value = _with_others(encode_spans([agent, child]).SerializeToString())
    names = [span.name for span in decode_record(value, relevant=may_matter)]
    assert names == ["invoke_agent a", "fetch"]  # the three other traces' spans unbuilt
    assert len(decode_record(value)) == 5
    in_values = _with_others(_record("GET /", {**HTTP, "url.full": "http://x/session?gen_ai.x=1"}))
    assert [span.name for span in decode_record(in_values, relevant=may_matter)] == ["GET /"]
    assert read_events(in_values, max_bytes=1 << 20) == ([], None)


def test_a_model_call_told_by_its_scope_alone_is_reported_beside_other_traces() -> None:
    """Google ADK's `call_llm` span with no attributes is a model call by its scope's name: in a batch with other
    traces' spans it is still built, and reported as a text-less model call."""
    tracer = TracerProvider()
    adk = tracer.get_tracer("gcp.vertex.agent").start_span("call_llm")
    adk.end()
    others = []
    for n in range(2):
        other = tracer.get_tracer("app").start_span(f"GET /{n}", attributes=HTTP)
        other.end()
        others.append(other)
    textless = _Recorder()
    assert read_events(encode_spans([adk, *others]).SerializeToString(), max_bytes=1 << 20, textless=textless) == (
        [],
        None,
    )
    assert [(call["convention"], call["scope"]) for call in textless.calls] == [("google_adk", "gcp.vertex.agent")]


def main() -> None:
    out = {f"{setup}/{route}": capture(setup, route) for setup in SETUPS for route in ROUTES}
    data = json.dumps(out, sort_keys=True, ensure_ascii=False).encode()
    GOLDEN.write_bytes(gzip.compress(data, mtime=0))
    print(f"{GOLDEN}: {len(out)} fixture routes, {len(data)} bytes")


if __name__ == "__main__":
    main()
