"""Budget: past --max-cost-per-hour no judge call is made and conversations count as skipped_budget; it refills.

Windows in which a judge call can be asked for, relative to the budget: before any call settled (estimate unknown:
admitted, so the overshoot is at most the calls in flight), while other calls are in flight (each counts at the
current estimate), after spend exhausted it (refused: skipped_budget), after old spend aged out (admitted again).
"""

from __future__ import annotations

import json
import time

from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer, Reply
from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.metrics.runner import SpendWindow


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


def test_budget_holds_under_a_burst(broker: EmbeddedBroker, topic: str, judge_server: JudgeServer) -> None:
    """N conversations wait in Kafka before the consumer starts; the budget is worth K calls. The budget is decided
    when each call is made, counting calls in flight: at most K + max-concurrency calls reach the judge server, and
    every other conversation is `skipped_budget`."""
    conversations, concurrency, budget = 30, 4, 0.002
    # Every call costs the same (fixed usage), so K is exact: LiteLLM prices 2,000 prompt tokens of gpt-4o-mini.
    judge_server.responder = lambda request: Reply(
        content=json.dumps({"verdict": "honest_fallback", "evidence": [], "reason": "fixed"}),
        prompt_tokens=2000,
        delay_s=0.2,
    )
    provider = traced_app(broker.bootstrap_servers, topic)
    play(provider, {f"burst-{i}": [(f"burst q{i}", "a")] for i in range(conversations)})
    provider.shutdown()
    settings = consumer_settings(
        broker.bootstrap_servers, topic, metrics="failure_rate", max_cost_per_hour=budget, max_concurrency=concurrency
    )
    with RunningConsumer(settings) as consumer:
        wait_for(lambda: consumer.sessions() == conversations, what="every conversation judged or skipped")
        judged, skipped = consumer.sessions("judged"), consumer.sessions("skipped_budget")
        spent = consumer.app.service.pool.budget.spent()
    calls = len(judge_server.requests)
    per_call = spent / calls
    affordable = int(budget / per_call + 1e-9)
    print(f"\nburst: {conversations} conversations, budget {affordable} calls, {calls} calls reached the judge server")
    assert 1 <= affordable < conversations
    assert affordable <= calls <= affordable + concurrency
    assert judged == calls and skipped == conversations - calls
    assert spent <= budget + concurrency * per_call
