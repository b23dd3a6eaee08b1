"""What a span IS, decided in one place: a model call, an agent, a chain/workflow step, a tool-like step, or unknown.

The kind decides what its text may become (consumer/adapters/__init__.py):

- a model call (OpenInference `LLM`, GenAI `chat`/`text_completion`/`generate_content`, OpenLLMetry's
  `llm.request.type`) carries the messages the model saw and said: its structured messages first; a raw body fills
  a side only when the span has no messages for that side (a tool-call answer has messages, just no text);
- an agent (OpenInference `AGENT`, GenAI `invoke_agent`, OpenLLMetry `agent`/`workflow`, a framework's own agent
  run) counts when its input/output IS a message, a message list or plain text; framework state (serialized graph
  state, contexts, events, `Send`/`Command` objects, routing words such as `__end__`) is not text;
- a chain, workflow step, graph node or task (OpenInference `CHAIN`, OpenLLMetry `task`, framework nodes) inside a
  trace is never a turn: its input/output is framework state, and the model calls and agents inside it carry the
  conversation; a trace's root chain is the application's entry and is read like an agent;
- a tool, retriever, embedding, reranker, guardrail, evaluator or prompt template is a step inside a turn, never one
  (its output is not the assistant's answer);
- a span of no known kind keeps the readers' full fallback (our own spans, libraries we do not know).
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

from tracejudge.tracer.semconv import GEN_AI_OPERATION_NAME, OPERATION_INVOKE_AGENT

from ..decode import DecodedSpan

OPENINFERENCE_KIND = "openinference.span.kind"
OPENLLMETRY_KIND = "traceloop.span.kind"


class Kind(Enum):
    MODEL = "model"
    AGENT = "agent"
    CHAIN = "chain"
    STEP = "step"
    UNKNOWN = "unknown"


_MODEL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content", "completion", "responses"})
STEP_OPERATIONS = frozenset({"execute_tool", "embeddings", "retrieval", "create_agent"})
STEP_KINDS = frozenset({"TOOL", "RETRIEVER", "EMBEDDING", "RERANKER", "GUARDRAIL", "EVALUATOR", "PROMPT"})
_AGENT_OPERATIONS = frozenset({OPERATION_INVOKE_AGENT, "invoke_workflow"})
_OI_KINDS = {
    "LLM": Kind.MODEL,
    "AGENT": Kind.AGENT,
    "CHAIN": Kind.CHAIN,
    **dict.fromkeys(STEP_KINDS, Kind.STEP),
}
_OPENLLMETRY_KINDS = {"agent": Kind.AGENT, "workflow": Kind.AGENT, "task": Kind.CHAIN, "tool": Kind.STEP}
# Prefixes of structured message attributes, per side: a model call that has them said what it said there.
INPUT_MESSAGE_PREFIXES = ("llm.input_messages.", "gen_ai.prompt.", "gen_ai.input.messages")
OUTPUT_MESSAGE_PREFIXES = ("llm.output_messages.", "gen_ai.completion.", "gen_ai.output.messages")


def _attribute(span: DecodedSpan, key: str) -> str | None:
    value = span.attributes.get(key)
    return value if isinstance(value, str) else None


def span_kind(span: DecodedSpan) -> Kind:
    """The span's kind by the markers its instrumentation writes; the most specific marker wins."""
    attributes = span.attributes
    operation = _attribute(span, GEN_AI_OPERATION_NAME)
    if operation in STEP_OPERATIONS:
        return Kind.STEP
    openinference = _OI_KINDS.get(_attribute(span, OPENINFERENCE_KIND) or "")
    if openinference is not None:
        return openinference
    if operation in _MODEL_OPERATIONS:
        return Kind.MODEL
    if operation in _AGENT_OPERATIONS:
        return Kind.AGENT
    openllmetry = _OPENLLMETRY_KINDS.get(_attribute(span, OPENLLMETRY_KIND) or "")
    if openllmetry is not None:
        return openllmetry
    if isinstance(attributes.get("llm.request.type"), str):  # OpenLLMetry before 0.55: no operation name
        return Kind.MODEL
    if "agent_name" in attributes and "pydantic_ai.all_messages" in attributes:  # pydantic-ai before gen_ai ops
        return Kind.AGENT
    return Kind.UNKNOWN


def has_messages(attributes: dict[str, Any], prefixes: tuple[str, ...]) -> bool:
    """Whether the span wrote structured messages for a side (even ones without text: a tool call)."""
    return any(key.startswith(prefixes) for key in attributes)


def _llama_index_agent(span: DecodedSpan) -> str | None:
    """LlamaIndex agent workflows (`FunctionAgent`, `ReActAgent`, `AgentWorkflow`) name the agent only in their step
    events, which OpenInference writes as reprs: `AgentSetup(..., current_agent_name='refund_agent')`."""
    if not span.name.startswith(_LLAMA_INDEX_AGENT_STEPS):
        return None
    for key in ("output.value", "input.value"):
        value = span.attributes.get(key)
        found = _CURRENT_AGENT.search(value) if isinstance(value, str) else None
        if found:
            return found.group(1)
    return None


_LLAMA_INDEX_AGENT_STEPS = ("BaseWorkflowAgent.", "AgentWorkflow.", "FunctionAgent.", "ReActAgent.", "CodeActAgent.")
_CURRENT_AGENT = re.compile(r"current_agent_name='([^'\\]{1,128})'")


def framework_agent(span: DecodedSpan, kind: Kind | None = None) -> str | None:
    """The agent's own name where a framework writes it in its own way (before the resource's service.name):
    smolagents' agent run span is `<agent name>.run`; LangChain's agents write `lc_agent_name`, a LangGraph graph's
    root span is named after the graph;
    LlamaIndex's agent workflow steps name the current agent; CrewAI's agent span has its role as graph node.
    `kind`: the span's `span_kind`, when the caller has it already."""
    attributes = span.attributes
    name = span.name
    if attributes.get(OPENINFERENCE_KIND) == "CHAIN":
        return _llama_index_agent(span) or _graph_run(span, Kind.CHAIN)
    kind = span_kind(span) if kind is None else kind
    if kind is Kind.AGENT and name.endswith(".run") and any(k.startswith("smolagents.") for k in attributes):
        return name[: -len(".run")] or None
    if kind is Kind.AGENT and isinstance(attributes.get("graph.node.id"), str) and "crew_key" in attributes:
        return attributes["graph.node.id"] or None  # CrewAI: the agent's role is its node in the crew's graph
    lc_agent = attributes.get("traceloop.association.properties.lc_agent_name")  # OpenLLMetry's copy of it
    if isinstance(lc_agent, str) and lc_agent:
        return lc_agent
    return _langchain_agent(span, kind)


def _langchain_agent(span: DecodedSpan, kind: Kind) -> str | None:
    """LangChain's agent name in the run metadata (`create_agent(name=...)` writes `lc_agent_name` on every run of the
    agent), else OpenInference's LangChain instrumentation's graph run: the span named after the graph
    (`create_react_agent(name=...)`, `StateGraph.compile(name=...)`) whose metadata has no `langgraph_node`. It is an
    AGENT span only when the name contains "agent" (the instrumentation's own test), else a CHAIN: both count."""
    metadata = span.attributes.get("metadata")
    if not isinstance(metadata, str) or len(metadata) > _MAX_METADATA:
        return None
    found = _LC_AGENT_NAME.search(metadata)
    if found:
        return found.group(1)
    return _graph_run(span, kind)


def _graph_run(span: DecodedSpan, kind: Kind) -> str | None:
    """The graph's name on OpenInference's LangGraph run span: AGENT when the name contains "agent", else CHAIN."""
    metadata = span.attributes.get("metadata")
    if not isinstance(metadata, str) or len(metadata) > _MAX_METADATA:
        return None
    if kind not in _GRAPH_KINDS or '"langgraph"' not in metadata or "langgraph_node" in metadata:
        return None
    return span.name if span.name not in _DEFAULT_GRAPH_NAMES else None


_MAX_METADATA = 65_536
_LC_AGENT_NAME = re.compile(r'"lc_agent_name":\s*"([^"\\]{1,128})"')


_GRAPH_KINDS = frozenset({Kind.AGENT, Kind.CHAIN})
_DEFAULT_GRAPH_NAMES = frozenset({"LangGraph", "RunnableSequence", "agent"})
