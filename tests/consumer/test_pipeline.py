"""The consumer end to end: @traced_agent → Tansu → consumer → local judge server over HTTP → verdicts."""

from __future__ import annotations

import json
import os
import threading

from kafka import KafkaProducer
from opentelemetry.sdk.trace import TracerProvider

from tests.support.judge_server import JudgeServer, Reply, conversation_text, metric_of
from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.judging.judgement import Judgement
from tracejudge.tracer import traced_agent


class Collect:
    def __init__(self) -> None:
        self.judgements: list[Judgement] = []
        self.lock = threading.Lock()

    def emit(self, judgement: Judgement) -> None:
        with self.lock:
            self.judgements.append(judgement)

    def ids(self) -> list[str]:
        with self.lock:
            return [j.job.conversation_id for j in self.judgements]


def scripted_judge(request: dict) -> Reply:
    """Failure Rate: `hallucination` when the conversation says so; Flow: `mostly`."""
    text = conversation_text(request)
    if metric_of(request) == "conversational_flow":
        return Reply(content=json.dumps({"verdict": "mostly", "key_issues": [], "reason": "ok"}))
    label = "hallucination" if "INVENTED" in text else "honest_fallback"
    return Reply(content=json.dumps({"verdict": label, "evidence": ["turn 1"], "reason": "scripted"}))


def test_end_to_end_with_end_markers(broker: EmbeddedBroker, topic: str, judge_server: JudgeServer) -> None:
    judge_server.responder = scripted_judge
    collect = Collect()
    provider = traced_app(broker.bootstrap_servers, topic)
    with RunningConsumer(consumer_settings(broker.bootstrap_servers, topic), extra_sinks=[collect]) as consumer:
        play(
            provider,
            {
                f"e2e-{i}": [(f"question {i}.{t}", "INVENTED fact" if i == 0 else f"answer {i}.{t}") for t in range(3)]
                for i in range(5)
            },
        )
        wait_for(lambda: consumer.sessions("judged") == 5, what="5 judged conversations")
        assert (
            consumer.value("tracejudge_verdicts_total", agent="support", metric="failure_rate", verdict="hallucination")
            == 1
        )
        assert (
            consumer.value(
                "tracejudge_verdicts_total", agent="support", metric="failure_rate", verdict="honest_fallback"
            )
            == 4
        )
        assert (
            consumer.value("tracejudge_verdicts_total", agent="support", metric="conversational_flow", verdict="mostly")
            == 5
        )
        assert consumer.value("tracejudge_hallucination_rate", agent="support") == 0.2
        assert consumer.value("tracejudge_flow_score", agent="support") == 0.9
        assert consumer.value("tracejudge_records_total", outcome="ok") >= 5
    assert len(judge_server.requests) == 10
    judged = {j.job.conversation_id: j for j in collect.judgements}
    assert set(judged) == {f"e2e-{i}" for i in range(5)}
    job = judged["e2e-3"].job
    assert job.completed_by == "end_marker" and job.version == 3
    assert [t.input for t in job.exchanges] == ["question 3.0", "question 3.1", "question 3.2"]
    sent = [conversation_text(r) for r in judge_server.requests if "question 3.0" in conversation_text(r)]
    assert len(sent) == 2 and "answer 3.2" in sent[0]
    provider.shutdown()


def test_idle_timeout_completes_a_conversation(broker: EmbeddedBroker, topic: str, judge_server: JudgeServer) -> None:
    judge_server.responder = scripted_judge
    collect = Collect()
    provider = traced_app(broker.bootstrap_servers, topic)
    settings = consumer_settings(broker.bootstrap_servers, topic, session_idle_timeout=1.5, metrics="failure_rate")
    with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
        play(provider, {"idle-1": [("hello?", "hi")]}, end=False)
        wait_for(lambda: consumer.sessions("judged") == 1, what="idle conversation judged")
    assert collect.judgements[0].job.completed_by == "idle_timeout"
    provider.shutdown()


def test_duplicate_records_count_once(broker: EmbeddedBroker, topic: str, judge_server: JudgeServer) -> None:
    """Kafka is at-least-once: the same spans delivered twice make one turn each."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    judge_server.responder = scripted_judge
    collect = Collect()
    provider = TracerProvider()
    tracer = provider.get_tracer("dup")
    spans = []
    for turn in range(2):
        span = tracer.start_span(
            "invoke_agent dup",
            attributes={
                "gen_ai.conversation.id": "dup-1",
                "gen_ai.agent.name": "dup",
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.input.messages": json.dumps(
                    [{"role": "user", "parts": [{"type": "text", "content": f"q{turn}"}]}]
                ),
                "gen_ai.output.messages": json.dumps(
                    [{"role": "assistant", "parts": [{"type": "text", "content": "a"}]}]
                ),
            },
        )
        span.end()
        spans.append(span)
    marker = tracer.start_span(
        "end", attributes={"gen_ai.conversation.id": "dup-1", "tracejudge.conversation.ended": True}
    )
    marker.end()
    payload = encode_spans(spans).SerializeToString()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    for _ in range(3):
        producer.send(topic, key=b"dup-1", value=payload)
    producer.send(topic, key=b"dup-1", value=encode_spans([marker]).SerializeToString())
    producer.flush()
    producer.close()
    settings = consumer_settings(broker.bootstrap_servers, topic, metrics="failure_rate")
    with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
        wait_for(lambda: consumer.sessions("judged") == 1, what="one judgement")
        assert consumer.app.service.counts()["duplicate_spans"] == 4
    assert len(collect.judgements) == 1 and len(collect.judgements[0].job.exchanges) == 2
    assert len(judge_server.requests) == 1


def test_malformed_records_are_counted_and_dead_lettered(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    from tests.support.pipeline import read_records

    judge_server.responder = scripted_judge
    dead_letter = f"{topic}-dlq"
    broker.create_topic(dead_letter, 1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    for bad in (b"\xff\x00garbage", b"{not json", b"\x0a\x05trunc", os.urandom(64)):
        producer.send(topic, key=b"x", value=bad)
    producer.flush()
    provider = traced_app(broker.bootstrap_servers, topic)
    settings = consumer_settings(broker.bootstrap_servers, topic, metrics="failure_rate", dead_letter_topic=dead_letter)
    with RunningConsumer(settings) as consumer:
        play(provider, {"after-garbage": [("q", "a")]})
        wait_for(lambda: consumer.sessions("judged") == 1, what="the valid conversation judged")
        assert consumer.value("tracejudge_records_total", outcome="malformed") == 4
    copies = read_records(broker.bootstrap_servers, dead_letter, expected=4)
    assert {b"\xff\x00garbage", b"{not json", b"\x0a\x05trunc"} <= {r.value for r in copies}
    assert all(dict(r.headers)["tracejudge.error"] for r in copies)
    producer.close()
    provider.shutdown()


def test_error_turns_are_always_judged(broker: EmbeddedBroker, topic: str, judge_server: JudgeServer) -> None:
    judge_server.responder = scripted_judge
    collect = Collect()
    provider = traced_app(broker.bootstrap_servers, topic)

    @traced_agent("fragile", tracer_provider=provider)
    def respond(question: str, session_id: str) -> str:
        if "boom" in question:
            raise RuntimeError("tool failed")
        return "fine"

    settings = consumer_settings(broker.bootstrap_servers, topic, sample_rate=0.0, metrics="failure_rate")
    with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
        for cid, question in (("ok-1", "hello"), ("err-1", "boom please")):
            try:
                respond(question, session_id=cid)
            except RuntimeError:
                pass
            from tracejudge.tracer import end_conversation

            end_conversation(cid, tracer_provider=provider)
        provider.force_flush()
        wait_for(lambda: consumer.sessions() == 2, what="both conversations accounted")
        assert consumer.sessions("sampled_out") == 1
    judged = [j for j in collect.judgements if j.outcome != "sampled_out"]
    assert [j.job.conversation_id for j in judged] == ["err-1"] and judged[0].job.has_error
    provider.shutdown()


def test_continued_conversation_is_judged_again_as_a_new_version(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    judge_server.responder = scripted_judge
    collect = Collect()
    provider = traced_app(broker.bootstrap_servers, topic)
    settings = consumer_settings(broker.bootstrap_servers, topic, metrics="failure_rate")
    with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
        play(provider, {"cont-1": [("first", "a")]})
        wait_for(lambda: consumer.sessions("judged") == 1, what="first version")
        play(provider, {"cont-1": [("second", "b"), ("third", "c")]})
        wait_for(lambda: consumer.sessions("judged") == 2, what="second version")
    first, second = collect.judgements
    assert (first.job.version, second.job.version) == (1, 3)
    assert [t.input for t in second.job.exchanges] == ["first", "second", "third"]
    provider.shutdown()
