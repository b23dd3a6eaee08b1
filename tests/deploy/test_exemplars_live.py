"""From a spike to its trace: a real Prometheus 2.42 with exemplar storage scrapes a real consumer (OpenMetrics), and
`/api/v1/query_exemplars` returns the judged conversation's last-turn trace and span ids."""

from __future__ import annotations

import time
from pathlib import Path

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.consumer.test_pipeline import scripted_judge
from tests.consumer.test_provenance import last_turn_ids
from tests.support.judge_server import JudgeServer
from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app, wait_for
from tests.support.prometheus import api, running_prometheus
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.metrics import FailureRateMetric


def test_query_exemplars_returns_the_judged_trace(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = scripted_judge
    provider = traced_app(broker.bootstrap_servers, topic)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = consumer_settings(broker.bootstrap_servers, topic, metrics="failure_rate")
    with RunningConsumer(settings) as consumer:
        with running_prometheus(tmp_path, consumer.app.metrics_url) as base:
            play(provider, {"honest-1": [("hello", "hi")]})
            play(provider, {"liar-1": [("q1", "a1"), ("q2", "INVENTED figure")]})
            wait_for(lambda: consumer.sessions("judged") == 2, what="both judged")
            trace_id, span_id = last_turn_ids(exporter, "liar-1")
            first_turn = min(
                (
                    s
                    for s in exporter.get_finished_spans()
                    if (s.attributes or {}).get("gen_ai.conversation.id") == "liar-1"
                ),
                key=lambda s: s.start_time or 0,
            )
            assert format(first_turn.context.span_id, "016x") != span_id

            def exemplars(query: str) -> list[dict]:
                now = time.time()
                data = api(base, "/api/v1/query_exemplars", query=query, start=str(now - 600), end=str(now + 60))
                return [dict(e["labels"], **s["seriesLabels"]) for s in data for e in s["exemplars"]]

            query = 'tracejudge_verdicts_total{verdict="hallucination"}'
            wait_for(lambda: bool(exemplars(query)), timeout=30, what="an exemplar stored by Prometheus")
            found = exemplars(query)
            assert {(e["trace_id"], e["span_id"]) for e in found} == {(trace_id, span_id)}
            assert all(e["agent"] == "support" and e["metric"] == "failure_rate" for e in found)
            # The score histogram's bucket points at the same trace; the honest verdict at another one.
            wait_for(lambda: bool(exemplars('tracejudge_score_bucket{le="0.0"}')), timeout=10, what="score exemplar")
            assert {e["trace_id"] for e in exemplars('tracejudge_score_bucket{le="0.0"}')} == {trace_id}
            # docs/metrics.md's join: verdicts split by the rubric version of the judge that gave them.
            join = (
                "sum by (metric, rubric_version) (tracejudge_verdicts_total * on (instance, metric) "
                "group_left (rubric_version) tracejudge_judge_info)"
            )
            (split,) = api(base, "/api/v1/query", query=join)["result"]
            assert split["metric"]["rubric_version"] == FailureRateMetric("m").rubric_version
            assert float(split["value"][1]) == 2.0
            honest_query = 'tracejudge_verdicts_total{verdict="honest_fallback"}'
            wait_for(lambda: bool(exemplars(honest_query)), timeout=10, what="honest exemplar")
            assert trace_id not in {e["trace_id"] for e in exemplars(honest_query)}
    provider.shutdown()
