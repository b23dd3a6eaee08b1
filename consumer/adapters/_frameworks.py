"""Agent-level text: what an agent span's input/output says when it IS a message, a message list or plain text.

Agent frameworks put their own objects in `input.value`/`output.value` (OpenInference) or `traceloop.entity.*`
(OpenLLMetry): LangGraph's state (`{"messages": [...]}` with LangChain's serialized messages), smolagents' run
arguments (`{"task": ...}`, tasks as `New task:\\n<task>`), LlamaIndex's `{"user_msg": ...}`, wrapped calls
(`{"args": [...], "kwargs": {...}}`). Only those known shapes give text; anything else — contexts, events,
`Send`/`Command` objects, routing words, an object's repr, JSON of an unknown shape — is framework state, not what the
user or the agent said, and gives nothing (unlike a model call's raw body, which is kept as it is).
"""

from __future__ import annotations

import re
from typing import Any

from ._langchain import langchain_message
from ._text import ASSISTANT_ROLES, NOT_JSON, USER_ROLES, exchange_input, load_json, message_role_text

_MAX_DEPTH = 6
_USER_KEYS = ("task", "user_msg", "input", "query", "question", "message", "user_input", "prompt", "messages", "text")
_ANSWER_KEYS = ("final_output", "output", "response", "answer", "result", "reply", "content", "text", "messages")
# Where a framework nests a call's arguments: OpenLLMetry's LangChain chains ({"inputs": {...}, "tags": ...}),
# OpenInference's DSPy modules ({"input_args": {"question": ..., "history": ...}}).
_INPUT_WRAPPERS = ("inputs", "input_args")
_ID_ARGUMENTS = ("session", "conversation", "thread", "user_id", "chat_id", "run_id", "trace", "config")
# smolagents writes a task as "New task:\n<task>" in its memory (TaskStep.to_messages); CrewAI as
# "Current Task: <task>\n\nThis is the expected criteria for your final answer: ..." (its task prompt template).
_SMOLAGENTS_TASK = re.compile(r"^\s*New task:\s*\n", re.IGNORECASE)
_CREWAI_TASK = re.compile(
    r"^\s*Current Task:\s*(.*?)\s*\n\nThis is the expected criteria for your final answer:", re.DOTALL
)
# Framework objects written as text: LangGraph's routing words, an object's repr, a constructor call's repr
# (`Send(node=...)`, `AgentSetup(input=[...], ...)`, `StopEvent()`; OpenInference cuts long ones off with "...").
_STATE_TEXT = re.compile(r"^\s*(<[\w.]+ object at 0x[0-9a-f]+>|__end__|__start__|[A-Z]\w*\((\w+=|\)).*)\s*$", re.DOTALL)


# Objects written as their repr: `<X object at 0x...>`, `<FunctionTool object>`, enum members `<Role.USER: 'user'>`.
_REPR = re.compile(r"<[A-Za-z_][\w.]* object(?: at 0x[0-9a-fA-F]+)?>|=<[A-Z]\w*\.[A-Z_]+: ")


def is_state(text: str | None) -> bool:
    """Whether a body's text is framework state (object reprs, routing words), not what anyone said."""
    return text is not None and bool(_REPR.search(text) or _STATE_TEXT.match(text))


def clean_task(text: str) -> str:
    """The task a framework wrapped in its own prompt template (smolagents, CrewAI), else the text as it is."""
    crewai = _CREWAI_TASK.match(text)
    if crewai:
        return crewai.group(1)
    return _SMOLAGENTS_TASK.sub("", text, count=1)


def _crewai_output(data: dict[str, Any]) -> tuple[str | None, str | None] | None:
    """CrewAI's TaskOutput (`description`, `raw`) or CrewOutput (`raw`, `tasks_output`): (the task, the answer)."""
    if not isinstance(data.get("raw"), str):
        return None
    if isinstance(data.get("description"), str) and "expected_output" in data:
        return data["description"], data["raw"]
    tasks = data.get("tasks_output")
    if isinstance(tasks, list) and tasks and isinstance(tasks[-1], dict):
        last = tasks[-1].get("description")
        return (last if isinstance(last, str) else None), data["raw"]
    return None


def output_task(value: Any) -> str | None:
    """The task an agent's output says it did (CrewAI's task output names its task): the user's ask."""
    data = load_json(value) if isinstance(value, str) else value
    found = _crewai_output(data) if isinstance(data, dict) else None
    return _plain(found[0]) if found and found[0] else None


def _plain(text: str) -> str | None:
    if not text.strip() or is_state(text):
        return None
    return clean_task(text)


def _messages(items: list[Any]) -> list[Any]:
    return [langchain_message(item) or item for item in items]


def _is_message_list(items: list[Any]) -> bool:
    return bool(items) and all(
        isinstance(item, dict) and ("role" in item or langchain_message(item) is not None) for item in items
    )


def user_text(value: Any, depth: int = 0) -> str | None:
    """The user's text in an agent's input, or None when it is framework state."""
    if depth > _MAX_DEPTH or value is None:
        return None
    data = load_json(value) if isinstance(value, str) else value
    if data is NOT_JSON:
        return _plain(value)
    if isinstance(data, str):
        return _plain(data)
    if isinstance(data, list):
        if _is_message_list(data):
            text = exchange_input(_messages(data), default_user=False)
            return clean_task(text) if text else None
        return None
    if not isinstance(data, dict):
        return None
    message = langchain_message(data) or (data if "role" in data else None)
    if message is not None:
        role, text = message_role_text(message)
        return _plain(text) if text and role in USER_ROLES else None
    if data and set(data) <= {"args", "kwargs"}:  # a wrapped call (OpenLLMetry @workflow/@agent)
        given_args, given_kwargs = data.get("args"), data.get("kwargs")
        args = given_args if isinstance(given_args, list) else []
        kwargs = given_kwargs if isinstance(given_kwargs, dict) else {}
        candidates = [*args, *(v for k, v in kwargs.items() if not any(m in k.lower() for m in _ID_ARGUMENTS))]
        return next((t for t in (user_text(c, depth + 1) for c in candidates) if t), None)
    for key in _USER_KEYS:
        if key in data:
            text = user_text(data[key], depth + 1)
            if text:
                return text
    for wrapper in _INPUT_WRAPPERS:
        if isinstance(data.get(wrapper), dict):
            return user_text(data[wrapper], depth + 1)
    return None


def _final_answer(items: list[Any]) -> str | None:
    """The last assistant message with text, when no user message follows it (a state ending in this run's answer)."""
    for item in reversed(_messages(items)):
        role, text = message_role_text(item)
        if role in USER_ROLES:
            return None
        if role in ASSISTANT_ROLES and text and text.strip():
            return text
    return None


def answer_text(value: Any, depth: int = 0) -> str | None:
    """The agent's final answer in its output, or None when it is framework state."""
    if depth > _MAX_DEPTH or value is None:
        return None
    data = load_json(value) if isinstance(value, str) else value
    if data is NOT_JSON:
        return _plain(value)
    if isinstance(data, str):
        return _plain(data)
    if isinstance(data, list):
        return _final_answer(data) if _is_message_list(data) else None
    if not isinstance(data, dict):
        return None
    message = langchain_message(data) or (data if "role" in data else None)
    if message is not None:
        role, text = message_role_text(message)
        return _plain(text) if text and (role is None or role in ASSISTANT_ROLES) else None
    crewai = _crewai_output(data)
    if crewai is not None and crewai[1] is not None:
        return _plain(crewai[1])
    for key in _ANSWER_KEYS:
        if key in data:
            text = answer_text(data[key], depth + 1)
            if text:
                return text
    if isinstance(data.get("outputs"), dict):  # OpenLLMetry's LangChain chains: {"outputs": {...}, "kwargs": ...}
        return answer_text(data["outputs"], depth + 1)
    return None
