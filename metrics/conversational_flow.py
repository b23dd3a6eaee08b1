"""Conversational Flow Rate: how natural and coherent the dialogue is (seed document 001).

The rubric, labels, weights and worked examples are the rubric file `rubrics/conversational_flow.yaml`, loaded by
the same code as a team's judge (`rubric.py`); the constants below are read from it.
"""

from __future__ import annotations

from typing import ClassVar

from .rubric import RubricMetric, builtin_rubric, compose_system_prompt

_RUBRIC = builtin_rubric("conversational_flow")
CONVERSATIONAL_FLOW_WEIGHTS: dict[str, float] = _RUBRIC.weights
CONVERSATIONAL_FLOW_SYSTEM_PROMPT: str = compose_system_prompt(_RUBRIC)
# Sent after the worked examples only to models whose provider caches nothing as short as the rubric
# (metrics/_caching.py): more borderline cases, no new rule, so that the static prefix clears the minimum.
CONVERSATIONAL_FLOW_EXTENDED_EXAMPLES: str = _RUBRIC.extended_examples


class ConversationalFlowRateMetric(RubricMetric):
    """How natural and coherent is the whole conversation? Its evidence list is called `key_issues`."""

    rubric = _RUBRIC
    source = "conversational_flow.yaml (built in)"
    builtin = True
    name = _RUBRIC.name
    weights = CONVERSATIONAL_FLOW_WEIGHTS
    system_prompt = CONVERSATIONAL_FLOW_SYSTEM_PROMPT
    extended_examples = CONVERSATIONAL_FLOW_EXTENDED_EXAMPLES
    evidence_key = _RUBRIC.evidence_key
    taxonomy = tuple((mode.name, mode.description) for mode in _RUBRIC.failure_modes)
    failing_verdicts = _RUBRIC.failing_verdicts
    taxonomy_alerts: ClassVar[dict[str, float]] = _RUBRIC.mode_alert_shares
