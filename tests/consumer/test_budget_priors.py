"""Review of issue 26: the batch-tier budget before any batch settled (SpendWindow with per-call priors)."""

from __future__ import annotations

from tracejudge.metrics import ConversationalEvalTestCase, EvalTestCase, FailureRateMetric
from tracejudge.metrics._backends import LiteLLMBackend
from tracejudge.metrics._litellm import _import_litellm
from tracejudge.metrics.runner import SpendWindow
from tracejudge.metrics.tiers import TIER_BATCH


def case(turns: int) -> ConversationalEvalTestCase:
    return ConversationalEvalTestCase(
        name="x", turns=[EvalTestCase(input="q" * 400, actual_output="a" * 1200) for _ in range(turns)]
    )


def test_long_conversations_in_flight_then_short_ones_stay_within_the_budget() -> None:
    """Before the first batch settles every call in flight is counted at THIS call's prior, not its own: after
    four long conversations, short ones are admitted as if the long ones were short too."""
    _import_litellm()
    judge = FailureRateMetric(LiteLLMBackend("gpt-5-mini", tier=TIER_BATCH))
    long, short = judge.estimated_cost(case(100)), judge.estimated_cost(case(1))
    assert long > short > 0
    budget = SpendWindow(long * 4.5)
    reserved = 0.0
    for prior in [long] * 5 + [short] * 20:  # a flood during an hour-long batch, the long ones read first
        if budget.reserve(prior=prior):
            reserved += prior
    assert reserved <= budget.max_per_hour, f"reserved {reserved / budget.max_per_hour:.0%} of the budget"
