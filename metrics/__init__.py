"""The two holistic LLM judges, usable offline: Failure Rate and Conversational Flow Rate."""

from tracejudge._shared.errors import TracejudgeError

from ._cases import ConversationalEvalTestCase, EvalTestCase
from ._client import CustomLLMClient
from ._judge import HolisticJudgeMetric
from ._results import ConversationResult, MetricResult
from .conversational_flow import ConversationalFlowRateMetric
from .evaluate import evaluate_conversations
from .failure_rate import FailureRateMetric

__all__ = [
    "ConversationResult",
    "ConversationalEvalTestCase",
    "ConversationalFlowRateMetric",
    "CustomLLMClient",
    "EvalTestCase",
    "FailureRateMetric",
    "HolisticJudgeMetric",
    "MetricResult",
    "TracejudgeError",
    "evaluate_conversations",
]
