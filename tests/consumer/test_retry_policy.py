"""The retry decision (consumer/judging/retries.py) for each reason and each point of the horizon, and the records it
makes: a judgement that fails for a reason that can pass waits; one that cannot, or past the horizon, fails with its
last reason; a retried job's final outcome counts the attempt."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry

from tests.consumer.test_outputs import job
from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.emit.results_topic import ResultsTopic
from tracejudge.consumer.judging.judgement import Judgement, Retry
from tracejudge.consumer.judging.results import result_record
from tracejudge.consumer.judging.retries import RetryPolicy, retry_from_json, retry_to_json
from tracejudge.metrics import MetricResult

NOW = 1_800_000_000.0


def failed(*reasons: str) -> Judgement:
    results = []
    for i, reason in enumerate(reasons):
        result = MetricResult(name=f"m{i}", threshold=0.7, model="m")
        result.error, result.error_kind = f"{reason} happened", reason
        results.append(result)
    return Judgement(job("c"), "failed", results)


def test_a_passing_reason_waits_with_backoff_until_the_horizon() -> None:
    policy = RetryPolicy(horizon_s=3600, backoff_s=30)
    for reason in ("server_error", "rate_limited", "timeout", "connection", "batch_expired"):
        judgement = policy.review(failed(reason), now=NOW)
        assert judgement.outcome == "retrying" and judgement.retry is not None
        assert judgement.retry.attempt == 1 and judgement.retry.reason == reason
        assert judgement.retry.until == NOW + 3600
        assert judgement.retry.next_at == NOW + 30  # the first step, exactly (no jitter: its topic keeps order)


def test_a_reason_that_cannot_pass_fails_at_once_even_beside_a_passing_one() -> None:
    policy = RetryPolicy(horizon_s=3600, backoff_s=30)
    for reasons in (("auth",), ("bad_request",), ("invalid_output",), ("server_error", "auth")):
        judgement = policy.review(failed(*reasons), now=NOW)
        assert judgement.outcome == "failed" and judgement.retry is None


def test_the_backoff_doubles_and_the_last_attempt_is_at_the_horizon() -> None:
    policy = RetryPolicy(horizon_s=100, backoff_s=30)
    judgement = failed("server_error")
    judgement.retry = Retry(attempt=1, reason="server_error", first_failed_at=NOW, until=NOW + 100)
    again = policy.review(judgement, now=NOW + 30)
    assert again.outcome == "retrying" and again.retry is not None and again.retry.attempt == 2
    assert again.retry.next_at == NOW + 90  # 30 s doubled, 60 s after this attempt: the second step
    later = failed("server_error")
    later.retry = Retry(attempt=2, reason="server_error", first_failed_at=NOW, until=NOW + 100)
    capped = policy.review(later, now=NOW + 90)
    assert capped.retry is not None and capped.retry.next_at == NOW + 100


def test_past_the_horizon_it_fails_with_its_last_reason() -> None:
    policy = RetryPolicy(horizon_s=100, backoff_s=30)
    judgement = failed("timeout")
    judgement.retry = Retry(attempt=3, reason="server_error", first_failed_at=NOW, until=NOW + 100)
    final = policy.review(judgement, now=NOW + 100)
    assert final.outcome == "failed" and final.retry is not None
    assert final.retry.attempt == 4 and final.retry.reason == "timeout" and final.retry.next_at is None
    assert final.results[0].error_kind == "timeout"


def test_a_retried_jobs_final_outcome_counts_its_attempt_and_a_zero_horizon_never_retries() -> None:
    policy = RetryPolicy(horizon_s=100, backoff_s=30)
    judged = Judgement(job("c"), "judged", [MetricResult(name="m0", threshold=0.7, model="m", verdict="stall")])
    judged.retry = Retry(attempt=2, reason="server_error", first_failed_at=NOW, until=NOW + 100, next_at=NOW + 50)
    assert policy.review(judged, now=NOW + 60).retry == Retry(2 + 1, "server_error", NOW, NOW + 100, None)
    assert RetryPolicy(horizon_s=0, backoff_s=30).review(failed("server_error"), now=NOW).outcome == "failed"


def test_the_retry_survives_its_record_and_the_results_record_says_when() -> None:
    retry = Retry(attempt=2, reason="rate_limited", first_failed_at=NOW, until=NOW + 3600, next_at=NOW + 60)
    assert retry_from_json(json.loads(json.dumps(retry_to_json(retry)))) == retry
    judgement = failed("rate_limited")
    judgement.outcome, judgement.retry = "retrying", retry
    record = result_record(judgement, judgement.results[0])
    assert record["outcome"] == "retrying" and record["attempt"] == 2 and record["retry_reason"] == "rate_limited"
    assert record["next_attempt_at"].startswith("2027-01-15T08:01") and record["retry_until"] < "2027-01-15T09:01"


def test_a_retrying_conversation_is_not_a_session_outcome_but_its_attempt_is_counted() -> None:
    registry = CollectorRegistry()
    instruments = ConsumerInstruments(registry)
    judgement = failed("server_error")
    judgement.outcome = "retrying"
    instruments.record_judgement(judgement)
    get = registry.get_sample_value
    assert get("tracejudge_sessions_total", {"agent": "a", "outcome": "retrying"}) is None
    assert get("tracejudge_judge_errors_total", {"metric": "m0", "reason": "server_error"}) == 1


class Writer:
    def __init__(self) -> None:
        self.values: list[dict] = []

    def write(self, key: bytes, value: bytes) -> object:
        self.values.append(json.loads(value))
        return object()


def test_every_metric_gets_an_outcome_record_unless_unjudged_outcomes_are_off() -> None:
    writer = Writer()
    sink = ResultsTopic(writer, ["failure_rate", "conversational_flow"])  # type: ignore[arg-type]
    sink.emit(Judgement(job("s"), "sampled_out", sample_rate=0.25))
    assert [(r["metric"], r["outcome"], r["sample_rate"]) for r in writer.values] == [
        ("failure_rate", "sampled_out", 0.25),
        ("conversational_flow", "sampled_out", 0.25),
    ]
    assert all(0 <= r["sample_point"] < 1 and r["trace_ids"] == ["0" * 31 + "1"] for r in writer.values)
    quiet = Writer()
    ResultsTopic(quiet, ["failure_rate"], unjudged=False).emit(Judgement(job("s"), "sampled_out"))  # type: ignore[arg-type]
    ResultsTopic(quiet, ["failure_rate"], unjudged=False).emit(Judgement(job("b"), "skipped_budget"))  # type: ignore[arg-type]
    assert quiet.values == []
    empty = failed("empty_conversation")
    ResultsTopic(quiet, ["m0"], unjudged=False).emit(empty)  # type: ignore[arg-type]
    assert [r["outcome"] for r in quiet.values] == ["empty"]


def test_a_horizon_must_be_finite_and_the_backoff_a_second_at_least() -> None:
    """`--judge-retry-horizon inf` would raise when the retry record is written and hold the partition's commits;
    a backoff below a second retries a failing provider in a loop (review of issue 33)."""
    import pytest
    from pydantic import ValidationError

    from tracejudge.consumer.settings import Settings

    for bad in ({"judge_retry_horizon": "inf"}, {"judge_retry_horizon": "30d"}, {"judge_retry_backoff": "0"}):
        with pytest.raises(ValidationError):
            Settings(**bad)
    assert Settings(judge_retry_horizon="7d", judge_retry_backoff="1s").judge_retry_horizon == 7 * 86_400
    policy = RetryPolicy(horizon_s=7 * 86_400, backoff_s=1.0)
    assert 0 < policy.wait(5_000) <= 600  # a long horizon's attempt count never overflows the backoff


def test_the_metric_that_answered_in_a_retrying_judgement_is_counted_once_at_its_final_outcome() -> None:
    """One judge answered, the other got a 503: the conversation waits for a retry that judges both again, so the
    answer is not a verdict yet (no verdict, score or rate window twice); its spend and the error are counted now."""
    registry = CollectorRegistry()
    instruments = ConsumerInstruments(registry)
    judgement = failed("server_error")
    answered = MetricResult(name="m1", threshold=0.5, model="m", score=1.0, verdict="fully", cost_usd=0.01)
    judgement.results.append(answered)
    judgement.outcome = "retrying"
    instruments.record_judgement(judgement)
    get = registry.get_sample_value
    assert get("tracejudge_verdicts_total", {"agent": "a", "metric": "m1", "verdict": "fully"}) in (None, 0.0)
    assert get("tracejudge_judge_errors_total", {"metric": "m0", "reason": "server_error"}) == 1
    judgement.outcome = "judged"
    instruments.record_judgement(judgement)
    assert get("tracejudge_verdicts_total", {"agent": "a", "metric": "m1", "verdict": "fully"}) == 1
