"""record_feedback: what a real user thought of a conversation, joined by the consumer to the judge's verdict."""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import TracerProvider

from ._conversation import emit_marker
from .semconv import FEEDBACK_COMMENT, FEEDBACK_LABEL, FEEDBACK_SCORE, FEEDBACK_SPAN


def record_feedback(
    session_id: str,
    *,
    score: float | None = None,
    label: str | None = None,
    comment: str | None = None,
    agent: str | None = None,
    tracer_provider: TracerProvider | None = None,
) -> None:
    """Emit a zero-length feedback span. `score` is in -1..1: below 0 is negative, 0 and above positive.

    Without a score, the label decides: `thumbs_down` (also `negative`, `bad`) is negative, anything else positive.
    """
    attributes: dict[str, Any] = {}
    if score is not None:
        attributes[FEEDBACK_SCORE] = max(-1.0, min(1.0, float(score)))
    if label is not None:
        attributes[FEEDBACK_LABEL] = str(label)
    if comment is not None:
        attributes[FEEDBACK_COMMENT] = str(comment)[:4_000]
    if not attributes:
        return
    emit_marker(FEEDBACK_SPAN, session_id, agent, attributes, tracer_provider)
