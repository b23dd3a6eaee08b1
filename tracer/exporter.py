"""KafkaSpanExporter: OTLP protobuf records keyed by conversation id, the Collector Kafka exporter's `otlp_proto`.

It runs on the BatchSpanProcessor's worker thread, never on the application's: batching, queueing and dropping on
a full queue belong to the processor. The exporter never raises; with the broker down it fails fast, counts the
spans it could not deliver and logs at a limited rate.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tracejudge._shared.kafka_options import check_kafka_options
from tracejudge._shared.rate_limited_log import RateLimitedLog

from .identity import conversation_id
from .semconv import GEN_AI_CONVERSATION_ID

logger = logging.getLogger("tracejudge.tracer.exporter")
_KNOWN_TRACES = 4_096  # traces whose conversation an exporter remembers across batches

# Bounded time per export: connecting, waiting for metadata and for acknowledgements all fit in these.
_DEFAULT_PRODUCER_CONFIG: dict[str, Any] = {
    "client_id": "tracejudge-exporter",
    "acks": 1,
    "enable_idempotence": False,
    "linger_ms": 5,
    "max_block_ms": 3_000,
    "request_timeout_ms": 5_000,
    "delivery_timeout_ms": 8_000,
    "bootstrap_timeout_ms": 3_000,
    "reconnect_backoff_max_ms": 1_000,  # deliver again within a second of the broker's return (library: 30 s)
    "max_request_size": 8 * 1024 * 1024,
}


@dataclass
class ExporterStats:
    """Counters an application can read or export; drops are never silent."""

    spans_exported: int = 0
    spans_dropped: int = 0
    records_sent: int = 0
    export_failures: int = 0
    queue_full_drops: int = 0
    last_error: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)


def _validate_producer_config(config: dict[str, Any]) -> None:
    from kafka import KafkaProducer

    check_kafka_options(config, KafkaProducer.DEFAULT_CONFIG)


def _supported_defaults() -> dict[str, Any]:
    from kafka import KafkaProducer

    return {k: v for k, v in _DEFAULT_PRODUCER_CONFIG.items() if k in KafkaProducer.DEFAULT_CONFIG}


def _trace_key(span: ReadableSpan) -> bytes:
    context = span.get_span_context()
    return format(context.trace_id if context is not None else 0, "032x").encode()


def record_keys(
    spans: Sequence[ReadableSpan], known: OrderedDict[bytes, str] | None = None
) -> tuple[list[bytes], dict[int, str]]:
    """Each span's record key, looking at the whole batch: a span that names no conversation goes with the
    conversation another span of its trace names, so all of a conversation's turns land on one partition.

    `known` (trace key -> conversation, bounded, updated here) carries that across batches: a span exported after
    its trace named a conversation goes there too. Returns the keys and, by span id, the conversations lent that way
    (the record must name them: the consumer sees one record at a time).
    """
    resolved = [conversation_id(span.attributes) for span in spans]
    by_trace: dict[bytes, str] = {}
    for span, conversation in zip(spans, resolved, strict=True):
        if conversation is not None:
            by_trace.setdefault(_trace_key(span), conversation)
    keys = []
    lent: dict[int, str] = {}
    for span, conversation in zip(spans, resolved, strict=True):
        trace_key = _trace_key(span)
        if conversation is None and trace_key not in by_trace and known is not None and trace_key in known:
            conversation = known[trace_key]
            context = span.get_span_context()
            if context is not None:
                lent[context.span_id] = conversation
        conversation = conversation or by_trace.get(trace_key)
        keys.append(conversation.encode("utf-8", "replace") if conversation is not None else trace_key)
    if known is not None:
        for trace_key, conversation in by_trace.items():
            known[trace_key] = conversation
            known.move_to_end(trace_key)
        while len(known) > _KNOWN_TRACES:
            known.popitem(last=False)
    return keys, lent


def _name_lent_conversations(request: Any, lent: dict[int, str]) -> None:
    """Write the conversation a span was lent (from an earlier batch of its trace) into its encoded record."""
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                conversation = lent.get(int.from_bytes(span.span_id, "big"))
                if conversation is not None:
                    attribute = span.attributes.add()
                    attribute.key = GEN_AI_CONVERSATION_ID
                    attribute.value.string_value = conversation


class KafkaSpanExporter(SpanExporter):
    """Export spans to a Kafka topic, one record per conversation per batch, key = conversation id (UTF-8)."""

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        topic: str = "otlp_spans",
        *,
        export_timeout_s: float = 10.0,
        reconnect_backoff_s: float = 5.0,
        **producer_config: Any,
    ) -> None:
        if not bootstrap_servers:
            raise ValueError("KafkaSpanExporter needs bootstrap_servers")
        _validate_producer_config(producer_config)
        self.topic = topic
        self.export_timeout_s = export_timeout_s
        self.reconnect_backoff_s = reconnect_backoff_s
        self.producer_config = {**_supported_defaults(), **producer_config, "bootstrap_servers": bootstrap_servers}
        self.stats = ExporterStats()
        self._producer: Any = None
        self._last_connect_failure = -float("inf")
        self._lock = threading.Lock()
        self._shutdown = False
        self._drop_log = RateLimitedLog(logger, interval_s=30.0)
        self._known_traces: OrderedDict[bytes, str] = OrderedDict()  # guarded by _lock

    def _get_producer(self) -> Any:
        if self._producer is not None:
            return self._producer
        if time.monotonic() - self._last_connect_failure < self.reconnect_backoff_s:
            return None
        from kafka import KafkaProducer

        try:
            self._producer = KafkaProducer(**self.producer_config)
        except Exception as exc:
            self._last_connect_failure = time.monotonic()
            self.stats.last_error = f"connect: {exc!r}"
            raise
        return self._producer

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown or not spans:
            return SpanExportResult.FAILURE if self._shutdown else SpanExportResult.SUCCESS
        with self._lock:
            try:
                return self._export(spans)
            except Exception as exc:
                self._drop(len(spans), repr(exc))
                return SpanExportResult.FAILURE

    def _export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        producer = self._get_producer()
        if producer is None:
            self._drop(len(spans), "broker unreachable (waiting before reconnecting)")
            return SpanExportResult.FAILURE
        groups: dict[bytes, list[ReadableSpan]] = {}
        keys, lent = record_keys(spans, self._known_traces)
        for span, key in zip(spans, keys, strict=True):
            groups.setdefault(key, []).append(span)
        deadline = time.monotonic() + self.export_timeout_s
        pending = []
        unencodable = 0
        for key, group in groups.items():
            try:  # one conversation's bad span (say, invalid Unicode in an attribute) never costs the others
                request = encode_spans(group)
                if lent:
                    _name_lent_conversations(request, lent)
                value = request.SerializeToString()
            except Exception as exc:
                unencodable += len(group)
                self._drop(len(group), f"could not encode spans: {exc!r}"[:300])
                continue
            pending.append((producer.send(self.topic, key=key, value=value), len(group)))
        try:
            producer.flush(timeout=max(0.1, deadline - time.monotonic()))
        except Exception as exc:  # a flush timeout: the futures below say what was delivered
            logger.debug("flush did not finish: %r", exc)
        delivered = failed = 0
        errors: list[str] = []
        for future, count in pending:
            if future.succeeded():
                delivered += count
            else:
                failed += count
                if future.is_done and future.exception is not None:
                    errors.append(repr(future.exception))
        self.stats.add(spans_exported=delivered, records_sent=sum(1 for f, _ in pending if f.succeeded()))
        if failed:
            self._drop(failed, errors[0] if errors else "delivery not confirmed in time")
        return SpanExportResult.FAILURE if failed or unencodable else SpanExportResult.SUCCESS

    def _drop(self, count: int, reason: str) -> None:
        self.stats.add(spans_dropped=count, export_failures=1)
        self.stats.last_error = reason
        self._drop_log.warning(
            "tracejudge: dropped %d span(s) for Kafka topic %r: %s (total dropped: %d)",
            count,
            self.topic,
            reason,
            self.stats.spans_dropped,
        )

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        producer = self._producer
        if producer is None:
            return True
        try:
            producer.flush(timeout=timeout_millis / 1000)
            return True
        except Exception:
            return False

    def shutdown(self) -> None:
        if self._shutdown:
            return
        self._shutdown = True
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.close(timeout=self.export_timeout_s)
            except Exception as exc:
                logger.debug("closing the Kafka producer failed: %r", exc)
