"""Results out: Prometheus (registry and a real scrape), OTLP evaluation spans and events, the results topic."""

from __future__ import annotations

import json
import urllib.request

from prometheus_client import CollectorRegistry

from tests.consumer.test_pipeline import Collect, scripted_judge
from tests.support.judge_server import JudgeServer, Reply, metric_of
from tests.support.otlp_receiver import OtlpReceiver, attributes
from tests.support.pipeline import RunningConsumer, consumer_settings, play, read_records, traced_app, wait_for
from tracejudge.consumer.adapters import Turn
from tracejudge.consumer.conversation.identity import content_id
from tracejudge.consumer.conversation.job import JudgeJob
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.judging.judgement import Judgement
from tracejudge.consumer.judging.results import result_id
from tracejudge.metrics import MetricResult


def job(conversation_id: str, agent: str = "a", version: int = 1) -> JudgeJob:
    turn = Turn("00000000000000aa", "0" * 31 + "1", "", 1, 2, "q", "a", index=0)
    return JudgeJob(conversation_id, conversation_id, agent, 0, version, (turn,), False, False, False, "end_marker")


def verdict(metric: str, label: str, score: float) -> MetricResult:
    return MetricResult(name=metric, verdict=label, score=score, success=score >= 0.7, threshold=0.7, model="m")


def test_windows_count_and_time() -> None:
    registry = CollectorRegistry()
    instruments = ConsumerInstruments(registry, window_sessions=4, window_seconds=100)
    windows = instruments.windows
    for i, label in enumerate(["hallucination", "honest_fallback", "hallucination", "stall", "stall", "stall"]):
        windows.add("failure_rate", "bot", 0.0, label, now=float(i))
    rate, _ = windows.values(now=6.0)
    assert rate["bot"] == 0.25  # last 4: hallucination, stall, stall, stall
    for score, at in ((1.0, 0.0), (0.3, 50.0), (0.9, 120.0)):
        windows.add("conversational_flow", "bot", score, "x", now=at)
    _, flow = windows.values(now=140.0)
    assert flow["bot"] == 0.6  # the 1.0 at t=0 aged out of the 100 s window
    rate, flow = windows.values(now=1_000.0)
    assert rate == {} and flow == {}


def test_registry_values_and_cardinality_guard() -> None:
    registry = CollectorRegistry()
    instruments = ConsumerInstruments(registry, max_agents=3)
    for i in range(10):
        instruments.record_judgement(
            Judgement(job(f"c{i}", agent=f"agent-{i}"), "judged", [verdict("failure_rate", "hallucination", 0.0)])
        )
    failed = MetricResult(name="failure_rate", threshold=0.7, model="m", error="x", error_kind="timeout")
    instruments.record_judgement(Judgement(job("f", agent="agent-0"), "failed", [failed]))
    instruments.record_judgement(Judgement(job("s", agent="agent-1"), "sampled_out"))
    agents = {s.labels["agent"] for family in registry.collect() for s in family.samples if "agent" in s.labels}
    assert agents == {"agent-0", "agent-1", "agent-2", "_other"}
    get = registry.get_sample_value
    assert (
        get("tracejudge_verdicts_total", {"agent": "_other", "metric": "failure_rate", "verdict": "hallucination"}) == 7
    )
    assert get("tracejudge_verdicts_total", {"agent": "agent-0", "metric": "failure_rate", "verdict": "stall"}) == 0
    assert get("tracejudge_sessions_total", {"agent": "agent-0", "outcome": "failed"}) == 1
    assert get("tracejudge_sessions_total", {"agent": "agent-1", "outcome": "sampled_out"}) == 1
    assert get("tracejudge_judge_errors_total", {"metric": "failure_rate", "reason": "timeout"}) == 1
    assert get("tracejudge_score_bucket", {"agent": "_other", "metric": "failure_rate", "le": "0.0"}) == 7
    assert get("tracejudge_hallucination_rate", {"agent": "_other"}) == 1.0


GOLDEN_TURNS = (
    Turn("00000000000000aa", "0" * 31 + "1", "", 1_700_000_000_000_000_000, 1_700_000_000_500_000_000,
         "where is my order?", "it ships today", index=0),
    Turn("00000000000000bb", "0" * 31 + "1", "", 1_700_000_001_000_000_000, 1_700_000_001_500_000_000,
         "thanks", None, index=1),
)  # fmt: skip


def test_result_id_is_deterministic() -> None:
    content = content_id("c", GOLDEN_TURNS)
    assert result_id("c", "failure_rate", content) == result_id("c", "failure_rate", content)
    tail = content_id("c", GOLDEN_TURNS[1:])
    ids = {result_id("c", "failure_rate", content), result_id("c", "failure_rate", tail), result_id("c", "x", content)}
    assert len(ids) == 3


def test_content_and_result_ids_are_pinned() -> None:
    """Golden values: result ids are stored by users (de-duplication, joins), so the hash and its material are a
    contract; changing either must fail here, not silently re-key every result."""
    content = content_id("conv-golden", GOLDEN_TURNS)
    assert content == "865c12d5b413396421d42f91c974af86"
    assert content_id("conv-golden", GOLDEN_TURNS[:1]) == "73feef5609869e049e4162f4cee51581"
    assert result_id("conv-golden", "failure_rate", content) == "29069778fa740df54b7f931db2aaad00"
    assert result_id("conv-golden", "conversational_flow", content) == "db7a5089179ccff653a6fcbcb035a75b"


def test_scrape_otlp_and_results_topic(broker: EmbeddedBroker, topic: str, judge_server: JudgeServer) -> None:
    def respond(request: dict) -> Reply:
        reply = scripted_judge(request)
        if metric_of(request) == "failure_rate":
            body = json.loads(reply.content or "{}")
            reply.content = json.dumps(body)
        return reply

    judge_server.responder = respond
    results = f"{topic}-results"
    broker.create_topic(results, 1)
    collect = Collect()
    provider = traced_app(broker.bootstrap_servers, topic)
    with OtlpReceiver() as receiver:
        settings = consumer_settings(
            broker.bootstrap_servers, topic, otlp_endpoint=receiver.endpoint, results_topic=results
        )
        with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
            play(provider, {"out-1": [("q1", "a1"), ("q2", "INVENTED")], "out-2": [("q", "a")]})
            wait_for(lambda: consumer.sessions("judged") == 2, what="two judged")
            url = consumer.app.metrics_url
            assert url is not None
            scraped = urllib.request.urlopen(url, timeout=10).read().decode()
            assert (
                'tracejudge_verdicts_total{agent="support",metric="failure_rate",verdict="hallucination"} 1.0'
                in scraped
            )
            assert 'tracejudge_sessions_total{agent="support",outcome="judged"} 2.0' in scraped
            for name in (
                "tracejudge_hallucination_rate",
                "tracejudge_flow_score",
                "tracejudge_judge_latency_seconds_bucket",
                "tracejudge_judge_tokens_total",
                "tracejudge_sessions_open",
                "tracejudge_judgements_in_flight",
                "tracejudge_records_total",
                "tracejudge_consumer_lag",
                "tracejudge_judge_cost_usd_total",
            ):
                assert name in scraped, name
        # The app closed and flushed its OTLP providers on stop.
        contents = {j.job.conversation_id: j.job.content_id for j in collect.judgements}
        for judgement in collect.judgements:  # the job's content id names exactly the transcript it judged
            assert judgement.job.content_id == content_id(judgement.job.conversation_id, judgement.job.exchanges)
        assert len(set(contents.values())) == 2
        judged_turns = {
            j.job.conversation_id: (j.job.last_exchange.trace_id, j.job.last_exchange.span_id)
            for j in collect.judgements
        }
        spans = [s for s in receiver.spans if s.name.startswith("evaluate ")]
        assert sorted(s.name for s in spans) == [
            "evaluate conversational_flow",
            "evaluate conversational_flow",
            "evaluate failure_rate",
            "evaluate failure_rate",
        ]
        for span in spans:
            a = attributes(span)
            trace_id, span_id = judged_turns[a["gen_ai.conversation.id"]]
            assert (span.trace_id.hex(), span.parent_span_id.hex()) == (trace_id, span_id)
            assert a["gen_ai.evaluation.name"] in ("failure_rate", "conversational_flow")
            assert a["gen_ai.agent.name"] == "support"
            assert a["gen_ai.operation.name"] == "evaluation"  # the conventions' evaluation span
            assert a["gen_ai.request.model"] == a["tracejudge.evaluation.model"] != ""
            conversation = a["gen_ai.conversation.id"]
            assert a["tracejudge.evaluation.id"] == result_id(
                conversation, a["gen_ai.evaluation.name"], contents[conversation]
            )
            for key in (
                "gen_ai.evaluation.score.value",
                "gen_ai.evaluation.score.label",
                "gen_ai.evaluation.explanation",
                "tracejudge.evaluation.passed",
                "tracejudge.evaluation.threshold",
                "tracejudge.evaluation.model",
                "tracejudge.evaluation.version",
                "tracejudge.evaluation.evidence",
            ):
                assert key in a, key
        hallucination = next(s for s in spans if attributes(s).get("gen_ai.evaluation.score.label") == "hallucination")
        assert attributes(hallucination)["gen_ai.conversation.id"] == "out-1"
        assert attributes(hallucination)["gen_ai.evaluation.score.value"] == 0.0
        events = [r for r in receiver.logs if r.event_name == "gen_ai.evaluation.result"]
        assert len(events) == 4
        for record in events:
            a = attributes(record)
            assert (record.trace_id.hex(), record.span_id.hex()) == judged_turns[a["gen_ai.conversation.id"]]
            assert "gen_ai.evaluation.name" in a and "gen_ai.evaluation.score.label" in a
    records = [json.loads(r.value) for r in read_records(broker.bootstrap_servers, results, expected=4)]
    assert len(records) == 4
    first = next(r for r in records if r["conversation_id"] == "out-1" and r["metric"] == "failure_rate")
    assert first["verdict"] == "hallucination" and first["score"] == 0.0 and first["turn_count"] == 2
    assert first["result_id"] == result_id("out-1", "failure_rate", contents["out-1"])
    assert first["content_id"] == contents["out-1"]
    for key in ("reason", "evidence", "model", "cost_usd", "input_tokens", "output_tokens", "judged_at", "version"):
        assert key in first
    provider.shutdown()
