"""What judging a conversation came to: a value type (no runtime), read by the pool that makes it and every output.

Kept apart from the judge pool so the outputs (emit/*), the delivery and the results depend on the value, not on the
runner that produces it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .conversation.job import JudgeJob

if TYPE_CHECKING:
    from tracejudge.metrics import MetricResult

OUTCOME_JUDGED = "judged"
OUTCOME_FAILED = "failed"
OUTCOME_SAMPLED_OUT = "sampled_out"
OUTCOME_SKIPPED_BUDGET = "skipped_budget"
OUTCOMES = (OUTCOME_JUDGED, OUTCOME_SAMPLED_OUT, OUTCOME_FAILED, OUTCOME_SKIPPED_BUDGET)


@dataclass(slots=True)
class Judgement:
    job: JudgeJob
    outcome: str
    results: list[MetricResult] = field(default_factory=list)
    judged_at: float = field(default_factory=time.time)
    shadow_results: list[MetricResult] = field(default_factory=list)  # the shadow judge's, never production verdicts
