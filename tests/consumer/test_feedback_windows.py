"""Negative feedback in every window of a conversation's lifecycle leads to exactly one judgement (sample rate 0).

Windows in which a negative feedback can arrive, relative to its conversation (sessions.py's lifecycle), each tested:
- open: before the end marker (`w-open`);
- in the same Kafka record as the end marker, either order (`w-same-end-fb`, `w-same-fb-end`);
- completing: ended, not yet dispatched (end marker and feedback in two records of one poll batch, `w-completing`);
- right after `end_conversation` (separate records, racing the sampling decision, `w-right-after`);
- while being judged (sampled in by its agent's rate, the judge call in flight, `w-being-judged`);
- after being judged: no second judgement (`w-judged-already`);
- after being sampled out and finished (`w-sampled-out`), twice (`w-twice`: still one judgement);
- after being skipped for budget (`w-skipped`), and while waiting for a judge slot that the budget then refuses
  (`w-skip-waiting`: the skipped job finishes, the feedback already attached re-completes it).
Each is counted at the judge server (requests carrying the conversation's text) and in the results (the sink).
"""

from __future__ import annotations

import json
import threading
from collections import Counter

from kafka import KafkaProducer
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.consumer.test_pipeline import Collect
from tests.support.judge_server import JudgeServer, Reply, conversation_text
from tests.support.pipeline import RunningConsumer, consumer_settings, last_outcome, play, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit.prometheus import family_total
from tracejudge.tracer import end_conversation, record_feedback


class SlowFor:
    """The scripted judge; conversations whose text holds `slow` wait until `release` is set (a call in flight)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, request: dict) -> Reply:
        if "slow" in conversation_text(request):
            self.release.wait(20)
        return Reply(content=json.dumps({"verdict": "honest_fallback", "evidence": [], "reason": "scripted"}))


def one_record(bootstrap: str, topic: str, conversation: str, *, feedback_first: bool) -> None:
    """The end marker and a thumbs-down as the tracer makes them, sent in ONE Kafka record (either order)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    if feedback_first:
        record_feedback(conversation, label="thumbs_down", tracer_provider=provider)
        end_conversation(conversation, agent="support", tracer_provider=provider)
    else:
        end_conversation(conversation, agent="support", tracer_provider=provider)
        record_feedback(conversation, label="thumbs_down", tracer_provider=provider)
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    payload = encode_spans(list(exporter.get_finished_spans())).SerializeToString()
    producer.send(topic, key=conversation.encode(), value=payload)
    producer.flush()
    producer.close()


def thumbs_down(provider: TracerProvider, *conversations: str) -> None:
    for conversation in conversations:
        record_feedback(conversation, label="thumbs_down", tracer_provider=provider)
    provider.force_flush()


def judged_per_conversation(judge_server: JudgeServer, collect: Collect) -> tuple[Counter, Counter]:
    at_server = Counter(
        conversation_text(r).split("question of ")[1].split('"')[0]
        for r in judge_server.requests
        if "question of " in conversation_text(r)
    )
    in_results = Counter(j.job.conversation_id for j in collect.judgements if j.outcome == "judged")
    return at_server, in_results


def judged_ids(collect: Collect) -> set[str]:
    with collect.lock:
        return {j.job.conversation_id for j in collect.judgements if j.outcome == "judged"}


def negatives(consumer: RunningConsumer) -> float:
    return family_total(consumer.app.registry, "tracejudge_feedback", feedback="negative")


def asked(judge_server: JudgeServer, conversation: str) -> bool:
    """The judge server has the request (its answer waits in the responder: the call is in flight)."""
    return any(f"question of {conversation}" in conversation_text(r) for r in list(judge_server.requests))


def ask(conversation: str) -> list[tuple[str, str]]:
    return [(f"question of {conversation}", "an answer")]


def test_negative_feedback_in_every_window_is_judged_once(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    judge = SlowFor()
    judge_server.responder = judge
    collect = Collect()
    provider = traced_app(broker.bootstrap_servers, topic)
    # Before the consumer starts, so end marker and feedback reach it in one poll batch.
    play(provider, {c: ask(c) for c in ("w-same-end-fb", "w-same-fb-end", "w-completing")}, end=False)
    one_record(broker.bootstrap_servers, topic, "w-same-end-fb", feedback_first=False)
    one_record(broker.bootstrap_servers, topic, "w-same-fb-end", feedback_first=True)
    end_conversation("w-completing", agent="support", tracer_provider=provider)
    provider.force_flush()
    thumbs_down(provider, "w-completing")
    settings = consumer_settings(
        broker.bootstrap_servers, topic, sample_rate=0.0, agent_sample_rates="paid=1.0", metrics="failure_rate"
    )
    with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
        # open: feedback before the end marker
        play(provider, {"w-open": ask("w-open")}, end=False)
        thumbs_down(provider, "w-open")
        end_conversation("w-open", agent="support", tracer_provider=provider)
        # right after end_conversation
        play(provider, {"w-right-after": ask("w-right-after")})
        thumbs_down(provider, "w-right-after")
        # sampled out and finished, then feedback (twice for w-twice)
        play(provider, {c: ask(c) for c in ("w-sampled-out", "w-twice")})
        wait_for(
            lambda: all(last_outcome(consumer.app.service, c) == "sampled_out" for c in ("w-sampled-out", "w-twice")),
            what="both sampled out and finished",
        )
        thumbs_down(provider, "w-sampled-out", "w-twice", "w-twice")
        # while being judged: sampled in by its agent's rate, feedback while the judge call hangs
        play(provider, {"w-being-judged-slow": ask("w-being-judged-slow")}, agent="paid")
        wait_for(lambda: asked(judge_server, "w-being-judged-slow"), what="the judge call in flight")
        thumbs_down(provider, "w-being-judged-slow")
        wait_for(lambda: negatives(consumer) == 9, what="the feedback read while the call is in flight")
        judge.release.set()
        # judged already: feedback afterwards joins the verdict, no second judgement
        play(provider, {"w-judged-already": ask("w-judged-already")}, agent="paid")
        wait_for(lambda: "w-judged-already" in collect.ids(), what="w-judged-already judged")
        thumbs_down(provider, "w-judged-already")
        expected = {
            "w-same-end-fb",
            "w-same-fb-end",
            "w-completing",
            "w-open",
            "w-right-after",
            "w-sampled-out",
            "w-twice",
            "w-being-judged-slow",
            "w-judged-already",
        }
        wait_for(lambda: negatives(consumer) == 10, what="every feedback read")
        wait_for(lambda: judged_ids(collect) >= expected, what="every conversation judged")
        consumer.stop()  # drains: a second judgement, if any were coming, would be counted below
    at_server, in_results = judged_per_conversation(judge_server, collect)
    print(f"\nfeedback windows: judge calls per conversation {dict(at_server)}")
    assert at_server == Counter({c: 1 for c in expected}), at_server
    assert in_results == Counter({c: 1 for c in expected}), in_results
    assert consumer.sessions("judged") == len(expected)
    # Which window each feedback met: taken into the snapshot at dispatch (completed by its end marker), or
    # re-completing a finished conversation (completed by the feedback).
    completed_by = {j.job.conversation_id: j.job.completed_by for j in collect.judgements if j.outcome == "judged"}
    for conversation in ("w-same-end-fb", "w-same-fb-end", "w-completing", "w-open"):
        assert completed_by[conversation] == "end_marker", (conversation, completed_by[conversation])
    for conversation in ("w-sampled-out", "w-twice"):
        assert completed_by[conversation] == "negative_feedback", (conversation, completed_by[conversation])
    provider.shutdown()


def test_negative_feedback_after_a_budget_skip_is_judged_once(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    judge = SlowFor()
    judge_server.responder = judge
    collect = Collect()
    provider = traced_app(broker.bootstrap_servers, topic)
    settings = consumer_settings(
        broker.bootstrap_servers,
        topic,
        sample_rate=0.0,
        agent_sample_rates="paid=1.0",
        metrics="failure_rate",
        max_cost_per_hour=1e-9,  # the first call (cost unknown until it settles) spends it all
        max_concurrency=1,
    )
    with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
        # The first call holds the only slot; w-skip-waiting queues for it and its feedback arrives meanwhile.
        play(provider, {"w-first-slow": ask("w-first-slow")}, agent="paid")
        wait_for(lambda: asked(judge_server, "w-first-slow"), what="the first call in flight")
        play(provider, {"w-skip-waiting": ask("w-skip-waiting")}, agent="paid")
        wait_for(lambda: consumer.app.service.pool.pending == 2, what="w-skip-waiting waiting for the slot")
        thumbs_down(provider, "w-skip-waiting")
        wait_for(lambda: negatives(consumer) == 1, what="its feedback read while it waits")
        judge.release.set()
        # Skipped for budget and finished, then feedback.
        play(provider, {"w-skipped": ask("w-skipped")}, agent="paid")
        wait_for(
            lambda: last_outcome(consumer.app.service, "w-skipped") == "skipped_budget",
            what="w-skipped skipped and finished",
        )
        thumbs_down(provider, "w-skipped")
        expected = {"w-first-slow", "w-skip-waiting", "w-skipped"}
        wait_for(lambda: judged_ids(collect) >= expected, what="every conversation judged")
        skipped = consumer.sessions("skipped_budget")
        consumer.stop()
    at_server, in_results = judged_per_conversation(judge_server, collect)
    print(f"\nfeedback after budget skips: {skipped:.0f} skipped, judge calls per conversation {dict(at_server)}")
    assert skipped == 2  # w-skip-waiting and w-skipped were each skipped once before their feedback forced them
    completed_by = {j.job.conversation_id: j.job.completed_by for j in collect.judgements if j.outcome == "judged"}
    assert completed_by["w-skip-waiting"] == completed_by["w-skipped"] == "negative_feedback"
    assert at_server == Counter({c: 1 for c in expected}), at_server
    assert in_results == Counter({c: 1 for c in expected}), in_results
    provider.shutdown()
