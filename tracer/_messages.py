"""GenAI semantic-convention message JSON, and finding the text in the shapes agents return."""

from __future__ import annotations

import json
from typing import Any

from tracejudge._shared.text import clip, valid_unicode

MAX_CONTENT_CHARS = 100_000


def _text_parts(content: str) -> list[dict[str, str]]:
    return [{"type": "text", "content": clip(valid_unicode(content), MAX_CONTENT_CHARS)}]


def input_messages_json(content: str) -> str:
    return json.dumps([{"role": "user", "parts": _text_parts(content)}], ensure_ascii=False)


def output_messages_json(content: str) -> str:
    return json.dumps(
        [{"role": "assistant", "parts": _text_parts(content), "finish_reason": "stop"}], ensure_ascii=False
    )


def _get(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        return value.get(key)
    return getattr(value, key, None)


def output_text(result: Any) -> str:
    """The text of an agent's answer: a str, an OpenAI chat completion or message (object or dict), else str()."""
    if isinstance(result, str):
        return result
    choices = _get(result, "choices")
    if isinstance(choices, list | tuple) and choices:
        message = _get(choices[0], "message")
        content = _get(message, "content") if message is not None else None
        if isinstance(content, str):
            return content
    content = _get(result, "content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # a message whose content is a list of parts
        texts = [part.get("text") or part.get("content") for part in content if isinstance(part, dict)]
        joined = "".join(t for t in texts if isinstance(t, str))
        if joined:
            return joined
    return str(result)


def chunk_text(chunk: Any) -> str:
    """The text of one streamed chunk: a str, an OpenAI chat-completion chunk's delta, else str()."""
    if isinstance(chunk, str):
        return chunk
    if isinstance(chunk, bytes):
        return chunk.decode("utf-8", "replace")
    choices = _get(chunk, "choices")
    if isinstance(choices, list | tuple) and choices:
        delta = _get(choices[0], "delta")
        content = _get(delta, "content") if delta is not None else None
        if isinstance(content, str):
            return content
        if delta is not None:
            return ""
    return output_text(chunk)
