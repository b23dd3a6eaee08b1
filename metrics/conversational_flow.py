"""Conversational Flow Rate: how natural and coherent the dialogue is (seed document 001).

The rubric, labels, weights and worked examples are the rubric file `rubrics/conversational_flow.yaml`, loaded by
the same code as a team's judge (`rubric.py`); the constants below are read from it.
"""

from __future__ import annotations

from .rubric import RubricMetric, builtin_rubric


class ConversationalFlowRateMetric(RubricMetric):
    """How natural and coherent is the whole conversation? Its evidence list is called `key_issues`."""

    rubric = builtin_rubric("conversational_flow")
    source = "conversational_flow.yaml (built in)"
    builtin = True


CONVERSATIONAL_FLOW_WEIGHTS: dict[str, float] = ConversationalFlowRateMetric.weights
CONVERSATIONAL_FLOW_SYSTEM_PROMPT: str = ConversationalFlowRateMetric.system_prompt
# Sent after the worked examples only to models whose provider caches nothing as short as the rubric
# (metrics/_caching.py): more borderline cases, no new rule, so that the static prefix clears the minimum.
CONVERSATIONAL_FLOW_EXTENDED_EXAMPLES: str = ConversationalFlowRateMetric.extended_examples
