"""Which judge said so, and which trace it judged: rubric_version on every output, tracejudge_judge_info, exemplars
on /metrics (classic text by default, OpenMetrics with exemplars when asked), through the real consumer."""

from __future__ import annotations

import json
import re
import urllib.request

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer
from tests.support.otlp_receiver import OtlpReceiver, attributes
from tests.support.pipeline import RunningConsumer, consumer_settings, play, read_all, traced_app, wait_for
from tracejudge.consumer.adapters import Turn
from tracejudge.consumer.app import build_app
from tracejudge.consumer.conversation.job import JudgeJob
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit.prometheus import ConsumerInstruments, trace_exemplar
from tracejudge.consumer.judging.judgement import Judgement
from tracejudge.consumer.service import ConsumerService
from tracejudge.metrics import ConversationalFlowRateMetric, CustomLLMClient, FailureRateMetric, MetricResult

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def scrape(url: str, accept: str | None = None) -> tuple[str, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.headers["Content-Type"], response.read().decode()


def last_turn_ids(exporter: InMemorySpanExporter, conversation_id: str) -> tuple[str, str]:
    """The application's own view: the last `invoke_agent` span it made for the conversation."""
    turns = [
        s
        for s in exporter.get_finished_spans()
        if (s.attributes or {}).get("gen_ai.conversation.id") == conversation_id and s.name.startswith("invoke_agent")
    ]
    last = max(turns, key=lambda s: s.start_time or 0)
    return format(last.context.trace_id, "032x"), format(last.context.span_id, "016x")


def test_rubric_version_judge_info_and_exemplars_end_to_end(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    judge_server.responder = scripted_judge
    results = f"{topic}-results"
    broker.create_topic(results, 1)
    provider = traced_app(broker.bootstrap_servers, topic)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    versions = {
        "failure_rate": FailureRateMetric("gpt-4o-mini").rubric_version,
        "conversational_flow": ConversationalFlowRateMetric("gpt-4o-mini").rubric_version,
    }
    with OtlpReceiver() as receiver:
        settings = consumer_settings(
            broker.bootstrap_servers, topic, otlp_endpoint=receiver.endpoint, results_topic=results
        )
        with RunningConsumer(settings) as consumer:
            url = consumer.app.metrics_url
            assert url is not None
            # Judge info is there before any verdict: one series per judge, value 1.
            for metric, version in versions.items():
                labels = {"metric": metric, "model": "gpt-4o-mini", "rubric_version": version}
                assert consumer.value("tracejudge_judge_info", **labels) == 1.0
            play(provider, {"prov-1": [("q1", "a1"), ("q2", "a2"), ("q3", "INVENTED")]})
            wait_for(lambda: consumer.sessions("judged") == 1, what="judged")
            trace_id, span_id = last_turn_ids(exporter, "prov-1")
            content_type, classic = scrape(url)
            assert content_type.startswith("text/plain") and "# EOF" not in classic and trace_id not in classic
            assert re.search(
                r'^tracejudge_judge_info\{metric="failure_rate",model="gpt-4o-mini",rubric_version="', classic, re.M
            )
            content_type, om = scrape(url, OPENMETRICS)
            assert content_type.startswith("application/openmetrics-text") and om.rstrip().endswith("# EOF")
            exemplar = f'# {{span_id="{span_id}",trace_id="{trace_id}"}}'  # OpenMetrics: labels sorted
            hallucination = next(
                line
                for line in om.splitlines()
                if line.startswith(
                    'tracejudge_verdicts_total{agent="support",metric="failure_rate",verdict="hallucination"}'
                )
            )
            assert exemplar in hallucination
            zero_bucket = next(
                line
                for line in om.splitlines()
                if line.startswith('tracejudge_score_bucket{agent="support",le="0.0",metric="failure_rate"}')
            )
            assert exemplar in zero_bucket
            assert re.search(r"^tracejudge_judge_info\{", om, re.M)  # the exposed sample name, exactly
    spans = [s for s in receiver.spans if s.name.startswith("evaluate ")]
    events = [r for r in receiver.logs if r.event_name == "gen_ai.evaluation.result"]
    assert len(spans) == len(events) == 2
    for item in [*spans, *events]:
        a = attributes(item)
        assert a["tracejudge.evaluation.rubric_version"] == versions[a["gen_ai.evaluation.name"]]
    for span in spans:  # the exemplar's ids are the evaluation span's parent
        assert (span.trace_id.hex(), span.parent_span_id.hex()) == (trace_id, span_id)
    records = [json.loads(r.value) for r in read_all(broker.bootstrap_servers, results)]
    assert {r["metric"]: r["rubric_version"] for r in records} == versions
    provider.shutdown()


def job_with_ids(trace_id: str, span_id: str) -> JudgeJob:
    turn = Turn(span_id, trace_id, "", 1, 2, "q", "a", index=0)
    return JudgeJob("c", "c", "a", 0, 1, (turn,), False, False, False, "end_marker")


def test_exemplar_only_for_valid_ids_and_the_count_never_suffers() -> None:
    assert trace_exemplar("AB" * 16, "CD" * 8) == {"trace_id": "ab" * 16, "span_id": "cd" * 8}
    # A 64-bit trace id (Zipkin/Jaeger style): padded like the evaluation span's parent, so both name one trace.
    assert trace_exemplar("ab" * 8, "cd" * 8) == {"trace_id": "0" * 16 + "ab" * 8, "span_id": "cd" * 8}
    for trace_id, span_id in (
        ("", ""),
        ("0" * 32, "1" * 16),
        ("a" * 32, "0" * 16),
        ("xyz", "1" * 16),
        ("a" * 33, "1" * 16),
        ("a" * 32, "1" * 17),
        ("0x" + "a" * 30, "1" * 16),
        (" " + "a" * 31, "1" * 16),
    ):
        assert trace_exemplar(trace_id, span_id) is None
    registry = CollectorRegistry()
    instruments = ConsumerInstruments(registry)
    result = MetricResult(name="failure_rate", verdict="stall", score=0.4, threshold=0.7, model="m")
    instruments.record_judgement(Judgement(job_with_ids("not hex", ""), "judged", [result]))
    instruments.record_judgement(Judgement(job_with_ids("b" * 32, "c" * 16), "judged", [result]))
    labels = {"agent": "a", "metric": "failure_rate", "verdict": "stall"}
    assert registry.get_sample_value("tracejudge_verdicts_total", labels) == 2.0
    sample = next(
        s
        for family in registry.collect()
        for s in family.samples
        if s.name == "tracejudge_verdicts_total" and s.labels == labels
    )
    assert sample.exemplar is not None and sample.exemplar.labels == {"trace_id": "b" * 32, "span_id": "c" * 16}


class InHouseJudge(CustomLLMClient):
    """A judge of the user's own (never called here: judge_info is there before any judgement)."""

    async def chat_complete(self, messages: list[dict[str, str]], temperature: float) -> tuple[str, float | None]:
        raise AssertionError("not called")

    def get_model_name(self) -> str:
        return "in-house-judge-v2"


def judge_info(registry: CollectorRegistry) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["metric"], s.labels["model"], s.labels["rubric_version"]): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == "tracejudge_judge_info"
    }


def test_judge_info_is_one_series_per_judge_with_a_custom_client() -> None:
    settings = consumer_settings("127.0.0.1:1", "unused", metrics="failure_rate,conversational_flow", no_results=True)
    app = build_app(settings, judge=InHouseJudge(), registry=CollectorRegistry(), serve_metrics=False)
    assert judge_info(app.registry) == {
        ("failure_rate", "in-house-judge-v2", FailureRateMetric(InHouseJudge()).rubric_version): 1.0,
        ("conversational_flow", "in-house-judge-v2", ConversationalFlowRateMetric(InHouseJudge()).rubric_version): 1.0,
    }
    # A service built without build_app (library use) reports its judges too.
    registry = CollectorRegistry()
    ConsumerService(settings, [FailureRateMetric("anthropic/claude-haiku-4-5")], ConsumerInstruments(registry))
    ((metric, model, version),) = judge_info(registry)
    assert (metric, model) == ("failure_rate", "anthropic/claude-haiku-4-5")
    assert version == FailureRateMetric("anthropic/claude-haiku-4-5").rubric_version
    assert version != FailureRateMetric("gpt-4o-mini").rubric_version  # the extended rubric sent for its cache
