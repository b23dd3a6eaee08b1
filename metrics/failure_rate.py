"""Failure Rate: how the agent behaves when it does not know (seed document 000).

The rubric, labels, weights and worked examples are the rubric file `rubrics/failure_rate.yaml`, loaded by
the same code as a team's judge (`rubric.py`); the constants below are read from it.
"""

from __future__ import annotations

from typing import ClassVar

from .rubric import RubricMetric, builtin_rubric, compose_system_prompt

_RUBRIC = builtin_rubric("failure_rate")
FAILURE_RATE_WEIGHTS: dict[str, float] = _RUBRIC.weights
FAILURE_RATE_SYSTEM_PROMPT: str = compose_system_prompt(_RUBRIC)
# Sent after the worked examples only to models whose provider caches nothing as short as the rubric
# (metrics/_caching.py): more borderline cases, no new rule, so that the static prefix clears the minimum.
FAILURE_RATE_EXTENDED_EXAMPLES: str = _RUBRIC.extended_examples


class FailureRateMetric(RubricMetric):
    """Does the agent hallucinate, stall, or admit it does not know? One fabrication forces `hallucination`."""

    rubric = _RUBRIC
    source = "failure_rate.yaml (built in)"
    builtin = True
    name = _RUBRIC.name
    weights = FAILURE_RATE_WEIGHTS
    system_prompt = FAILURE_RATE_SYSTEM_PROMPT
    extended_examples = FAILURE_RATE_EXTENDED_EXAMPLES
    evidence_key = _RUBRIC.evidence_key
    taxonomy = tuple((mode.name, mode.description) for mode in _RUBRIC.failure_modes)
    failing_verdicts = _RUBRIC.failing_verdicts
    taxonomy_alerts: ClassVar[dict[str, float]] = _RUBRIC.mode_alert_shares
