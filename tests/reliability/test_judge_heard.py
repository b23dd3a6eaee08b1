"""Failures nobody hears about (issue 25): a transcript that cannot be prepared, judge errors, missing credentials,
a Retry-After that is not a number. Each ends counted with a reason AND in a rate-limited WARNING; the live consumer
keeps judging, and its stop summary says what /metrics says."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import threading
import time

import pytest

from tests.consumer.test_pipeline import Collect
from tests.support.judge_server import JudgeServer, Reply, conversation_text, verdict
from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app, wait_for
from tracejudge._shared.redact import redact_pii
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit.prometheus import family_total
from tracejudge.metrics import ConversationalEvalTestCase, EvalTestCase, FailureRateMetric, MetricResult
from tracejudge.metrics._judge import FAILURE_LOGS, PREPARATIONS
from tracejudge.metrics._litellm import _import_litellm
from tracejudge.metrics._provider_errors import classify_litellm_error


def _case(name: str, text: str = "Where is my order?") -> ConversationalEvalTestCase:
    return ConversationalEvalTestCase(name=name, turns=[EvalTestCase(input=text, actual_output="It shipped.")])


def _evaluate(metric: FailureRateMetric, case: ConversationalEvalTestCase) -> MetricResult:
    return asyncio.run(metric.evaluate(case))


def _error(status: int, message: str) -> Reply:
    """An error as OpenAI words it: the provider's message is what the log must carry."""
    return Reply(status=status, raw_body=json.dumps({"error": {"message": message, "type": "server_error"}}).encode())


def _warnings(caplog: pytest.LogCaptureFixture, reason: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "tracejudge.metrics" and r.levelno == logging.WARNING and f"({reason})" in r.getMessage()
    ]


@pytest.fixture(autouse=True)
def _fresh_failure_logs() -> None:
    FAILURE_LOGS._logs.clear()  # every test hears its first failure of each kind


def test_stuck_redactor_is_a_counted_failure_and_the_pool_keeps_judging(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, caplog: pytest.LogCaptureFixture
) -> None:
    """One judge slot, a redactor that never returns on one conversation, a judge that answers 500 on another: the
    stuck one fails `prepare_timeout` after its deadline, the 500 fails `server_error`, the last is judged; the
    slot and `tracejudge_judgements_in_flight` come back; each failure is one WARNING; the stop line adds up."""
    release = threading.Event()
    entered = threading.Event()

    def redactor(text: str) -> str:
        if "STUCK" in text:
            entered.set()
            release.wait()  # never returns while the test runs: no deadline inside the redactor
        return redact_pii(text)

    def respond(request: dict) -> Reply:
        if "BROKEN" in conversation_text(request):
            return _error(500, "upstream exploded: model shard 3 is down")
        return verdict("honest_fallback")

    judge_server.responder = respond
    caplog.set_level(logging.INFO)
    settings = consumer_settings(
        broker.bootstrap_servers, topic, metrics="failure_rate", max_concurrency=1, judge_retries=0
    )
    provider = traced_app(broker.bootstrap_servers, topic)
    stuck_before = PREPARATIONS.stuck
    collect = Collect()
    try:
        with RunningConsumer(settings, redactor=redactor, extra_sinks=[collect]) as consumer:
            (judge,) = consumer.app.service.pool.judges
            judge.prepare_timeout = 1.0
            play(provider, {"c-stuck": [("STUCK question", "an answer")]})
            assert entered.wait(30), "the stuck conversation never reached the redactor"
            play(provider, {"c-broken": [("BROKEN question", "an answer")], "c-fine": [("fine question", "yes")]})
            wait_for(lambda: consumer.sessions() == 3, timeout=60, what="all three conversations accounted")
            assert consumer.sessions("judged") == 1
            assert consumer.sessions("failed") == 2
            errors = {
                reason: family_total(consumer.app.registry, "tracejudge_judge_errors", reason=reason)
                for reason in ("prepare_timeout", "server_error")
            }
            kinds = {j.job.conversation_id: [r.error_kind for r in j.results] for j in collect.judgements}
            assert errors == {"prepare_timeout": 1, "server_error": 1}, kinds
            assert kinds == {"c-stuck": ["prepare_timeout"], "c-broken": ["server_error"], "c-fine": [None]}
            wait_for(lambda: consumer.value("tracejudge_judgements_in_flight") == 0, timeout=5, what="in flight 0")
            assert PREPARATIONS.stuck == stuck_before + 1  # the thread is left behind, and counted
    finally:
        release.set()
        provider.shutdown()
    wait_for(lambda: PREPARATIONS.stuck == stuck_before, timeout=10, what="the released thread to be uncounted")
    (stuck_line,) = _warnings(caplog, "prepare_timeout")
    assert "c-stuck" in stuck_line and "within 1s" in stuck_line and "redact" in stuck_line
    (broken_line,) = _warnings(caplog, "server_error")
    assert "c-broken" in broken_line and "upstream exploded: model shard 3 is down" in broken_line
    assert "STUCK question" not in stuck_line + broken_line  # the log names the conversation, never its text
    stopped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stopped: ")]
    assert stopped == ["stopped: 1 conversation judged, 2 failed, 0 sampled out, 0 skipped for budget in this run"], (
        stopped
    )


# timing-sensitive: asserts how long it took, so it runs alone (tests/run_suite.py's serial phase)
@pytest.mark.serial
def test_redactor_deadline_without_a_consumer() -> None:
    """The metric alone: a redactor stuck past `prepare_timeout` is a failure with the reason, in about the deadline;
    the event loop meanwhile runs other work (here a ticker) at its normal pace."""
    release = threading.Event()
    metric = FailureRateMetric(
        "gpt-4o-mini", redactor=lambda text: (release.wait(), text)[1], prepare_timeout=0.5, max_retries=0
    )
    ticks: list[float] = []

    async def run() -> MetricResult:
        async def ticker() -> None:
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.02)

        task = asyncio.create_task(ticker())
        try:
            return await metric.evaluate(_case("c-alone"))
        finally:
            task.cancel()

    started = time.monotonic()
    try:
        result = asyncio.run(run())
    finally:
        release.set()
    assert time.monotonic() - started < 5
    assert result.error_kind == "prepare_timeout" and result.score is None and result.verdict is None
    assert result.attempts == 0  # the judge was never called
    assert len(ticks) >= 10 and max(b - a for a, b in itertools.pairwise(ticks)) < 0.3


def test_judge_errors_are_heard_once_per_metric_model_and_reason(
    judge_server: JudgeServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A judge answering 500 three times: three failures counted by the caller, one WARNING with the provider's
    message and what to do; another reason is a line of its own."""
    caplog.set_level(logging.WARNING)
    judge_server.default = _error(500, "the provider's own words")
    metric = FailureRateMetric("gpt-4o-mini", max_retries=0)
    results = [_evaluate(metric, _case(f"c{i}")) for i in range(3)]
    assert [r.error_kind for r in results] == ["server_error"] * 3
    (line,) = _warnings(caplog, "server_error")
    assert line.startswith("failure_rate judge gpt-4o-mini failed (server_error) on conversation c0: ")
    assert "the provider's own words" in line and "check the provider's status" in line
    judge_server.default = _error(404, "The model `gpt-4o-mini` does not exist")
    assert _evaluate(metric, _case("c3")).error_kind == "bad_request"
    (line,) = _warnings(caplog, "bad_request")
    assert "does not exist" in line


def test_missing_credentials_are_auth_and_not_retried(
    judge_server: JudgeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OPENAI_BASE_URL set, no OPENAI_API_KEY: real LiteLLM refuses locally ("Missing credentials", as a 500). It is
    `auth`, one attempt, no backoff, and nothing reaches the server."""
    monkeypatch.delenv("OPENAI_API_KEY")
    metric = FailureRateMetric("gpt-4o-mini", max_retries=3)
    started = time.monotonic()
    result = _evaluate(metric, _case("c-nokey"))
    assert result.error_kind == "auth", result.error
    assert "Missing credentials" in (result.error or "")
    assert result.attempts == 1
    assert time.monotonic() - started < 5  # three retries with backoff took 25 s
    assert judge_server.requests == []


def test_retry_after_that_is_not_a_number_retries_with_the_default_backoff(judge_server: JudgeServer) -> None:
    """`429 Retry-After: soon` is rate limited and retried (default backoff), not an `internal` failure."""
    judge_server.enqueue(Reply(status=429, headers={"retry-after": "soon"}, content="slow down"))
    judge_server.default = verdict("stall")
    metric = FailureRateMetric("gpt-4o-mini", max_retries=2)
    metric.retry_policy.base_delay_s = 0.01
    result = _evaluate(metric, _case("c-soon"))
    assert result.error is None and result.verdict == "stall"
    assert result.attempts == 2 and len(judge_server.requests) == 2


@pytest.mark.parametrize(
    ("value", "expected"),
    [("soon", None), ("", None), ("nan", None), ("inf", None), ("-3", 0.0), ("1.5", 1.5), ("Mon, 99 Foo 2026", None)],
)
def test_retry_after_values(value: str, expected: float | None) -> None:
    litellm = _import_litellm()
    exc = litellm.RateLimitError("slow down", llm_provider="openai", model="gpt-4o-mini")
    exc.litellm_response_headers = {"retry-after": value}
    error = classify_litellm_error(exc)
    assert error.kind == "rate_limited" and error.retryable
    assert error.retry_after == expected


def test_http_date_retry_after() -> None:
    from email.utils import formatdate

    litellm = _import_litellm()
    exc = litellm.RateLimitError("slow down", llm_provider="openai", model="gpt-4o-mini")
    exc.litellm_response_headers = {"retry-after": formatdate(time.time() + 30, usegmt=True)}
    retry_after = classify_litellm_error(exc).retry_after
    assert retry_after is not None and 25 < retry_after <= 30


def test_the_library_leaves_the_users_environment_alone(
    judge_server: JudgeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Judging through LiteLLM writes no environment variable of the user's process."""
    monkeypatch.delenv("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", raising=False)
    before = dict(os.environ)
    result = _evaluate(FailureRateMetric("gpt-4o-mini", max_retries=0), _case("c-env"))
    assert result.error is None
    assert dict(os.environ) == before
