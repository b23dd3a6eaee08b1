"""Budget: past --max-cost-per-hour no judge call is made and conversations count as skipped_budget; it refills."""

from __future__ import annotations

import time

from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer
from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.pool import SpendWindow


def test_budget_stops_calls_and_counts_skips(broker: EmbeddedBroker, topic: str, judge_server: JudgeServer) -> None:
    judge_server.responder = scripted_judge
    provider = traced_app(broker.bootstrap_servers, topic)
    settings = consumer_settings(
        broker.bootstrap_servers, topic, metrics="failure_rate", max_cost_per_hour=0.000001, max_concurrency=1
    )
    with RunningConsumer(settings) as consumer:
        play(provider, {"budget-first": [("q", "a")]})
        wait_for(lambda: consumer.sessions("judged") == 1, what="the first conversation judged")
        assert consumer.app.service.pool.budget.spent() > 0.000001  # gpt-4o-mini priced by LiteLLM's table
        play(provider, {f"budget-{i}": [("q", "a")] for i in range(5)})
        wait_for(lambda: consumer.sessions("skipped_budget") == 5, what="five skipped for budget")
        assert len(judge_server.requests) == 1
    provider.shutdown()


def test_budget_refills_as_spend_ages_out() -> None:
    window = SpendWindow(max_per_hour=1.0, window_s=0.3)
    assert not window.exhausted
    window.record(0.6)
    window.record(0.6)
    assert window.exhausted
    time.sleep(0.4)
    assert not window.exhausted and window.spent() == 0.0
