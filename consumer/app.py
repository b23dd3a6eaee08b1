"""Assemble a runnable consumer from Settings: judges, registry, /metrics, OTLP providers, result sinks.

The CLI, the demo and the tests all build through here; only the CLI installs signal handlers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from tracejudge._shared.redact import redact_pii
from tracejudge.metrics import CustomLLMClient, HolisticJudgeMetric
from tracejudge.metrics.batch import (
    BatchBackend,
    BatchCoordinator,
    LiteLLMBackend,
    MemoryBatchStore,
    batch_problem,
    litellm_model_string,
)
from tracejudge.metrics.calibration import load_hallucination_calibration
from tracejudge.metrics.judges import BUILTIN_JUDGES, judge_classes, result_keys
from tracejudge.metrics.tiers import FLEX_MIN_TIMEOUT_S, TIER_BATCH, TIER_FLEX, TIER_STANDARD, has_tier_price
from tracejudge.metrics.transcript import Redactor

from ._errors import EXIT_USAGE, StartupError
from .emit import KafkaWriter
from .emit.acknowledged import AcknowledgingExporter
from .emit.delivery import JudgementSink
from .emit.notify import DeliveredIds, NotificationInstruments, Notifier
from .emit.otel import OUTPUT as OTLP_OUTPUT
from .emit.otel import CountedLogExporter, CountedSpanExporter, EvaluationEmitter
from .emit.prometheus import ConsumerInstruments
from .emit.results_topic import NO_RESULTS_NOTICE, ResultsTopic
from .emit.verdict_log import VerdictLog
from .kafka.connect import reaching_kafka
from .kafka.topics import InternalTopics
from .service import ConsumerService
from .settings import Settings

logger = logging.getLogger("tracejudge.consumer")
METRIC_CLASSES: dict[str, type[HolisticJudgeMetric]] = dict(BUILTIN_JUDGES)  # the built-ins; with files: judge_classes


class JudgeTierUnavailable(StartupError):
    exit_code = EXIT_USAGE  # --judge-tier batch for a provider without a Batch API: never silently full price


# A batch call waits for its batch: the provider's 24 h window, polls and one resubmission.
BATCH_CALL_TIMEOUT_S = 2 * 86_400.0 + 3_600.0


def tier_problem(settings: Settings) -> str | None:
    """Why the judge model, or the shadow judge model, cannot be judged at --judge-tier (None: both can); imports
    nothing heavy. Asked before any check that reaches the provider: a usage error is said first."""
    if settings.judge_tier != TIER_BATCH:
        return None
    for flag, model in (("--judge-model", settings.judge_model), ("--shadow-judge-model", settings.shadow_judge_model)):
        if not model:
            continue
        try:
            problem = batch_problem(litellm_model_string(model))
        except ValueError as exc:
            problem = str(exc)
        if problem is not None:
            return problem.replace("(judge model", f"({flag}", 1)
    return None


def judge_tier_backend(
    settings: Settings, model: str, *, durable_batches: bool = False
) -> tuple[str | BatchBackend | LiteLLMBackend, float]:
    """The judge backend for --judge-tier and its per-attempt timeout. Flex where the price map lists a flex price
    for the model (else said once, and standard); batch through one coordinator per model."""
    tier = settings.judge_tier
    if tier == TIER_FLEX:
        litellm_model = litellm_model_string(model)
        if not has_tier_price(litellm_model, TIER_FLEX):
            logger.warning(
                "--judge-tier flex: %s has no flex price in LiteLLM's price map (no flex tier known for it): judged "
                "at the standard tier; --judge-tier batch halves the price where the provider has a Batch API",
                model,
            )
            return model, settings.judge_timeout
        logger.info("judge tier flex: %s with service_tier=flex (half price, slower answers)", model)
        return LiteLLMBackend(model, tier=TIER_FLEX), max(settings.judge_timeout, FLEX_MIN_TIMEOUT_S)
    if tier == TIER_BATCH:
        problem = tier_problem(settings.model_copy(update={"judge_model": model, "shadow_judge_model": None}))
        if problem is not None:
            raise JudgeTierUnavailable(problem)
        litellm_model = litellm_model_string(model)
        coordinator = _BATCH_COORDINATORS.get(litellm_model)
        if coordinator is None:
            coordinator = _BATCH_COORDINATORS[litellm_model] = BatchCoordinator(
                litellm_model,
                batch_size=settings.judge_batch_size,
                batch_wait_s=settings.judge_batch_wait,
                poll_s=settings.judge_batch_poll,
                # The consumer attaches its Kafka store (<group>-judge-batches); backfill and calibrate keep batches
                # in memory: a rerun submits them again.
                store=None if durable_batches else MemoryBatchStore(),
            )
        return BatchBackend(model, coordinator), BATCH_CALL_TIMEOUT_S
    return model, settings.judge_timeout


_BATCH_COORDINATORS: dict[str, BatchCoordinator] = {}


def build_judges(
    settings: Settings,
    judge: str | CustomLLMClient | None = None,
    redactor: Redactor | None = None,
    *,
    durable_batches: bool = False,
) -> list[HolisticJudgeMetric]:
    """One judge per configured metric; `redactor` replaces the default PII redactor (applied when --redact);
    `durable_batches`: at the batch tier the caller attaches a durable store (the consumer does)."""
    model: str | CustomLLMClient | BatchBackend | LiteLLMBackend = judge if judge is not None else settings.judge_model
    timeout = settings.judge_timeout
    if isinstance(model, str) and settings.judge_tier != TIER_STANDARD:
        _BATCH_COORDINATORS.clear()  # one coordinator per model and build (each consumer its own store)
        model, timeout = judge_tier_backend(settings, model, durable_batches=durable_batches)
    classes = judge_classes(settings.judge_files)  # the built-ins and the team's rubric files
    taxonomies = settings.taxonomies()  # --failure-modes: replaces a judge's own taxonomy
    mode_alerts = settings.mode_alerts()
    return [
        classes[name](
            model,
            threshold=settings.threshold,
            timeout=timeout,
            max_retries=settings.judge_retries,
            redactor=(redactor or redact_pii) if settings.redact else None,
            failure_modes=taxonomies.get(name),
            mode_alert_shares=mode_alerts.get(name),
        )
        for name in settings.metrics
    ]


def build_shadow_judges(settings: Settings, redactor: Redactor | None = None) -> list[HolisticJudgeMetric]:
    """With --shadow-judge-model: the same metrics (their own rubric versions) on the shadow model."""
    if not settings.shadow_judge_model:
        return []
    return build_judges(settings, settings.shadow_judge_model, redactor, durable_batches=True)


def canary_items(settings: Settings) -> list[Any]:
    """With --canary-interval: the canary's labelled conversations (DatasetError for a bad --canary-dataset)."""
    if settings.canary_interval is None:
        return []
    from .judging.canary import load_canary_items

    return load_canary_items(settings.canary_dataset, settings.judge_files)


class MetricsPortUnavailable(StartupError):
    exit_code = EXIT_USAGE  # a configuration error: --metrics-host / --metrics-port


def build_otlp_providers(
    endpoint: str,
    protocol: str,
    service_name: str = "tracejudge-consumer",
    on_error: Callable[[], None] | None = None,
) -> tuple[Any, Any]:
    """Tracer and logger providers exporting evaluation spans and events over OTLP (HTTP or gRPC); `on_error()` is
    called for every batch that failed to export (the exporters return FAILURE, they do not raise). Their processors
    acknowledge what the exporter delivered (see emit/acknowledged.py) and retry what it did not."""
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    base = endpoint.rstrip("/")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        span_exporter: Any = OTLPSpanExporter(endpoint=base)
        log_exporter: Any = OTLPLogExporter(endpoint=base)
    else:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HTTPLogExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTPSpanExporter

        span_exporter = HTTPSpanExporter(endpoint=f"{base}/v1/traces")
        log_exporter = HTTPLogExporter(endpoint=f"{base}/v1/logs")
    span_exporter = CountedSpanExporter(span_exporter, endpoint, on_error)
    log_exporter = CountedLogExporter(log_exporter, endpoint, on_error)
    resource = Resource.create({SERVICE_NAME: service_name})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(
        flushing(SimpleSpanProcessor)(  # one duck-typed exporter class serves the span and the log processor
            AcknowledgingExporter(  # type: ignore[arg-type]
                span_exporter.export, shutdown_exporter=span_exporter.shutdown, name="otlp-spans"
            )
        )
    )
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(
        flushing(SimpleLogRecordProcessor)(
            AcknowledgingExporter(  # type: ignore[arg-type]
                log_exporter.export, shutdown_exporter=log_exporter.shutdown, name="otlp-logs"
            )
        )
    )
    return tracer_provider, logger_provider


def flushing(processor_class: Any) -> Any:
    """The SDK's Simple*Processor answers every flush at once (it exports on the emitting thread); ours hands items to
    the acknowledging exporter's queue, so a flush must reach that exporter to wait out its backoffs."""

    class Flushing(processor_class):  # type: ignore[misc, valid-type]
        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            exporter = getattr(self, "span_exporter", None) or getattr(self, "_exporter", None)
            flush = getattr(exporter, "force_flush", None)
            return bool(flush(timeout_millis)) if flush is not None else True

    Flushing.__name__ = f"Flushing{processor_class.__name__}"
    return Flushing


def flush_providers(*providers: Any, timeout_s: float = 10.0) -> None:
    """Flush (waiting out a collector's blip) and shut down OTLP tracer/logger providers, all within `timeout_s`;
    what is still unexported then stays unacknowledged. A failing backend is logged, never raised."""
    deadline = time.monotonic() + timeout_s
    for provider in providers:
        if provider is None:
            continue
        try:
            provider.force_flush(int(max(0.0, deadline - time.monotonic()) * 1000))
            provider.shutdown()
        except Exception as exc:
            logger.warning("flushing OTLP output: %r", exc)


@dataclass
class Outputs:
    """Where judgements go besides Prometheus: OTLP evaluation spans and events, the results topic."""

    sinks: list[JudgementSink]
    results_writer: KafkaWriter | None = None
    tracer_provider: Any = None
    logger_provider: Any = None
    notifier: Notifier | None = None
    verdict_log: VerdictLog | None = None  # the live consumer's line per verdict (build_app)

    def close(self, timeout_s: float = 10.0) -> None:
        if self.verdict_log is not None:
            self.verdict_log.close()
        if self.notifier is not None:
            self.notifier.close(timeout_s)
        if self.results_writer is not None:
            self.results_writer.close(timeout_s)
        flush_providers(self.tracer_provider, self.logger_provider, timeout_s=timeout_s)


def build_outputs(
    settings: Settings,
    *,
    tracer_provider: Any = None,
    logger_provider: Any = None,
    service_name: str = "tracejudge-consumer",
    on_output_error: Callable[[str], None] | None = None,
    notifications: NotificationInstruments | None = None,
    default_results: bool = False,
) -> Outputs:
    """`on_output_error(output)` is called for every failed write (e.g. to count it; the write is retried);
    `notifications`: the notifier's series; without them (backfill) --notify-url is not used. `default_results`: the
    live consumer writes the results topic without a flag (`Settings.results_topic_name`, `<group>-results`, which
    it creates); a backfill writes only where --results-topic names."""
    sinks: list[JudgementSink] = []
    acknowledged = False
    if tracer_provider is None and settings.otlp_endpoint:
        tracer_provider, logger_provider = build_otlp_providers(
            settings.otlp_endpoint,
            settings.otlp_protocol,
            service_name,
            on_error=(lambda: on_output_error(OTLP_OUTPUT)) if on_output_error else None,
        )
        acknowledged = True  # our processors: a judgement waits for the exporter's SUCCESS
    if tracer_provider is not None:
        sinks.append(EvaluationEmitter(tracer_provider, logger_provider, acknowledged=acknowledged))
    results_writer = None
    results_topic = settings.results_topic_name() if default_results else settings.results_topic
    if results_topic:
        producer_config = settings.producer_config()
        with reaching_kafka(settings.bootstrap_servers, producer_config):  # KafkaUnreachable: one line
            results_writer = KafkaWriter(
                settings.bootstrap_servers,
                results_topic,
                durable=True,
                on_error=(lambda: on_output_error("results_topic")) if on_output_error else None,
                **producer_config,
            ).start()
        sinks.append(
            ResultsTopic(
                results_writer,
                settings.metrics,
                unjudged=settings.results_unjudged,
                transcript=settings.results_transcript,
                keys=result_keys(settings.judge_files, settings.metrics),
            )
        )
    # Only a live consumer notifies (it passes its series): a backfill's verdicts are past, never a page to anyone.
    live = notifications is not None and bool(settings.notify_url)
    notifier = build_notifier(settings, notifications, on_output_error) if live else None
    if notifier is not None:
        sinks.append(notifier)
    return Outputs(sinks, results_writer, tracer_provider, logger_provider, notifier)


def build_notifier(
    settings: Settings,
    instruments: NotificationInstruments | None,
    on_output_error: Callable[[str], None] | None = None,
) -> Notifier:
    """--notify-url: the notifier, its delivered ids kept in `<group>-notifications` (so a replay is not re-sent)."""
    producer_config = settings.producer_config()
    topic = InternalTopics(settings.group_id).notifications
    with reaching_kafka(settings.bootstrap_servers, producer_config):
        writer = KafkaWriter(
            settings.bootstrap_servers,
            topic,
            durable=True,
            # counted like the notifier's own failures: a delivery not recorded keeps its conversation uncommitted
            on_error=(lambda: on_output_error("notify")) if on_output_error else None,
            hint=(
                f": the delivered notifications are not recorded, so their conversations stay uncommitted; check that "
                f"the brokers are up and that this consumer may Write and Describe topic {topic!r} (and Create it, "
                "or pre-create it compacted)"
            ),
            **producer_config,
        ).start()
    delivered = DeliveredIds(
        settings.bootstrap_servers,
        writer.topic,
        {"enable_auto_commit": False, **settings.consumer_config()},
        writer,
        replication_factor=settings.replication_factor,
        topic_configs=dict(settings.internal_topic_config),
    )
    notifier = Notifier(
        settings.notify_url,
        notify_on=settings.notify_on,
        body_format=settings.notify_format,
        secret=settings.notify_secret,
        trace_url_template=settings.trace_url_template,
        rate_per_minute=settings.notify_rate_limit,
        retry_for_s=settings.notify_retry_for,
        source=f"/tracejudge/{settings.group_id}",
        instruments=instruments,
        on_error=(lambda: on_output_error("notify")) if on_output_error else None,
        delivered_ids=delivered,
    )
    try:
        return notifier.start()
    except BaseException:  # e.g. KafkaUnreachable while reading the delivered ids: the writer does not outlive it
        writer.close(1.0)
        raise


@dataclass
class App:
    settings: Settings
    service: ConsumerService
    registry: CollectorRegistry
    prometheus: ConsumerInstruments
    outputs: Outputs
    http_server: Any = None
    _closed: bool = field(default=False, repr=False)

    @property
    def metrics_url(self) -> str | None:
        if self.http_server is None:
            return None
        host, port = self.http_server.server_address[:2]
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}/metrics"

    def run(self) -> None:
        """Connect (KafkaUnreachable if the brokers do not answer), then consume until stopped."""
        try:
            self.service.connect()
            if self.metrics_url is not None and self.http_server is not None:
                host = self.http_server.server_address[0]
                if host in ("0.0.0.0", "", "::"):  # reachable from here at the URL, from elsewhere at this host's
                    logger.info("metrics at %s (listening on all interfaces, %s)", self.metrics_url, host or "0.0.0.0")
                else:
                    logger.info("metrics at %s", self.metrics_url)
            self.service.run()
        finally:
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        deadline = self.service.stop_deadline  # what is left of the shutdown grace period, if it started
        self.outputs.close(10.0 if deadline is None else max(0.5, deadline - time.monotonic()))
        if self.http_server is not None:
            self.http_server.shutdown()
            self.http_server.server_close()


def build_app(
    settings: Settings,
    *,
    judge: str | CustomLLMClient | None = None,
    registry: CollectorRegistry | None = None,
    serve_metrics: bool = True,
    tracer_provider: Any = None,
    logger_provider: Any = None,
    extra_sinks: list[JudgementSink] | None = None,
    redactor: Redactor | None = None,
    metrics_server: Any = None,
) -> App:
    """`metrics_server`: the /metrics server the caller already bound on `registry` (`consume` binds it before the
    judge check, so a port in use is found first); the App owns it from here, and closes it if building fails."""
    registry = registry if registry is not None else CollectorRegistry()
    http_server = metrics_server
    if http_server is None and serve_metrics:  # first: a port in use is one line before anything connects
        http_server = serve_metrics_endpoint(settings, registry)
    try:
        prometheus = ConsumerInstruments(
            registry,
            max_agents=settings.max_agents,
            window_sessions=settings.window_sessions,
            window_seconds=settings.window_seconds,
            calibration=load_hallucination_calibration(settings.calibration) if settings.calibration else None,
        )
        outputs = build_outputs(
            settings,
            tracer_provider=tracer_provider,
            logger_provider=logger_provider,
            on_output_error=prometheus.record_output_error,
            notifications=prometheus.notifications,
            default_results=True,
        )
        if settings.no_results and settings.role != "assemble":
            logger.info(NO_RESULTS_NOTICE)
        outputs.verdict_log = VerdictLog()  # a sign of life in the log: a line per verdict, a summary above a rate
        sinks = [*(extra_sinks or []), *outputs.sinks, outputs.verdict_log]
        service = ConsumerService(
            settings,
            build_judges(settings, judge, redactor, durable_batches=True),
            prometheus,
            sinks=sinks,
            shadow_judges=build_shadow_judges(settings, redactor),
            canary_items=canary_items(settings),
        )
        if outputs.notifier is not None:  # its delivery thread failing stops the consumer, as the judge thread's
            outputs.notifier.on_fatal = service.fail
    except BaseException:
        if http_server is not None:
            http_server.shutdown()
            http_server.server_close()
        raise
    return App(settings, service, registry, prometheus, outputs, http_server)


def serve_metrics_endpoint(settings: Settings, registry: CollectorRegistry) -> Any:
    """The /metrics HTTP server; MetricsPortUnavailable (a configuration error) when it cannot listen there."""
    try:
        http_server, _thread = start_http_server(settings.metrics_port, settings.metrics_host, registry=registry)
    except OSError as exc:
        raise MetricsPortUnavailable(
            f"invalid configuration: --metrics-port / TRACEJUDGE_METRICS_PORT: cannot listen on "
            f"{settings.metrics_host}:{settings.metrics_port}: {exc.strerror or exc} (another process may hold the "
            "port; pick a free one)"
        ) from None
    return http_server
