"""A judgement as a record: the deterministic result id and the fields every output shares."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from tracejudge.metrics import MetricResult

from .pool import Judgement


def result_id(conversation_id: str, metric: str, version: int) -> str:
    """Same conversation, metric and version → same id, on every replica and every replay (for de-duplication)."""
    material = f"{conversation_id}\x1f{metric}\x1f{version}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(material).hexdigest()[:32]


def _iso(ns: int) -> str | None:
    if ns <= 0:
        return None
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat()


def result_record(judgement: Judgement, result: MetricResult) -> dict[str, Any]:
    job = judgement.job
    turns = job.turns
    return {
        "result_id": result_id(job.conversation_id, result.name, job.version),
        "conversation_id": job.conversation_id,
        "agent": job.agent,
        "metric": result.name,
        "version": job.version,
        "turn_count": job.turn_count,
        "outcome": judgement.outcome,
        "verdict": result.verdict,
        "score": result.score,
        "passed": result.success,
        "threshold": result.threshold,
        "reason": result.reason,
        "evidence": result.evidence,
        "model": result.model,
        "cost_usd": result.cost_usd,
        "input_tokens": result.input_tokens,
        "output_tokens": result.output_tokens,
        "cached_input_tokens": result.cached_input_tokens,
        "latency_s": round(result.latency_s, 4),
        "attempts": result.attempts,
        "error": result.error,
        "error_kind": result.error_kind,
        "completed_by": job.completed_by,
        "truncated": job.truncated,
        "trace_id": job.last_turn.trace_id,
        "span_id": job.last_turn.span_id,
        "conversation_started_at": _iso(turns[0].start_ns),
        "conversation_last_turn_at": _iso(turns[-1].end_ns),
        "judged_at": datetime.fromtimestamp(judgement.judged_at, tz=UTC).isoformat(),
    }
