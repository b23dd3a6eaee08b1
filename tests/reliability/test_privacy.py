"""Redaction before content leaves: what the judge server receives, and what the tracer exports."""

from __future__ import annotations

import json

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer, conversation_text
from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.tracer import traced_agent
from tracejudge.tracer.redact import redact_pii

SECRETS = {
    "jane.doe@example.com": "[EMAIL]",
    "+1 (415) 555-2671": "[PHONE]",
    "4111 1111 1111 1111": "[CARD]",
    "DE89 3704 0044 0532 0130 00": "[IBAN]",
    "sk-proj-Abcdefghijklmnop1234567890": "[API_KEY]",
}
MESSAGE = (
    "Contact jane.doe@example.com or +1 (415) 555-2671; card 4111 1111 1111 1111; "
    "IBAN DE89 3704 0044 0532 0130 00; key sk-proj-Abcdefghijklmnop1234567890"
)


def test_redactor_rules() -> None:
    redacted = redact_pii(MESSAGE)
    for secret, marker in SECRETS.items():
        assert secret not in redacted and marker in redacted
    assert redact_pii("card 4111 1111 1111 1112 is not Luhn-valid") == "card 4111 1111 1111 1112 is not Luhn-valid"
    assert redact_pii("order 12345 shipped in 2024") == "order 12345 shipped in 2024"


def test_judge_receives_redacted_content(broker: EmbeddedBroker, topic: str, judge_server: JudgeServer) -> None:
    judge_server.responder = scripted_judge
    provider = traced_app(broker.bootstrap_servers, topic)
    with RunningConsumer(consumer_settings(broker.bootstrap_servers, topic, metrics="failure_rate")) as consumer:
        play(provider, {"pii-1": [(MESSAGE, f"I have noted {MESSAGE}")]})
        wait_for(lambda: consumer.sessions("judged") == 1, what="judged")
    sent = conversation_text(judge_server.requests[0])
    for secret, marker in SECRETS.items():
        assert secret not in sent and marker in sent
    provider.shutdown()


def test_pluggable_redactor_and_tracer_side_redaction() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    @traced_agent("private", redactor=redact_pii, tracer_provider=provider)
    def answer(question: str, session_id: str) -> str:
        return f"echo {question}"

    answer(MESSAGE, session_id="p")
    attributes = dict(exporter.get_finished_spans()[0].attributes or {})
    exported = json.dumps(attributes)
    for secret in SECRETS:
        assert secret not in exported
    assert "[EMAIL]" in attributes["gen_ai.input.messages"] and "[CARD]" in attributes["gen_ai.output.messages"]
