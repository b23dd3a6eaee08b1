"""setup_tracing: one call builds the provider, wires Kafka (and optionally OTLP) and installs it globally."""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider

from ._batch import BoundedBatchSpanProcessor
from ._env import (
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_SERVICE_NAME,
    TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS,
)
from ._stamping import ConversationSpanProcessor
from .exporter import ExporterStats, KafkaSpanExporter

logger = logging.getLogger("tracejudge.tracer")


# The Kafka exporter's counters of each provider setup_tracing built (read by exporter_stats).
_stats_by_provider: weakref.WeakKeyDictionary[TracerProvider, ExporterStats] = weakref.WeakKeyDictionary()


def setup_tracing(
    service_name: str | None = None,
    *,
    kafka_bootstrap_servers: str | None = None,
    topic: str = "otlp_spans",
    otlp_endpoint: str | None = None,
    schedule_delay_millis: float | None = None,
    max_queue_size: int | None = None,
    set_global: bool = True,
    **kafka_config: Any,
) -> TracerProvider:
    """Build a TracerProvider exporting to Kafka (and to an OTLP/HTTP trace backend when given); install it globally.

    Explicit arguments win over TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS, OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_SERVICE_NAME.
    """
    service_name = service_name or os.environ.get(OTEL_SERVICE_NAME) or "unknown_service"
    bootstrap = kafka_bootstrap_servers or os.environ.get(TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS)
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    provider.add_span_processor(ConversationSpanProcessor())  # first: stamps before any exporter sees a span
    processor_options: dict[str, Any] = {}
    if schedule_delay_millis is not None:
        processor_options["schedule_delay_millis"] = schedule_delay_millis
    if max_queue_size is not None:
        processor_options["max_queue_size"] = max_queue_size
        processor_options["max_export_batch_size"] = min(512, max_queue_size)
    if bootstrap:
        exporter = KafkaSpanExporter(bootstrap, topic, **kafka_config)
        provider.add_span_processor(BoundedBatchSpanProcessor(exporter, stats=exporter.stats, **processor_options))
        _stats_by_provider[provider] = exporter.stats
    else:
        logger.warning("tracejudge: no Kafka bootstrap servers given; spans will not reach the tracejudge consumer")
    endpoint = otlp_endpoint or os.environ.get(OTEL_EXPORTER_OTLP_ENDPOINT)
    if endpoint or os.environ.get(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        otlp = (
            OTLPSpanExporter(endpoint=f"{otlp_endpoint.rstrip('/')}/v1/traces") if otlp_endpoint else OTLPSpanExporter()
        )
        provider.add_span_processor(BoundedBatchSpanProcessor(otlp, **processor_options))
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


def exporter_stats(provider: TracerProvider) -> ExporterStats | None:
    """The Kafka exporter's counters of a provider built by setup_tracing (None if it has none)."""
    return _stats_by_provider.get(provider)
