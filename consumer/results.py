"""A judgement as a record: the deterministic result id and the fields every output shares."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from tracejudge.metrics import MetricResult

from .judgement import Judgement


def result_id(conversation_id: str, metric: str, content: str) -> str:
    """Same transcript (its content id) and metric → same id, on every replica, replay and backfill; a different
    transcript of the same conversation (a continuation, a tail) → a different id."""
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


def result_record(
    judgement: Judgement, result: MetricResult, *, shadow: bool = False, transcript: bool = False
) -> dict[str, Any]:
    """`shadow`: a shadow judge's result (its own id, `shadow: true`); readers of production verdicts skip it.
    `transcript` (--results-transcript): the turns as judged go with it, under `transcript`."""
    job = judgement.job
    exchanges = job.exchanges
    content = f"{job.content_id}\x1fshadow\x1f{result.model}" if shadow else job.content_id
    record = {
        "result_id": result_id(job.conversation_id, result.name, content),
        "shadow": shadow,
        "content_id": job.content_id,
        "conversation_id": job.conversation_id,
        "agent": job.agent,
        "metric": result.name,
        "version": job.version,
        "turn_count": job.version,  # a version is its turn count (JudgeJob.version): the pinned key says so
        "outcome": judgement.outcome,
        "verdict": result.verdict,
        "score": result.score,
        "passed": result.success,
        "threshold": result.threshold,
        "reason": result.reason,
        "evidence": result.evidence,
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
        "span_id": job.last_exchange.span_id,
        "conversation_started_at": _iso(exchanges[0].start_ns),
        "conversation_last_turn_at": _iso(exchanges[-1].end_ns),
        "judged_at": datetime.fromtimestamp(judgement.judged_at, tz=UTC).isoformat(),
    }
    if transcript:
        record["transcript"] = judged_turns(result)
    return record
