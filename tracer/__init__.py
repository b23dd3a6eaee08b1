"""Trace an LLM agent: each turn one OpenTelemetry GenAI span, shipped to Kafka for tracejudge to judge.

Light on purpose: importing this package never imports LiteLLM or any judge code.
"""

from ._conversation import conversation, end_conversation
from ._decorator import traced_agent
from ._feedback import record_feedback
from ._stamping import ConversationSpanProcessor
from .errors import TracedAgentWarning
from .exporter import KafkaSpanExporter
from .setup import setup_tracing

__all__ = [
    "ConversationSpanProcessor",
    "KafkaSpanExporter",
    "TracedAgentWarning",
    "conversation",
    "end_conversation",
    "record_feedback",
    "setup_tracing",
    "traced_agent",
]
