"""Nothing vanishes silently: a recorded set-up whose library put no text on its spans, through the real consumer on
Tansu, ends counted `failed` with reason `empty_conversation`, its spans counted by convention, and a log line names
what to set; even at a sample rate of zero (nothing to judge is never sampled out)."""

from __future__ import annotations

import logging
import uuid

import pytest
from kafka import KafkaProducer

from tests.consumer.test_interop import SETUPS, expected, records
from tests.consumer.test_pipeline import Collect
from tests.support.judge_server import JudgeServer, verdict
from tests.support.pipeline import RunningConsumer, consumer_settings, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker

# What the log line must tell the user to set, per content-less set-up (a new one without an entry fails here).
TO_SET = {
    "openai_v2_default": ("genai", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=span_only"),
    "openai_v2_event_only": ("genai", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=span_only"),
    "langfuse_no_io": ("langfuse", "LANGFUSE_OBSERVE_DECORATOR_IO_CAPTURE_ENABLED=true"),
    "vercel_ai_no_content": ("vercel_ai", "recordInputs: true, recordOutputs: true"),
    "adk_no_content": ("google_adk", "ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS=true"),
    "agento11y_default": ("agento11y", "AGENTO11Y_USE_EXPERIMENTAL_OTEL=true"),
    "agento11y_default_booking_stream": ("agento11y", "AGENTO11Y_USE_EXPERIMENTAL_OTEL=true"),
}
TEXTLESS = [s for s in SETUPS if expected(s).get("content_on_spans") is False]


def test_every_content_less_setup_says_what_to_set() -> None:
    assert TEXTLESS and sorted(TEXTLESS) == sorted(TO_SET)


@pytest.mark.parametrize("setup", TEXTLESS)
def test_content_less_conversation_fails_empty_and_is_heard(
    broker: EmbeddedBroker, setup: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    convention, to_set = TO_SET[setup]
    want = expected(setup)
    judge = JudgeServer(default=verdict("honest_fallback")).start()
    monkeypatch.setenv("OPENAI_BASE_URL", judge.base_url)
    monkeypatch.setenv("OPENAI_API_BASE", judge.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-local")
    topic = f"textless-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, partitions=3)
    collect = Collect()
    settings = consumer_settings(
        broker.bootstrap_servers,
        topic,
        metrics="failure_rate",
        session_idle_timeout=1.0,
        sample_rate=0.0,
    )
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=0)
    try:
        with caplog.at_level(logging.WARNING, logger="tracejudge.consumer"):
            with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
                for key, value in records(setup):
                    producer.send(topic, key=key, value=value)
                producer.flush()
                wait_for(lambda: collect.judgements, timeout=30, what=f"{setup} finished")
                wait_for(lambda: consumer.sessions("failed") == 1, timeout=10, what="counted failed")
                errors = consumer.value(
                    "tracejudge_judge_errors_total", metric="failure_rate", reason="empty_conversation"
                )
                textless = consumer.value(
                    "tracejudge_textless_llm_spans_total", convention=convention, outcome="counted_as_turn"
                )
                assert consumer.sessions() == 1  # exactly one outcome: not also sampled out
    finally:
        producer.close()
        judge.stop()
    [judgement] = collect.judgements
    assert judgement.job.conversation_id == want["conversation_id"]
    assert judgement.outcome == "failed" and [r.error_kind for r in judgement.results] == ["empty_conversation"]
    assert errors == 1 and textless >= 1
    assert not judge.requests  # no judge call for nothing to judge
    told = [r.getMessage() for r in caplog.records if "carry no text" in r.getMessage()]
    assert told and any(to_set in line for line in told), told
