"""A LiteLLM response read into a JudgeReply: the text, LiteLLM's cost, and the token counts (cache reads and writes
included) from whichever usage shape the provider returned. Shared by the interactive backend and the batch tier,
whose output file carries the same usage shapes.
"""

from __future__ import annotations

from typing import Any

from ._client import JudgeReply
from ._errors import JudgeCallError
from ._results import ERROR_SERVER


def _reply_from_response(response: Any) -> JudgeReply:
    try:
        text = response.choices[0].message.content
    except (AttributeError, IndexError, KeyError) as exc:
        raise JudgeCallError(ERROR_SERVER, f"response without a message: {exc!r}", retryable=True) from exc
    input_tokens, cached, written, output_tokens = usage_tokens(getattr(response, "usage", None))
    cost: float | None = None
    hidden = getattr(response, "_hidden_params", None) or {}
    raw_cost = hidden.get("response_cost") if isinstance(hidden, dict) else None
    if isinstance(raw_cost, int | float):
        cost = float(raw_cost)
    return JudgeReply(
        text=text or "",
        cost_usd=cost,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=cached,
        cache_write_input_tokens=written,
    )


def _field(source: Any, name: str) -> Any:
    if source is None:
        return None
    return source.get(name) if isinstance(source, dict) else getattr(source, name, None)


def _count(source: Any, name: str) -> int | None:
    value = _field(source, name)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else None


def _largest(*values: int | None) -> int | None:
    known = [value for value in values if value is not None]
    return max(known) if known else None


def usage_tokens(usage: Any) -> tuple[int | None, int | None, int | None, int | None]:
    """(all prompt tokens, cache reads, cache writes, output tokens) from any usage shape LiteLLM returns.

    OpenAI and Gemini: `prompt_tokens_details.cached_tokens`, already inside `prompt_tokens`. Anthropic, Bedrock and
    Vertex Claude: `cache_read_input_tokens` / `cache_creation_input_tokens` (also mirrored into
    `prompt_tokens_details.cached_tokens` / `cache_creation_tokens`), which LiteLLM adds into `prompt_tokens`; a shape
    whose prompt count leaves them out (Anthropic's raw `input_tokens`) is recognised by being smaller than their sum.
    """
    if usage is None:
        return None, None, None, None
    details = _field(usage, "prompt_tokens_details")
    read = _largest(_count(usage, "cache_read_input_tokens"), _count(details, "cached_tokens"))
    written = _largest(_count(usage, "cache_creation_input_tokens"), _count(details, "cache_creation_tokens"))
    prompt = _count(usage, "prompt_tokens")
    if prompt is not None and prompt < (read or 0) + (written or 0):
        prompt += (read or 0) + (written or 0)
    return prompt, read, written, _count(usage, "completion_tokens")
