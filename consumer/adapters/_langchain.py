"""LangChain's serialized message objects as plain `{role, content}` messages, so every reader understands them.

LangChain writes messages three ways: `dumpd` (`{"lc": 1, "type": "constructor", "id": [..., "HumanMessage"],
"kwargs": {...}}`), `messages_to_dict` (`{"type": "human", "data": {...}}`) and pydantic `model_dump`
(`{"type": "ai", "content": ..., "tool_calls": [...]}`). No imports from the other readers: `_text` uses this.
"""

from __future__ import annotations

from typing import Any

_ROLES = {
    "human": "user",
    "ai": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
    "remove": "tool",
}
_CLASSES = {
    "HumanMessage": "user",
    "HumanMessageChunk": "user",
    "AIMessage": "assistant",
    "AIMessageChunk": "assistant",
    "SystemMessage": "system",
    "SystemMessageChunk": "system",
    "ToolMessage": "tool",
    "ToolMessageChunk": "tool",
    "FunctionMessage": "tool",
    "ChatMessage": None,
}


def langchain_message(message: Any) -> dict[str, Any] | None:
    """`{"role", "content"}` for a serialized LangChain message; None for anything else."""
    if not isinstance(message, dict) or "role" in message:
        return None
    kind = message.get("type")
    if message.get("lc") == 1 and kind == "constructor" and isinstance(message.get("id"), list) and message["id"]:
        name = message["id"][-1]
        given = message.get("kwargs")
        kwargs = given if isinstance(given, dict) else {}
        if name not in _CLASSES:
            return None
        role = _CLASSES[name] or kwargs.get("role")
        return {"role": role, "content": kwargs.get("content")}
    if not isinstance(kind, str) or kind not in _ROLES:
        return None
    if isinstance(message.get("data"), dict) and "content" in message["data"]:
        return {"role": _ROLES[kind], "content": message["data"].get("content")}
    if "content" in message:
        return {"role": _ROLES[kind], "content": message.get("content")}
    return None
