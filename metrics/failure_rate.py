"""Failure Rate: how the agent behaves when it does not know (seed document 000).

The rubric, labels, weights and worked examples are the rubric file `rubrics/failure_rate.yaml`, loaded by
the same code as a team's judge (`rubric.py`); the constants below are read from it.
"""

from __future__ import annotations

from .rubric import RubricMetric, builtin_rubric


class FailureRateMetric(RubricMetric):
    """Does the agent hallucinate, stall, or admit it does not know? One fabrication forces `hallucination`."""

    rubric = builtin_rubric("failure_rate")
    source = "failure_rate.yaml (built in)"
    builtin = True


FAILURE_RATE_WEIGHTS: dict[str, float] = FailureRateMetric.weights
FAILURE_RATE_SYSTEM_PROMPT: str = FailureRateMetric.system_prompt
# Sent after the worked examples only to models whose provider caches nothing as short as the rubric
# (metrics/_caching.py): more borderline cases, no new rule, so that the static prefix clears the minimum.
FAILURE_RATE_EXTENDED_EXAMPLES: str = FailureRateMetric.extended_examples
