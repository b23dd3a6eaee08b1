"""The conversation's text in what instrumentations record: message lists (any vendor's shape), API bodies, wrappers.

A span that carries the whole history yields one exchange: the user message(s) after the last assistant message
that has text, and this call's answer. System, developer and tool messages are never user turns. Bodies are
understood when they are a known shape (chat completions, the Responses API, Anthropic messages, Gemini contents,
streamed chunks, `{"args": [...], "kwargs": {...}}` wrappers, JSON-quoted strings); plain text stays as it is, and so
does JSON of an unknown shape (a structured output, say): better than losing the turn. A body parsed from a raw
attribute yields to structured messages when spans nest (consumer/exchanges.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from ._langchain import langchain_message

USER_ROLES = frozenset({"user", "human"})
ASSISTANT_ROLES = frozenset({"assistant", "model", "ai", "bot"})
_NOT_ACTS = frozenset({"system", "developer"})  # roles between user messages that do not end a question
_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text", "refusal", "text_delta"})
_MAX_DEPTH = 6
_ID_ARGUMENTS = ("session", "conversation", "thread", "user_id", "chat_id", "run_id", "trace", "config")
_INPUT_KEYS = ("input", "query", "question", "message", "user_input", "user_message", "prompt", "text", "content")
_OUTPUT_KEYS = ("final_output", "output", "answer", "response", "result", "reply", "output_text", "text", "content")


class _NotJson:
    pass


NOT_JSON = _NotJson()


def loads(text: str) -> Any:
    """JSON text by orjson (several times the standard library's speed on message bodies); what orjson refuses but
    the standard library reads (NaN, integers past 64 bits, lone surrogates) by the standard library, so what a
    body parses to never changes. Raises ValueError or RecursionError as `json.loads` does."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def load_json(value: Any) -> Any:
    """Parsed JSON, or NOT_JSON. Several JSON documents (a joined stream, `data: ` lines) become a list."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text or (text[0] not in '{["' and not text.startswith("data:")):
        return NOT_JSON
    try:
        return orjson.loads(text)  # `loads`, its usual case inline (a call less for every message attribute)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    return _json_sequence(text)


def _json_sequence(text: str) -> Any:
    decoder = json.JSONDecoder()
    items: list[Any] = []
    position = 0
    while position < len(text):
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        if text.startswith("data:", position):
            position += 5
            continue
        if text.startswith("[DONE]", position):
            position += 6
            continue
        if position >= len(text):
            break
        try:
            item, position = decoder.raw_decode(text, position)
        except (ValueError, RecursionError):
            return NOT_JSON
        items.append(item)
    return items if len(items) > 1 else NOT_JSON


def _join(texts: Iterable[str | None], separator: str = "\n") -> str | None:
    found = [t for t in texts if isinstance(t, str) and t.strip()]
    if len(found) == 1:
        return found[0]  # the usual single message: no join to build a copy of it
    return separator.join(found) if found else None


def part_text(part: Any) -> str | None:
    """The text of one content part (GenAI `parts`, OpenAI, Responses API, Anthropic, Gemini, OpenInference)."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind is not None and (not isinstance(kind, str) or kind not in _TEXT_PART_TYPES):
        return None  # tool calls and results, images, reasoning: not what the user and agent said
    for key in ("content", "text", "refusal", "message_content.text"):
        value = part.get(key)
        if isinstance(value, str):
            return value
    return None


# Keys of Bedrock Converse / Strands content blocks (`[{"text": ...}, {"toolUse": {...}}]`).
_BLOCK_KEYS = frozenset(
    {"text", "toolUse", "toolResult", "image", "document", "video", "reasoningContent", "cachePoint", "guardContent"}
)


def content_blocks(value: str) -> list[dict[str, Any]] | None:
    """A content-block list serialised into a string (Strands' `gen_ai.*.message` events), or None when the string
    is text: only a list whose every item is a single known block counts, so a user's own JSON stays as typed."""
    text = value.strip()
    if not text.startswith("[{") or not text.endswith("}]"):
        return None
    try:
        blocks = loads(text)
    except (ValueError, RecursionError):
        return None
    if not all(isinstance(b, dict) and len(b) == 1 and next(iter(b)) in _BLOCK_KEYS for b in blocks):
        return None
    return blocks


def content_text(content: Any) -> str | None:
    if isinstance(content, str):
        blocks = content_blocks(content)
        return content if blocks is None else _join((part_text(b) for b in blocks), "")
    if isinstance(content, list):  # `_join` of the parts' text, in one list (the usual content is a part list)
        found = [text for text in map(part_text, content) if text and text.strip()]
        return "".join(found) if found else None
    if isinstance(content, dict):
        return part_text(content)
    return None


def message_role_text(message: Any) -> tuple[str | None, str | None]:
    """(role, text) of one message in any vendor's shape; text None for tool calls, results and reasoning."""
    if isinstance(message, str):
        return None, message
    if not isinstance(message, dict):
        return None, None
    if "role" not in message:  # (a message with a role is neither of these: the usual one skips both)
        message = langchain_message(message) or message  # LangChain's serialized message objects
        for _ in range(_MAX_DEPTH):  # a gen_ai.choice body: {"index": 0, "message": {...}}
            if "role" in message or not isinstance(message.get("message"), dict):
                break
            message = message["message"]
    role = message.get("role")
    kind = message.get("type")
    if kind is not None and kind != "message" and role is None:
        return "tool", None  # Responses API function_call / function_call_output / reasoning items
    role = role.lower() if isinstance(role, str) else None
    parts = message.get("parts")  # (absent reads None: not a list either)
    if isinstance(parts, list):
        return role, content_text(parts)
    return role, content_text(message.get("content"))


def exchange_input(messages: Any, *, default_user: bool = True) -> str | None:
    """The user's message(s) after the last assistant message with text: this call's question, never the history.
    Once the question is found, any earlier assistant act ends it too (a tool call, a tool result, smolagents'
    `tool-call`/`tool-response` roles): an answer given as a tool call must not join two questions."""
    if isinstance(messages, dict):
        messages = [messages]
    if not isinstance(messages, list):
        return None
    collected: list[str] = []
    for message in reversed(messages):
        role, text = message_role_text(message)
        if collected and role is not None and role not in USER_ROLES and role not in _NOT_ACTS:
            break
        if not text or not text.strip():
            continue
        if role in ASSISTANT_ROLES:
            break
        if role in USER_ROLES or (role is None and default_user):
            collected.append(text)
    return _join(reversed(collected))


def answer_text(messages: Any) -> str | None:
    """The assistant's text in output messages (all choices' text parts; tool calls and reasoning left out)."""
    if isinstance(messages, dict):
        messages = [messages]
    if not isinstance(messages, list):
        return None
    texts = []
    for message in messages:
        role, text = message_role_text(message)
        if role is None or role in ASSISTANT_ROLES:
            texts.append(text)
    return _join(texts)


class _Unknown:
    pass


UNKNOWN = _Unknown()  # JSON of a shape we do not know: not "no text"


def _as_given(value: Any) -> str | None:
    if isinstance(value, str):
        return value if value.strip() else None
    return None if value is None else json.dumps(value, ensure_ascii=False, default=str)


def input_from_body(value: Any) -> str | None:
    """The user's text in a request body, a wrapped call's arguments or plain text (JSON of an unknown shape, too,
    as it is: better than losing the turn)."""
    return _from_body(value, _input_of)


def output_from_body(value: Any) -> str | None:
    """The answer's text in a response body, joined stream chunks, a JSON-quoted string or plain text (JSON of an
    unknown shape, a structured output say, as it is)."""
    return _from_body(value, _output_of)


def _from_body(value: Any, walk: Callable[[Any, int], Any]) -> str | None:
    """What `walk` finds in the JSON of `value`; the value as given when it is not JSON or of an unknown shape."""
    data = load_json(value)
    if data is NOT_JSON:
        return _as_given(value)
    text = walk(data, 0)
    return _as_given(value) if text is UNKNOWN else text


def _text_of(found: Any) -> str | None:
    return None if found is UNKNOWN else found


def _scalar(data: Any) -> str | None:
    if isinstance(data, bool) or data is None:
        return None
    if isinstance(data, int | float):
        return str(data)
    return None


def _in_string(data: str, depth: int, walk: Callable[[Any, int], Any]) -> Any:
    """Plain text as it is; JSON in a string walked one level deeper (the string itself for an unknown shape)."""
    inner = load_json(data)
    if inner is NOT_JSON:
        return data
    found = walk(inner, depth + 1)
    return data if found is UNKNOWN else found


def _input_of(data: Any, depth: int) -> Any:
    """Text, None (a known shape without user text) or UNKNOWN."""
    if depth > _MAX_DEPTH:
        return None
    if isinstance(data, str):
        return _in_string(data, depth, _input_of)
    if isinstance(data, list):
        if all(isinstance(item, str) for item in data):
            return _join(data)
        if not any(isinstance(item, dict) for item in data):
            return UNKNOWN
        return exchange_input(data)
    if not isinstance(data, dict):
        return _scalar(data)
    if data and set(data) <= {"args", "kwargs"}:  # a wrapped function call (OpenLLMetry @workflow, @task)
        given = data.get("kwargs")
        kwargs = given if isinstance(given, dict) else {}
        candidates = list(data.get("args") or []) if isinstance(data.get("args"), list) else []
        candidates += [v for k, v in kwargs.items() if not any(marker in k.lower() for marker in _ID_ARGUMENTS)]
        first = candidates[0] if candidates else None
        if len(candidates) > 1 and isinstance(first, str) and first.isidentifier() and first[:1].isupper():
            candidates = candidates[1:]  # a method's `self`: traceloop's JSON encoder writes an object's class name
        for candidate in candidates:
            text = _text_of(_input_of(candidate, depth + 1))
            if text:
                return text
        return None
    for key in ("messages", "contents"):  # chat completions, Anthropic messages, Gemini
        if isinstance(data.get(key), list):
            return exchange_input(data[key])
    if "role" in data or "parts" in data:
        role, text = message_role_text(data)
        return text if role is None or role in USER_ROLES else None
    for key in _INPUT_KEYS:  # the Responses API's `input`, completions' `prompt`, frameworks' own shapes
        if key in data:
            text = _text_of(_input_of(data[key], depth + 1))
            if text:
                return text
    return UNKNOWN


def _stream_text(chunks: list[Any]) -> str | None:
    """Joined streamed chunks: chat completions deltas, Responses API and Anthropic delta events."""
    pieces: list[str] = []
    completed: str | None = None
    streamed = False
    for chunk in chunks:
        if not isinstance(chunk, dict):
            return None
        choices = chunk.get("choices")
        if isinstance(choices, list):
            streamed = True
            for choice in choices[:1]:
                delta = choice.get("delta") if isinstance(choice, dict) else None
                text = content_text(delta.get("content")) if isinstance(delta, dict) else None
                if text:
                    pieces.append(text)
            continue
        kind = chunk.get("type")
        if kind == "response.output_text.delta" and isinstance(chunk.get("delta"), str):
            streamed = True
            pieces.append(chunk["delta"])
        elif kind == "content_block_delta" and isinstance(chunk.get("delta"), dict):
            streamed = True
            text = part_text(chunk["delta"])
            if text:
                pieces.append(text)
        elif kind == "response.completed" and isinstance(chunk.get("response"), dict):
            streamed = True
            completed = _text_of(_output_of(chunk["response"], 1))
        elif isinstance(kind, str) and (kind.startswith("response.") or kind.startswith(("message_", "content_block"))):
            streamed = True
    if not streamed:
        return None
    return "".join(pieces) if pieces else completed


def _output_of(data: Any, depth: int) -> Any:
    """Text, None (a known shape without answer text: a tool call) or UNKNOWN."""
    if depth > _MAX_DEPTH:
        return None
    if isinstance(data, str):
        return _in_string(data, depth, _output_of)
    if isinstance(data, list):
        if all(isinstance(item, str) for item in data):
            return _join(data, "")
        if not any(isinstance(item, dict) for item in data):
            return UNKNOWN
        streamed = _stream_text(data)
        return streamed if streamed is not None else answer_text(data)
    if not isinstance(data, dict):
        return _scalar(data)
    choices = data.get("choices")
    if isinstance(choices, list):  # chat completions (or a single streamed chunk)
        if not choices or not isinstance(choices[0], dict):
            return None
        choice = choices[0]
        for key in ("message", "delta"):
            if isinstance(choice.get(key), dict):
                return content_text(choice[key].get("content"))
        return choice.get("text") if isinstance(choice.get("text"), str) else None
    if isinstance(data.get("output"), list):  # the Responses API
        if isinstance(data.get("output_text"), str) and data["output_text"]:
            return data["output_text"]
        return answer_text(data["output"])
    candidates = data.get("candidates")
    if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict):  # Gemini
        content = candidates[0].get("content")
        return content_text(content.get("parts")) if isinstance(content, dict) else None
    if "role" in data or "parts" in data or data.get("type") == "message":  # a message (Anthropic's response too)
        role, text = message_role_text(data)
        return text if role is None or role in ASSISTANT_ROLES else None
    if isinstance(data.get("message"), dict):
        return _output_of(data["message"], depth + 1)
    for key in _OUTPUT_KEYS:
        if key in data:
            text = _text_of(_output_of(data[key], depth + 1))
            if text:
                return text
    return UNKNOWN
