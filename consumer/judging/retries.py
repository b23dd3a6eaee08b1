"""Durable retries of judgements that failed for a reason that can pass: the decision and the retry record.

A judgement whose judge calls failed for a passing reason (a server error, a rate limit, a timeout, a connection
failure, a batch that expired twice) after the in-call retries is not failed: its job is written to the retry topic
with a not-before time and its outcome is `retrying`. The judge worker forwards the record to the judge queue when
its time comes (`streams/retry_scheduler.py`), so the only store is Kafka: a restart, a rebalance or a kill -9 finds
the waiting job where it was. A reason that cannot pass (auth, a bad request, an answer that failed validation)
fails at once, and so does a passing one past `--judge-retry-horizon`, with its last reason.

Backoff: the first wait is `--judge-retry-backoff`, doubled at each attempt up to `MAX_BACKOFF_S`, with equal jitter
(never sooner than half of it); the last attempt is made at the horizon itself.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from tracejudge._shared.rate_limited_log import RateLimitedLog
from tracejudge.metrics import MetricResult

from .judgement import OUTCOME_FAILED, OUTCOME_RETRYING, Judgement, Retry

logger = logging.getLogger("tracejudge.consumer.judging.retries")

# The judges' reasons (tracejudge.metrics ERROR_*) that a later attempt can pass.
PASSING_REASONS = frozenset({"server_error", "rate_limited", "timeout", "connection", "batch_expired"})
MAX_BACKOFF_S = 600.0  # a waiting record holds back the records behind it in its partition at most this long

_CHECK = {
    "server_error": "the judge's server answers 5xx: check the provider's status page",
    "rate_limited": "the provider is rate-limiting: check its quota, or lower --max-concurrency or "
    "--max-requests-per-minute",
    "timeout": "the judge does not answer in time: check the endpoint, or raise --judge-timeout",
    "connection": "the judge endpoint cannot be reached: check OPENAI_BASE_URL (or the provider's) and the network",
    "batch_expired": "the provider's batches expire unanswered: check its batch queue, or use --judge-tier standard",
}


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat(timespec="seconds")


def failing_reason(results: list[MetricResult]) -> tuple[str | None, bool]:
    """The reason the judgement failed (the first failed call's) and whether every failed call's reason can pass."""
    reasons = [r.error_kind or "unknown" for r in results if r.error is not None]
    if not reasons:
        return None, False
    return reasons[0], all(reason in PASSING_REASONS for reason in reasons)


class RetryPolicy:
    def __init__(self, horizon_s: float, backoff_s: float) -> None:
        self.horizon_s = horizon_s
        self.backoff_s = backoff_s
        self._log = RateLimitedLog(logger, interval_s=10.0)  # an attempt failed, the next one is scheduled
        self._final_log = RateLimitedLog(logger, interval_s=10.0)  # past the horizon: failed

    def wait(self, attempt: int) -> float:
        doubled = self.backoff_s * 2 ** min(30, max(0, attempt - 1))  # capped exponent: no overflow on long horizons
        ceiling = max(0.1, min(max(self.backoff_s, MAX_BACKOFF_S), doubled))
        return random.uniform(ceiling / 2, ceiling)

    def review(self, judgement: Judgement, now: float | None = None) -> Judgement:
        """A failed judgement whose reasons can pass becomes `retrying` (with its next attempt's time) while within
        the horizon; past it, or for a reason that cannot pass, it stays failed. Anything else is returned as is."""
        before = judgement.retry
        reason, passing = failing_reason(judgement.results)
        if judgement.outcome != OUTCOME_FAILED or self.horizon_s <= 0 or reason is None or not passing:
            if before is not None:  # a retried job's final outcome: this was one attempt more
                judgement.retry = replace(before, attempt=before.attempt + 1, next_at=None)
            return judgement
        now = time.time() if now is None else now
        attempt = 1 if before is None else before.attempt + 1
        first = now if before is None else before.first_failed_at
        until = first + self.horizon_s if before is None else before.until
        retry = Retry(attempt=attempt, reason=reason, first_failed_at=first, until=until)
        judgement.retry = retry
        conversation = judgement.job.conversation_id
        if now >= until:
            self._final_log.warning(
                "conversation %s failed (%s) after %d attempts: past the retry horizon (%s, --judge-retry-horizon); "
                "%s, then judge it again with `tracejudge rejudge --group-id GROUP`",
                conversation,
                reason,
                attempt,
                iso(until),
                _CHECK.get(reason, "check the judge"),
            )
            return judgement
        retry.next_at = min(until, now + self.wait(attempt))
        judgement.outcome = OUTCOME_RETRYING
        self._log.warning(
            "conversation %s: judge attempt %d failed (%s), next attempt at %s, retried until %s; %s",
            conversation,
            attempt,
            reason,
            iso(retry.next_at),
            iso(until),
            _CHECK.get(reason, "check the judge"),
        )
        return judgement


def retry_to_json(retry: Retry) -> dict[str, Any]:
    return {
        "attempt": retry.attempt,
        "reason": retry.reason,
        "first_failed_ms": int(retry.first_failed_at * 1000),
        "until_ms": int(retry.until * 1000),
        "next_ms": None if retry.next_at is None else int(retry.next_at * 1000),
    }


def retry_from_json(data: Any) -> Retry | None:
    if not isinstance(data, dict):
        return None
    next_ms = data.get("next_ms")
    return Retry(
        attempt=int(data["attempt"]),
        reason=str(data["reason"]),
        first_failed_at=int(data["first_failed_ms"]) / 1000.0,
        until=int(data["until_ms"]) / 1000.0,
        next_at=None if next_ms is None else int(next_ms) / 1000.0,
    )
