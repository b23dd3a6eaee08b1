"""A judgement as a record: the deterministic result id and the fields every output shares.

Every completed conversation gets one record per metric and final outcome: judged, failed (its reason), empty (no
text to judge), sampled out (the rate and the conversation's sample point), skipped for budget; and while it waits
for another attempt, `retrying` (until when, and when next). `tracejudge explain` reads them back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from tracejudge.metrics import MetricResult

from .judgement import OUTCOME_FAILED, OUTCOME_RETRYING, OUTCOME_SAMPLED_OUT, Judgement
from .sampling import sample_point

OUTCOME_EMPTY = "empty"  # the results topic's name for a failure without text to judge (empty_conversation)


def result_id(conversation_id: str, metric: str, content: str) -> str:
    """Same transcript (its content id) and metric → same id, on every replica, replay and backfill; a different
    transcript of the same conversation (a continuation, a tail) → a different id. `metric` is the judge's result key:
    a built-in's name, a rubric file's version (an edited rubric judges again under a new id)."""
    material = f"{conversation_id}\x1f{metric}\x1f{content}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(material).hexdigest()[:32]


_MAX_NS = int(datetime(9999, 12, 31, tzinfo=UTC).timestamp()) * 10**9


def _iso(ns: int) -> str | None:
    """A span's own timestamp, clamped: a record may claim any number (a huge one must not raise)."""
    if not isinstance(ns, int) or ns <= 0:
        return None
    return datetime.fromtimestamp(min(ns, _MAX_NS) / 1e9, tz=UTC).isoformat()


def judged_turns(result: MetricResult) -> list[dict[str, Any]] | None:
    """The turns exactly as the judge was sent them (redacted, clipped, windowed: `{"turn", "user", "assistant"}`
    items and at most one `{"omitted": ...}` marker); None when the result has none (no judge call was made)."""
    if result.transcript is None:
        return None
    try:
        turns = json.loads(result.transcript)
    except ValueError:
        return None
    return turns if isinstance(turns, list) else None


def _seconds_iso(seconds: float | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=UTC).isoformat()


def record_outcome(judgement: Judgement, result: MetricResult | None) -> str:
    if judgement.outcome == OUTCOME_FAILED and result is not None and result.error_kind == "empty_conversation":
        return OUTCOME_EMPTY
    return judgement.outcome


def key_of(result: MetricResult) -> str:
    """The judge's name in its result ids (`result_id`)."""
    return result.result_key or result.name


def outcome_record(judgement: Judgement, metric: str, key: str | None = None) -> dict[str, Any]:
    """A metric's record for a conversation without its result: sampled out, skipped for budget before this
    metric's call, or failed before any call. `key`: the judge's result key (default its name)."""
    result = MetricResult(name=metric, threshold=0.0, model="", result_key=key)
    if judgement.outcome == OUTCOME_FAILED:
        result.error, result.error_kind = "failed before the judge call", "internal"
    record = result_record(judgement, result)
    record["threshold"] = None
    return record


def outcome_records(
    judgement: Judgement, metrics: Sequence[str], keys: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """`outcome_record` of each metric: built once, the others differ only in their metric and result id (a sampled
    out conversation's records are its whole cost in the results topic). `keys`: result keys by metric name."""
    if not metrics:
        return []
    keys = keys or {}
    first = outcome_record(judgement, metrics[0], keys.get(metrics[0]))
    job = judgement.job
    return [first] + [
        {
            **first,
            "result_id": result_id(job.conversation_id, keys.get(metric, metric), job.content_id),
            "metric": metric,
        }
        for metric in metrics[1:]
    ]


def result_record(
    judgement: Judgement, result: MetricResult, *, shadow: bool = False, transcript: bool = False
) -> dict[str, Any]:
    """`shadow`: a shadow judge's result (its own id, `shadow: true`); readers of production verdicts skip it.
    `transcript` (--results-transcript): the turns as judged go with it, under `transcript`."""
    job = judgement.job
    exchanges = job.exchanges
    content = f"{job.content_id}\x1fshadow\x1f{result.model}" if shadow else job.content_id
    retry = judgement.retry
    sampled_out = judgement.outcome == OUTCOME_SAMPLED_OUT
    completed = None if job.completed_ms is None else job.completed_ms / 1000.0
    record = {
        "result_id": result_id(job.conversation_id, key_of(result), content),
        "shadow": shadow,
        "content_id": job.content_id,
        "conversation_id": job.conversation_id,
        "agent": job.agent,
        "metric": result.name,
        "version": job.version,
        "turn_count": job.version,  # a version is its turn count (JudgeJob.version): the pinned key says so
        "outcome": record_outcome(judgement, result),
        "verdict": result.verdict,
        "score": result.score,
        "passed": result.success,
        "threshold": result.threshold,
        "reason": result.reason,
        "evidence": result.evidence,
        "failure_mode": result.failure_mode,
        "model": result.model,
        "rubric_version": result.rubric_version,
        "cost_usd": result.cost_usd,
        "input_tokens": result.input_tokens,
        "output_tokens": result.output_tokens,
        "cached_input_tokens": result.cached_input_tokens,
        "cache_write_input_tokens": result.cache_write_input_tokens,
        "latency_s": round(result.latency_s, 4),
        "attempts": result.attempts,
        "error": result.error,
        "error_kind": result.error_kind,
        "completed_by": job.completed_by,
        "truncated": job.truncated,
        "trace_id": job.last_exchange.trace_id,
        "trace_ids": sorted({e.trace_id for e in exchanges if e.trace_id}),
        "span_id": job.last_exchange.span_id,
        "conversation_started_at": _iso(exchanges[0].start_ns),
        "conversation_last_turn_at": _iso(exchanges[-1].end_ns),
        "completed_at": _seconds_iso(completed),
        "judged_at": datetime.fromtimestamp(judgement.judged_at, tz=UTC).isoformat(),
        "delay_s": None if completed is None else round(max(0.0, judgement.judged_at - completed), 3),
        "sample_rate": judgement.sample_rate if sampled_out else None,
        "sample_point": round(sample_point(job.conversation_id), 6) if sampled_out else None,
        "attempt": None if retry is None else retry.attempt,
        "retry_reason": None if retry is None else retry.reason,
        "retry_until": None if retry is None else _seconds_iso(retry.until),
        "next_attempt_at": _seconds_iso(retry.next_at if judgement.outcome == OUTCOME_RETRYING else None)
        if retry is not None
        else None,
    }
    if transcript:
        record["transcript"] = judged_turns(result)
    return record
