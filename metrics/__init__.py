"""Holistic LLM judges, usable offline: Failure Rate, Conversational Flow Rate and a team's own rubric files."""

from tracejudge._shared.errors import TracejudgeError

from ._cases import ConversationalEvalTestCase, EvalTestCase
from ._client import CustomLLMClient
from ._judge import HolisticJudgeMetric
from ._results import ConversationResult, MetricResult
from .conversational_flow import ConversationalFlowRateMetric
from .evaluate import evaluate_conversations
from .failure_rate import FailureRateMetric
from .rubric import RubricError, RubricMetric

__all__ = [
    "ConversationResult",
    "ConversationalEvalTestCase",
    "ConversationalFlowRateMetric",
    "CustomLLMClient",
    "EvalTestCase",
    "FailureRateMetric",
    "HolisticJudgeMetric",
    "MetricResult",
    "RubricError",
    "RubricMetric",
    "TracejudgeError",
    "evaluate_conversations",
]
