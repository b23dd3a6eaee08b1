"""What judging a conversation came to: a value type (no runtime), read by the pool that makes it and every output.

Kept apart from the judge pool so the outputs (emit/*), the delivery and the results depend on the value, not on the
runner that produces it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..conversation.job import JudgeJob

if TYPE_CHECKING:
    from tracejudge.metrics import MetricResult

OUTCOME_JUDGED = "judged"
OUTCOME_FAILED = "failed"
OUTCOME_SAMPLED_OUT = "sampled_out"
OUTCOME_SKIPPED_BUDGET = "skipped_budget"
OUTCOMES = (OUTCOME_JUDGED, OUTCOME_SAMPLED_OUT, OUTCOME_FAILED, OUTCOME_SKIPPED_BUDGET)
# Not final: a judgement that failed for a reason that can pass, waiting in the retry topic for its next attempt.
# Written to the results topic (and acknowledged to the owner), never counted in tracejudge_sessions_total.
OUTCOME_RETRYING = "retrying"
# What a judge call was for (the `purpose` label of its cost): a production verdict, a shadow comparison, a canary run.
PURPOSE_LIVE, PURPOSE_CANARY, PURPOSE_SHADOW = "live", "canary", "shadow"


@dataclass(slots=True)
class Retry:
    """Where a conversation's retries stand: the attempt that just failed, its reason, when the next one is made and
    until when retries go on (wall-clock seconds). Carried in the retry-topic record, so it survives any restart."""

    attempt: int
    reason: str
    first_failed_at: float
    until: float
    next_at: float | None = None


@dataclass(slots=True)
class Judgement:
    job: JudgeJob
    outcome: str
    results: list[MetricResult] = field(default_factory=list)
    judged_at: float = field(default_factory=time.time)
    shadow_results: list[MetricResult] = field(default_factory=list)  # the shadow judge's, never production verdicts
    retry: Retry | None = None  # the job's retries so far (set on a retried job and on a retrying outcome)
    sample_rate: float | None = None  # sampled out: the agent's rate its sample point was not under
