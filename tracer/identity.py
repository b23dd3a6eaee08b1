"""Which conversation and which agent a span belongs to, whatever library wrote it: one resolver for all.

The exporter keys Kafka records with it and the consumer's adapters group turns with it, so both always agree.
Keys are tried in order; the first non-empty value wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .semconv import GEN_AI_AGENT_NAME, GEN_AI_CONVERSATION_ID

_TRACELOOP = "traceloop.association.properties."

CONVERSATION_ID_KEYS: tuple[str, ...] = (
    GEN_AI_CONVERSATION_ID,  # OpenTelemetry GenAI conventions: ours, opentelemetry-util-genai, pydantic-ai, Traceloop
    "session.id",  # OpenInference `using_session`, Langfuse, Logfire
    *(  # OpenLLMetry `Traceloop.set_association_properties({...})`
        _TRACELOOP + key for key in ("session_id", "conversation_id", "thread_id", "chat_id")
    ),
    "langfuse.session.id",  # Langfuse's own spelling
    "ai.telemetry.metadata.sessionId",  # Vercel AI SDK `experimental_telemetry: {metadata: {sessionId}}`
    "langsmith.metadata.session_id",  # LangSmith threads
    "langsmith.metadata.conversation_id",
    "langsmith.metadata.thread_id",
)

AGENT_NAME_KEYS: tuple[str, ...] = (
    GEN_AI_AGENT_NAME,
    "agent.name",  # OpenInference (openai-agents, LangGraph, CrewAI instrumentations)
    "agent_name",  # pydantic-ai's agent run span
    "traceloop.workflow.name",  # OpenLLMetry @workflow / @agent
    "ai.telemetry.functionId",  # Vercel AI SDK
)

SERVICE_NAME = "service.name"


_NOT_IDS = (bool, list, tuple, dict, set)  # built once: `bool | list | ...` in the call built a union per call


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, _NOT_IDS):
        return None  # an array is no id (and its text would differ between the SDK's tuples and OTLP's lists)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = value if isinstance(value, str) else str(value)
    return text if text.strip() else None  # the id as written: the exporter and the consumer must agree byte for byte


def conversation_id(attributes: Mapping[str, Any] | None) -> str | None:
    """The conversation a span's attributes name, or None when they name none."""
    if not attributes:
        return None
    for key in CONVERSATION_ID_KEYS:
        given = attributes.get(key)
        value = None if given is None else _text(given)
        if value is not None:
            return value
    return None


def agent_name(attributes: Mapping[str, Any] | None, resource: Mapping[str, Any] | None = None) -> str | None:
    """The agent's name: GenAI, then the framework's agent or workflow name, then the resource's service.name."""
    attributes = attributes or {}
    for key in AGENT_NAME_KEYS:
        value = _text(attributes.get(key))
        if value is not None:
            return value
    if attributes.get("traceloop.span.kind") in ("agent", "workflow"):  # OpenLLMetry @agent / @workflow name
        value = _text(attributes.get("traceloop.entity.name"))
        if value is not None:
            return value
    return service_name(resource)


def service_name(resource: Mapping[str, Any] | None) -> str | None:
    """service.name unless it is the SDK's default (`unknown_service...`), which says nothing about the agent."""
    value = _text((resource or {}).get(SERVICE_NAME))
    if value is None or value.startswith("unknown_service"):
        return None
    return value
