"""Human feedback: joined to verdicts before or after them, agreement and disagreements, negative forces judging."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.consumer.test_pipeline import Collect, scripted_judge
from tests.support.judge_server import JudgeServer, conversation_text
from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.tracer import end_conversation, record_feedback, traced_agent


def test_record_feedback_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    record_feedback("c-1", score=-3, label="thumbs_down", comment="wrong", agent="bot", tracer_provider=provider)
    record_feedback("c-1", tracer_provider=provider)  # nothing to say: no span
    (span,) = exporter.get_finished_spans()
    assert span.start_time == span.end_time
    assert dict(span.attributes or {}) == {
        "gen_ai.conversation.id": "c-1",
        "gen_ai.agent.name": "bot",
        "tracejudge.feedback.score": -1.0,
        "tracejudge.feedback.label": "thumbs_down",
        "tracejudge.feedback.comment": "wrong",
    }


def test_negative_feedback_forces_judging(broker: EmbeddedBroker, topic: str, judge_server: JudgeServer) -> None:
    judge_server.responder = scripted_judge
    collect = Collect()
    provider = traced_app(broker.bootstrap_servers, topic)
    settings = consumer_settings(broker.bootstrap_servers, topic, sample_rate=0.0, metrics="failure_rate")
    with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
        play(provider, {"unhappy": [("unhappy q", "a")], "happy": [("happy q", "a")], "early": [("early q", "a")]})
        wait_for(lambda: consumer.sessions("sampled_out") == 3, what="all three sampled out")
        record_feedback("unhappy", label="thumbs_down", tracer_provider=provider)
        record_feedback("happy", label="thumbs_up", tracer_provider=provider)
        provider.force_flush()
        wait_for(lambda: consumer.sessions("judged") == 1, what="the unhappy conversation judged")
        # Negative feedback before the conversation completes: judged at once, never sampled out.
        play(provider, {"late": [("late q", "a")]}, end=False)
        record_feedback("late", score=-0.5, tracer_provider=provider)
        end_conversation("late", tracer_provider=provider)
        provider.force_flush()
        wait_for(lambda: consumer.sessions("judged") == 2, what="the late conversation judged")
        assert consumer.value("tracejudge_feedback_total", agent="support", feedback="negative") == 2
        assert consumer.value("tracejudge_feedback_total", agent="support", feedback="positive") == 1
    judged = [j.job for j in collect.judgements if j.outcome == "judged"]
    assert sorted(j.conversation_id for j in judged) == ["late", "unhappy"]
    assert {j.completed_by for j in judged} == {"negative_feedback", "end_marker"}
    texts = [conversation_text(r) for r in judge_server.requests]
    assert len(texts) == 2 and not any("happy q" in t and "unhappy" not in t for t in texts)
    provider.shutdown()


def test_agreement_and_disagreements(broker: EmbeddedBroker, topic: str, judge_server: JudgeServer) -> None:
    judge_server.responder = scripted_judge  # INVENTED → hallucination (fail), otherwise honest_fallback (pass)
    provider = traced_app(broker.bootstrap_servers, topic)

    @traced_agent("support", tracer_provider=provider)
    def respond(question: str, session_id: str) -> str:
        return "INVENTED" if "invent" in question else "I do not know."

    settings = consumer_settings(broker.bootstrap_servers, topic, metrics="failure_rate")
    with RunningConsumer(settings) as consumer:
        # Feedback before the verdict (it waits for the judgement).
        respond("invent a", session_id="fb-a")
        record_feedback("fb-a", label="thumbs_down", tracer_provider=provider)  # fail & negative: agree
        respond("honest b", session_id="fb-b")
        record_feedback("fb-b", label="thumbs_down", tracer_provider=provider)  # pass & negative: disagree
        for conversation in ("fb-a", "fb-b"):
            end_conversation(conversation, tracer_provider=provider)
        respond("honest c", session_id="fb-c")
        respond("invent d", session_id="fb-d")
        for conversation in ("fb-c", "fb-d"):
            end_conversation(conversation, tracer_provider=provider)
        provider.force_flush()
        wait_for(lambda: consumer.sessions("judged") == 4, what="four judged")
        # Feedback after the verdict (the verdict waits for it).
        record_feedback("fb-c", score=1.0, tracer_provider=provider)  # pass & positive: agree
        record_feedback("fb-d", score=0.8, tracer_provider=provider)  # fail & positive: disagree
        provider.force_flush()

        def disagreements(judge: str, human: str) -> float:
            return consumer.value(
                "tracejudge_judge_human_disagreements_total",
                agent="support",
                metric="failure_rate",
                judge=judge,
                human=human,
            )

        wait_for(lambda: disagreements("fail", "pass") == 1, what="the late disagreement")
        assert disagreements("pass", "fail") == 1
        assert consumer.value("tracejudge_judge_human_agreement", agent="support", metric="failure_rate") == 0.5
        # The counters the recording rule pools across replicas give the same: 1 - disagreements / comparisons.
        comparisons = consumer.value("tracejudge_judge_human_comparisons_total", agent="support", metric="failure_rate")
        assert comparisons == 4
        assert 1 - (disagreements("pass", "fail") + disagreements("fail", "pass")) / comparisons == 0.5
        assert consumer.value("tracejudge_feedback_total", agent="support", feedback="positive") == 2
        assert consumer.value("tracejudge_feedback_total", agent="support", feedback="negative") == 2
    provider.shutdown()
