"""Durable retries of judgements that failed for a reason that can pass: the decision and the retry record.

A judgement whose judge calls failed for a passing reason (a server error, a rate limit, a timeout, a connection
failure, a batch that expired twice) after the in-call retries is not failed: its job is written to the retry topic
with a not-before time and its outcome is `retrying`. The judge worker forwards the record to the judge queue when
its time comes (`streams/retry_scheduler.py`), so the only store is Kafka: a restart, a rebalance or a kill -9 finds
the waiting job where it was. A reason that cannot pass (auth, a bad request, an answer that failed validation)
fails at once, and so does a passing one past `--judge-retry-horizon`, with its last reason.

Backoff: the first wait is `--judge-retry-backoff`, doubled at each attempt up to `MAX_BACKOFF_S`; the last attempt is
made at the horizon itself. Each wait is a step of that ladder (`step_delays`), and each step has a retry topic of its
own (`<group>-judge-retry-<n>`), so the records of one topic come due in the order they were written and none waits
behind another's longer backoff (issue 43: with one topic, attempts promised for 20:20:10 and 20:20:15 ran at
20:20:29, behind a record due then). `place` says where a wait goes and when its topic lets it out; a wait that is not a
step's own (the last one, cut at the horizon) goes to the longest step under it and the rest is waited from there
(`on_ripe`). No jitter: a step topic keeps its order only if its records wait alike. What jitter spread, a burst of
failures retried together, the pool's --max-concurrency and --max-requests-per-minute pace, and each judge call's own
retries keep their jitter.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from tracejudge._shared.rate_limited_log import RateLimitedLog
from tracejudge.metrics import MetricResult

from .judgement import OUTCOME_FAILED, OUTCOME_RETRYING, Judgement, Retry

logger = logging.getLogger("tracejudge.consumer.judging.retries")

# The judges' reasons (tracejudge.metrics ERROR_*) that a later attempt can pass.
PASSING_REASONS = frozenset({"server_error", "rate_limited", "timeout", "connection", "batch_expired"})
MAX_BACKOFF_S = 600.0  # the longest wait between two attempts: the last step (kafka/topics.py counts the steps alike)
MAX_RETRY_STEPS = 11  # the step topics there are (kafka/topics.py's RETRY_STEPS): a 1 s backoff's 1 s .. 512 s, 600 s
DEFAULT_BACKOFF_S = 30.0  # --judge-retry-backoff's default: the ladder of a scheduler no settings were given to
STEP_SLACK_S = 1.0  # a backoff's wait is written a moment after it was decided: still its own step's

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


def step_delays(backoff_s: float) -> tuple[float, ...]:
    """The retry ladder: step n (1-based, topic `<group>-judge-retry-<n>`) waits the backoff doubled n-1 times, the
    last step MAX_BACKOFF_S (or the backoff itself, when longer); at most MAX_RETRY_STEPS steps."""
    longest = max(backoff_s, MAX_BACKOFF_S)
    delays: list[float] = []
    wait = max(0.1, backoff_s)
    while len(delays) < MAX_RETRY_STEPS:
        delays.append(min(wait, longest))
        if wait >= longest:
            break
        wait *= 2
    return tuple(delays)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a waiting judgement's record goes: `step` 0 is the short-wait topic (`<group>-judge-retry`, read at once
    and held until due), n the step topic `<group>-judge-retry-<n>`; `ripe_at` is when that topic lets it out (wall
    clock, seconds). Within a step topic `ripe_at` grows with the write order: it is the write time plus the step."""

    step: int
    ripe_at: float


def place(due: float, now: float, steps: Sequence[float], *, exact: bool) -> Placement:
    """The longest step not longer than the wait (`exact`: a wait the backoff chose, a step's own, decided a moment
    before `now`: STEP_SLACK_S keeps it in its step); ripe when that step has passed, never after `due`. A wait shorter
    than the first step goes to the short-wait topic, ripe at once."""
    wait = due - now
    slack = STEP_SLACK_S if exact else 0.0
    step = 0
    for index, delay in enumerate(steps, start=1):
        if delay <= wait + slack:
            step = index
    if step == 0:
        return Placement(0, now)
    return Placement(step, min(due, now + steps[step - 1]))


FORWARD, HOLD = "forward", "hold"


def on_ripe(due: float, now: float, steps: Sequence[float]) -> str | Placement:
    """What a record let out by its topic does: FORWARD to the judge queue when due; HOLD (in memory, its offset
    uncommitted) when due within the first step; else it moves on to the step topic for the rest of its wait (a
    Placement): a wait cut at the horizon, or one written under another ladder."""
    if due <= now:
        return FORWARD
    if not steps or due - now < steps[0]:
        return HOLD
    return place(due, now, steps, exact=False)


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
        """The backoff doubled at each attempt up to MAX_BACKOFF_S, exactly: a step of `step_delays`."""
        doubled = self.backoff_s * 2 ** min(30, max(0, attempt - 1))  # capped exponent: no overflow on long horizons
        return max(0.1, min(max(self.backoff_s, MAX_BACKOFF_S), doubled))

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
