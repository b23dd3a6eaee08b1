"""Judge model clients: model strings resolved to LiteLLM, user-supplied clients, retries and hard timeouts.

LiteLLM is imported on the first call, not at import time: it takes seconds to import and applications that only
trace must never pay for it.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from ._errors import JudgeCallError
from ._results import (
    ERROR_AUTH,
    ERROR_BAD_REQUEST,
    ERROR_CLIENT,
    ERROR_CONNECTION,
    ERROR_RATE_LIMITED,
    ERROR_SERVER,
    ERROR_TIMEOUT,
)

# Seeds' short provider names that differ from LiteLLM's.
_PROVIDER_ALIASES = {"google": "gemini"}
_MAX_RETRY_AFTER_S = 60.0


class CustomLLMClient(ABC):
    """A judge model of your own; the same interface as the seeds' library, so existing clients work unchanged."""

    @abstractmethod
    async def chat_complete(self, messages: list[dict[str, str]], temperature: float) -> tuple[str, float | None]:
        """Return the model's text and its cost in USD (None when unknown)."""

    @abstractmethod
    def get_model_name(self) -> str:
        """The name reported in results and metrics."""


@dataclass(slots=True)
class JudgeReply:
    text: str
    cost_usd: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None


def litellm_model_string(model: str) -> str:
    """Map the seeds' model names to LiteLLM's: `provider:model` → `provider/model`, bare names are OpenAI."""
    model = model.strip()
    if not model:
        raise ValueError("judge model name is empty")
    if "/" in model:
        return model
    if ":" in model:
        provider, _, name = model.partition(":")
        provider = _PROVIDER_ALIASES.get(provider.lower(), provider.lower())
        return f"{provider}/{name}"
    return f"openai/{model}"


class JudgeBackend(ABC):
    """One judge call, one attempt; failures raise JudgeCallError with a reason."""

    model_name: str

    @abstractmethod
    async def complete(self, messages: list[dict[str, str]], *, timeout: float) -> JudgeReply: ...


class CustomClientBackend(JudgeBackend):
    def __init__(self, client: CustomLLMClient) -> None:
        self.client = client
        self.model_name = client.get_model_name()

    async def complete(self, messages: list[dict[str, str]], *, timeout: float) -> JudgeReply:
        try:
            text, cost = await self.client.chat_complete(messages, 0.0)
        except TimeoutError as exc:
            raise JudgeCallError(ERROR_TIMEOUT, f"custom client timed out: {exc!r}", retryable=True) from exc
        except (ConnectionError, OSError) as exc:
            raise JudgeCallError(ERROR_CONNECTION, f"custom client connection error: {exc!r}", retryable=True) from exc
        except Exception as exc:
            raise JudgeCallError(ERROR_CLIENT, f"custom client failed: {exc!r}", retryable=False) from exc
        if not isinstance(text, str):
            raise JudgeCallError(
                ERROR_CLIENT, f"custom client returned {type(text).__name__}, not str", retryable=False
            )
        return JudgeReply(text=text, cost_usd=cost)


def _import_litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    return litellm


def _retry_after_seconds(exc: BaseException) -> float | None:
    """Read Retry-After (seconds or HTTP date) from whatever headers LiteLLM kept on the exception."""
    candidates: list[Any] = [getattr(exc, "litellm_response_headers", None)]
    response = getattr(exc, "response", None)
    candidates.append(getattr(response, "headers", None))
    for headers in candidates:
        if not headers:
            continue
        try:
            value = headers.get("retry-after") or headers.get("Retry-After")
        except Exception:
            continue
        if value is None:
            continue
        try:
            return max(0.0, float(value))
        except ValueError:
            parsed = email.utils.parsedate_to_datetime(str(value))
            if parsed is not None:
                return max(0.0, parsed.timestamp() - time.time())
    return None


def classify_litellm_error(exc: BaseException) -> JudgeCallError:
    """Sort a LiteLLM/OpenAI exception into a retryable or final reason."""
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    message = f"{name}: {str(exc)[:300]}"
    if isinstance(exc, asyncio.TimeoutError | TimeoutError) or "Timeout" in name:
        return JudgeCallError(ERROR_TIMEOUT, message, retryable=True)
    if status == 429 or "RateLimit" in name:
        return JudgeCallError(ERROR_RATE_LIMITED, message, retryable=True, retry_after=_retry_after_seconds(exc))
    if "Connection" in name:
        return JudgeCallError(ERROR_CONNECTION, message, retryable=True)
    if (isinstance(status, int) and status >= 500) or name in {"InternalServerError", "ServiceUnavailableError"}:
        return JudgeCallError(ERROR_SERVER, message, retryable=True)
    if status in (401, 403) or "Authentication" in name or "PermissionDenied" in name:
        return JudgeCallError(ERROR_AUTH, message, retryable=False)
    if isinstance(status, int) and 400 <= status < 500:
        return JudgeCallError(ERROR_BAD_REQUEST, message, retryable=False)
    if name == "APIError":  # LiteLLM wraps unparseable upstream bodies this way
        return JudgeCallError(ERROR_SERVER, message, retryable=True)
    return JudgeCallError(ERROR_CLIENT, message, retryable=False)


class LiteLLMBackend(JudgeBackend):
    """Any LiteLLM model string; OpenAI-compatible servers through OPENAI_BASE_URL / OPENAI_API_BASE."""

    def __init__(self, model: str) -> None:
        self.model_name = model
        self.litellm_model = litellm_model_string(model)
        self._json_mode = True

    async def complete(self, messages: list[dict[str, str]], *, timeout: float) -> JudgeReply:
        litellm = _import_litellm()
        kwargs: dict[str, Any] = {
            "model": self.litellm_model,
            "messages": messages,
            "temperature": 0,
            "timeout": timeout,
            "max_retries": 0,  # retries are ours: one policy, honouring Retry-After, bounded
            "num_retries": 0,
            "drop_params": True,
        }
        if self._json_mode:
            kwargs["response_format"] = {"type": "json_object"}
        try:
            response = await litellm.acompletion(**kwargs)
        except Exception as exc:
            error = classify_litellm_error(exc)
            if self._json_mode and error.kind == ERROR_BAD_REQUEST and "response_format" in str(exc):
                self._json_mode = False  # this provider has no JSON mode: fall back to plain text for good
                return await self.complete(messages, timeout=timeout)
            raise error from exc
        return _reply_from_response(response)


def _reply_from_response(response: Any) -> JudgeReply:
    try:
        text = response.choices[0].message.content
    except (AttributeError, IndexError, KeyError) as exc:
        raise JudgeCallError(ERROR_SERVER, f"response without a message: {exc!r}", retryable=True) from exc
    usage = getattr(response, "usage", None)
    input_tokens = getattr(usage, "prompt_tokens", None)
    output_tokens = getattr(usage, "completion_tokens", None)
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
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
    )


def resolve_backend(model: str | CustomLLMClient | JudgeBackend) -> JudgeBackend:
    if isinstance(model, JudgeBackend):
        return model
    if isinstance(model, CustomLLMClient):
        return CustomClientBackend(model)
    if isinstance(model, str):
        litellm_model_string(model)  # validate early: an empty name is a usage error, not a judge failure
        return LiteLLMBackend(model)
    raise TypeError(f"model must be a model string or a CustomLLMClient, not {type(model).__name__}")


@dataclass(slots=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and full jitter; Retry-After wins when the server sends it."""

    max_retries: int = 3
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, _MAX_RETRY_AFTER_S)
        ceiling = min(self.max_delay_s, self.base_delay_s * (2**attempt))
        return random.uniform(ceiling / 2, ceiling)


async def call_with_retries(
    backend: JudgeBackend,
    messages: list[dict[str, str]],
    *,
    timeout: float,
    policy: RetryPolicy,
) -> tuple[JudgeReply, int]:
    """One judge call with a hard timeout per attempt; returns the reply and the number of attempts made."""
    attempt = 0
    while True:
        attempt += 1
        try:
            reply = await asyncio.wait_for(backend.complete(messages, timeout=timeout), timeout=timeout)
            return reply, attempt
        except TimeoutError as exc:
            error = JudgeCallError(ERROR_TIMEOUT, f"no answer within {timeout:g}s", retryable=True)
            error.__cause__ = exc
        except JudgeCallError as exc:
            error = exc
        if not error.retryable or attempt > policy.max_retries:
            error.attempts = attempt
            raise error
        await asyncio.sleep(policy.delay(attempt - 1, error.retry_after))
