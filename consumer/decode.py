"""Kafka record → spans: OTLP protobuf (`ExportTraceServiceRequest`, the Collector's `otlp_proto`) or OTLP JSON.

The consumer's hot path (`read_events`) asks for what a conversation needs only: a protobuf record whose bytes hold
none of the keys that can make a conversation event (`relevant`) is parsed, so a broken record is still told, and
then skipped without one span object built (the Collector's HTTP and database spans); of a record that holds a
marker, the spans of traces that hold none are skipped the same way (the Collector batches many traces in a record);
and of the resource only `service.name` (the agent's last-resort label) is read.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from ._errors import ConsumerError

DEFAULT_MAX_RECORD_BYTES = 8 * 1024 * 1024
_STATUS_ERROR = 2
_SERVICE_NAME = "service.name"
# A record of fewer spans is built whole: its one unneeded span at most costs less than sifting every record of two
# (a turn and its end marker are two traces).
SIFT_FROM_SPANS = 3


class MalformedRecord(ConsumerError):
    """A record that is not an OTLP trace export we can read; counted and dead-lettered, never fatal."""


@dataclass(slots=True)
class DecodedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    is_error: bool = False
    resource: Mapping[str, Any] = field(default_factory=dict)  # on the hot path `service.name` only (see above)
    events: list[SpanEvent] = field(default_factory=list)
    scope: str = ""  # the instrumentation scope's name: which library wrote the span (for what-to-set hints)


@dataclass(slots=True)
class SpanEvent:
    """A span event: some instrumentations put message content here instead of in span attributes."""

    name: str
    attributes: dict[str, Any]


def _any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "string_value":  # nearly every attribute: one branch before the rest
        return value.string_value
    if kind is None:
        return None
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    # A non-empty `string_value` is the string case (the oneof's other members read as ""): one upb call per value
    # instead of two for nearly every attribute; the rest (and "") go through `_any_value`. A plain loop: ~10%
    # under the comprehension with its walrus.
    attributes = {}
    for kv in pairs:
        value = kv.value
        attributes[kv.key] = value.string_value or _any_value(value)
    return attributes


def _service_only(pairs: Any) -> dict[str, Any]:
    """Of a resource's attributes, only `service.name`: the one the consumer reads (the agent's last resort). The
    last one counts, as in a dict of them all, so the walk runs backwards: the SDK writes it last."""
    for kv in reversed(pairs):
        if kv.key == _SERVICE_NAME:
            return {_SERVICE_NAME: _any_value(kv.value)}
    return {}


class _ServiceOnly(Mapping[str, Any]):
    """`_service_only` of a resource, read on first asking: most turns name their agent, and then no span of the
    record asks (a resource's attributes cost ~1 µs to walk). One per resource, shared by its spans."""

    __slots__ = ("_pairs", "_read")

    def __init__(self, pairs: Any) -> None:
        self._pairs: Any = pairs
        self._read: dict[str, Any] | None = None

    def _attributes(self) -> dict[str, Any]:
        if self._read is None:
            self._read, self._pairs = _service_only(self._pairs), None
        return self._read

    def __getitem__(self, key: str) -> Any:
        return self._attributes()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._attributes())

    def __len__(self) -> int:
        return len(self._attributes())


def _holds_spans(request: ExportTraceServiceRequest) -> bool:
    for resource_spans in request.resource_spans:  # loops, not any() over a generator: the skipped record's cost
        for scope_spans in resource_spans.scope_spans:
            if scope_spans.spans:
                return True
    return False


def _traces_that_matter(request: ExportTraceServiceRequest, relevant: Callable[[bytes], bool]) -> set[bytes] | None:
    """Of a record of SIFT_FROM_SPANS spans or more, the traces that hold a span whose own bytes, or whose scope's,
    `relevant` says can matter; None: every span stays.

    A span of any other trace cannot make an event: it names no conversation, nor does any span of its trace in this
    record that could lend it one (`adapters.trace_contexts` joins a record's spans by trace), and it is no model call
    (those are told by their own keys or their scope's name). The resource is not searched: the hot path reads only its
    `service.name`, which makes no event. The Collector batches every span of its traces into one record: their HTTP
    and database spans go unbuilt. A span re-serialized and searched costs ~1 µs where building its attributes costs
    several."""
    spans = [
        (span, scope_spans)
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]
    if len(spans) < SIFT_FROM_SPANS:
        return None
    marked: set[bytes] = set()
    scopes: dict[int, bool] = {}  # by the scope's id (each held in `spans`, so none is reused): its name matters
    for span, scope_spans in spans:
        trace = span.trace_id
        if trace in marked or relevant(span.SerializeToString()):  # its own bytes first: a GenAI span holds markers
            marked.add(trace)
            continue
        scope_matters = scopes.get(id(scope_spans))
        if scope_matters is None:
            scope_matters = scopes[id(scope_spans)] = relevant(scope_spans.scope.SerializeToString())
        if scope_matters:
            marked.add(trace)
    return marked


def _decode_protobuf(value: bytes, relevant: Callable[[bytes], bool] | None = None) -> list[DecodedSpan]:
    try:
        request = ExportTraceServiceRequest.FromString(value)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise MalformedRecord(f"not an OTLP protobuf trace export: {exc}") from exc
    if relevant is not None and not relevant(value):
        # Protobuf keeps every key and name as its own UTF-8 bytes: none of them is here, so no span can matter.
        if not _holds_spans(request):
            raise MalformedRecord("the record holds no spans")
        return []
    traces = None if relevant is None else _traces_that_matter(request, relevant)
    spans: list[DecodedSpan] = []
    for resource_spans in request.resource_spans:
        pairs = resource_spans.resource.attributes
        resource = _attributes(pairs) if relevant is None else _ServiceOnly(pairs)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name  # each upb field read builds an object: once per scope, not per span
            for span in scope_spans.spans:
                if traces is not None and span.trace_id not in traces:
                    continue
                events = span.events
                spans.append(
                    DecodedSpan(  # positional (the fields' order): a keyword call costs more per span
                        span.trace_id.hex(),
                        span.span_id.hex(),
                        span.parent_span_id.hex(),
                        span.name,
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        _attributes(span.attributes),
                        span.status.code == _STATUS_ERROR,
                        resource,
                        [SpanEvent(e.name, _attributes(e.attributes)) for e in events] if events else [],
                        scope,
                    )
                )
    if not spans and traces is None:
        raise MalformedRecord("the record holds no spans")
    return spans


def _json_any_value(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    if "intValue" in value:
        return int(value["intValue"])
    if "arrayValue" in value:
        return [_json_any_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return {kv["key"]: _json_any_value(kv.get("value")) for kv in value["kvlistValue"].get("values", [])}
    if "bytesValue" in value:
        return base64.b64decode(value["bytesValue"])
    return None


def _json_attributes(pairs: Any) -> dict[str, Any]:
    if not isinstance(pairs, list):
        return {}
    return {kv["key"]: _json_any_value(kv.get("value")) for kv in pairs if isinstance(kv, dict) and "key" in kv}


def _json_id(value: Any) -> str:
    """OTLP/JSON ids are hex; be lenient with base64 (protobuf's generic JSON mapping)."""
    if not isinstance(value, str) or not value:
        return ""
    try:
        bytes.fromhex(value)
        return value.lower()
    except ValueError:
        return base64.b64decode(value).hex()


def _json_loads(value: bytes) -> Any:
    """orjson, and the standard library for what orjson refuses but it reads (NaN, integers past 64 bits)."""
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return json.loads(value)


def _decode_json(value: bytes) -> list[DecodedSpan]:
    try:
        document = _json_loads(value)
        spans: list[DecodedSpan] = []
        for resource_spans in document.get("resourceSpans") or document.get("resource_spans") or []:
            resource = _json_attributes((resource_spans.get("resource") or {}).get("attributes"))
            for scope_spans in resource_spans.get("scopeSpans") or resource_spans.get("scope_spans") or []:
                for span in scope_spans.get("spans") or []:
                    status = span.get("status") or {}
                    code = status.get("code")
                    spans.append(
                        DecodedSpan(
                            trace_id=_json_id(span.get("traceId")),
                            span_id=_json_id(span.get("spanId")),
                            parent_span_id=_json_id(span.get("parentSpanId")),
                            name=str(span.get("name", "")),
                            start_ns=int(span.get("startTimeUnixNano") or 0),
                            end_ns=int(span.get("endTimeUnixNano") or 0),
                            attributes=_json_attributes(span.get("attributes")),
                            scope=str((scope_spans.get("scope") or {}).get("name") or ""),
                            is_error=code in (2, "STATUS_CODE_ERROR"),
                            resource=resource,
                            events=[
                                SpanEvent(str(e.get("name", "")), _json_attributes(e.get("attributes")))
                                for e in span.get("events") or []
                                if isinstance(e, dict)
                            ],
                        )
                    )
        return spans
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise MalformedRecord(f"not an OTLP JSON trace export: {exc!r}"[:300]) from exc


def decode_record(
    value: bytes | None, *, max_bytes: int = DEFAULT_MAX_RECORD_BYTES, relevant: Callable[[bytes], bool] | None = None
) -> list[DecodedSpan]:
    """Every span in one record; raises MalformedRecord for anything we cannot read (or an empty export).

    With `relevant` (the hot path): none of a protobuf record's spans when it says its bytes cannot matter, and each
    span's resource as `service.name` alone, and of a record of several spans only those of the traces that can
    matter (`_traces_that_matter`). JSON may escape a key's letters, so a JSON record is always read whole.
    """
    if not value:
        raise MalformedRecord("empty record")
    if len(value) > max_bytes:
        raise MalformedRecord(f"record of {len(value)} bytes exceeds the {max_bytes}-byte limit")
    if value[:1] == b"{":
        spans = _decode_json(value)
        if not spans:
            raise MalformedRecord("the record holds no spans")
        return spans
    return _decode_protobuf(value, relevant)
