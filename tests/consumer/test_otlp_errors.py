"""An unreachable OTLP collector is counted (`tracejudge_output_errors_total{output="otlp"}` on /metrics) and heard
(a rate-limited line naming the endpoint and what to check): the SDK's exporters return FAILURE, they never raise."""

from __future__ import annotations

import logging
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer
from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker, free_port


def scraped(url: str, name: str, **labels: str) -> float | None:
    """One sample's value from a real scrape of the consumer's /metrics."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def test_an_unreachable_otlp_endpoint_is_counted_and_heard(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, caplog: pytest.LogCaptureFixture
) -> None:
    judge_server.responder = scripted_judge
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    settings = consumer_settings(broker.bootstrap_servers, topic, metrics="failure_rate", otlp_endpoint=endpoint)
    provider = traced_app(broker.bootstrap_servers, topic)
    caplog.set_level(logging.WARNING, logger="tracejudge.consumer.otlp")
    with RunningConsumer(settings) as consumer:
        url = consumer.app.metrics_url
        assert url is not None
        # The series exists at 0 before any failure, so rate() and increase() see the first one.
        assert scraped(url, "tracejudge_output_errors_total", output="otlp") == 0.0
        play(provider, {"otlp-down-1": [("q", "a")]})
        wait_for(lambda: consumer.sessions("judged") == 1, what="the conversation judged")
        # What TracejudgeJudgeStalled compares with the outcomes: one conversation sent to the judges, one back.
        assert scraped(url, "tracejudge_conversations_submitted_total") == 1.0
        wait_for(
            lambda: (scraped(url, "tracejudge_output_errors_total", output="otlp") or 0) >= 1,
            timeout=90,
            what="the failed OTLP export counted on /metrics",
        )
    heard = [r.getMessage() for r in caplog.records if r.name == "tracejudge.consumer.otlp"]
    assert heard and endpoint in heard[0] and "--otlp-endpoint" in heard[0], heard
    assert 'tracejudge_output_errors_total{output="otlp"}' in heard[0]
    print(f"\nOTLP at a closed port: {len(heard)} line(s) heard, e.g. {heard[0]!r}")
