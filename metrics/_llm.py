"""Judge model clients: model strings resolved to LiteLLM, user-supplied clients, retries and hard timeouts.

LiteLLM is imported on the first call, not at import time: it takes seconds to import and applications that only
trace must never pay for it. Nothing here writes the process environment (it is the user's): LiteLLM's switches such
as LITELLM_LOCAL_MODEL_COST_MAP are set, with setdefault, only by the `tracejudge` command's own entry point.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import email.utils
import logging
import math
import random
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from tracejudge._shared.rate_limited_log import RateLimitedLog

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
from .tiers import TIER_FLEX, TIER_STANDARD, is_flex_unavailable, tier_cost

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
    """`input_tokens` counts every prompt token; `cached_input_tokens` (cache reads) and `cache_write_input_tokens`
    (written to the cache, priced higher on Anthropic) are parts of it."""

    text: str
    cost_usd: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    cache_write_input_tokens: int | None = None
    tier: str | None = None  # the service tier that answered (flex falls back to standard for capacity)
    tier_fallbacks: int = 0  # flex requests refused for capacity and made again at the standard tier


# Providers that cache a prompt prefix only up to an explicit `cache_control` breakpoint (Claude on Anthropic, Bedrock,
# Vertex AI, Azure AI Foundry, OpenRouter); OpenAI, Azure OpenAI, Gemini and the like cache a repeated prefix alone.
_BREAKPOINT_PROVIDERS = {"bedrock", "vertex_ai", "azure_ai", "openrouter"}
_EPHEMERAL = {"type": "ephemeral"}


def needs_cache_breakpoint(litellm_model: str) -> bool:
    """Whether this LiteLLM model string names a Claude model whose provider caches only at marked breakpoints."""
    provider, _, name = litellm_model.lower().partition("/")
    if provider == "anthropic":
        return True
    return provider in _BREAKPOINT_PROVIDERS and ("claude" in name or "anthropic" in name)


def with_cache_breakpoint(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leading system message (the static rubric) as one text block marked `cache_control: ephemeral`.

    Anthropic caches the prefix up to and including the marked block; the conversation after it is never marked, so
    each call writes or reads exactly the rubric. LiteLLM carries the block format to Anthropic, Bedrock and Vertex.
    """
    if not messages or messages[0].get("role") != "system" or not isinstance(messages[0].get("content"), str):
        return messages
    block = {"type": "text", "text": messages[0]["content"], "cache_control": dict(_EPHEMERAL)}
    system = {"role": "system", "content": [block]}
    return [system, *messages[1:]]


def litellm_model_string(model: str) -> str:
    """Map the seeds' model names to LiteLLM's: `provider:model` → `provider/model`, bare names are OpenAI."""
    model = model.strip()
    if not model:
        raise ValueError("judge model name is empty")
    if "/" in model:
        return model
    if model.startswith("ft:"):  # an OpenAI fine-tune (`ft:gpt-4o-mini:org::id`), not a provider prefix
        return f"openai/{model}"
    if ":" in model:
        provider, _, name = model.partition(":")
        provider = _PROVIDER_ALIASES.get(provider.lower(), provider.lower())
        return f"{provider}/{name}"
    return f"openai/{model}"


class JudgeBackend(ABC):
    """One judge call, one attempt; failures raise JudgeCallError with a reason. `response_format` is the verdict's
    JSON schema (OpenAI structured-output shape); a backend that cannot pass it on ignores it."""

    model_name: str

    @abstractmethod
    async def complete(
        self, messages: list[dict[str, str]], *, timeout: float, response_format: dict[str, Any] | None = None
    ) -> JudgeReply: ...

    async def warm_up(self) -> None:
        """Made ready before the first attempt, outside its timeout and off the event loop (a slow import)."""
        return None

    @contextlib.asynccontextmanager
    async def slot(self, *, wait_s: float | None = None) -> AsyncIterator[None]:
        """Entered around each attempt, outside its timeout: a backend may make an attempt wait here for its turn
        (at most `wait_s`, then the attempt goes ahead anyway)."""
        yield


class CustomClientBackend(JudgeBackend):
    def __init__(self, client: CustomLLMClient) -> None:
        self.client = client
        self.model_name = client.get_model_name()

    async def complete(
        self, messages: list[dict[str, str]], *, timeout: float, response_format: dict[str, Any] | None = None
    ) -> JudgeReply:
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


_LITELLM_IMPORTED = threading.Event()


def _import_litellm() -> Any:
    import litellm

    litellm.suppress_debug_info = True
    _LITELLM_IMPORTED.set()
    return litellm


def _retry_after_seconds(exc: BaseException) -> float | None:
    """Read Retry-After (seconds or HTTP date) from whatever headers LiteLLM kept on the exception; a value that is
    neither (`soon`) is None, so the default backoff applies rather than the error escaping the classification."""
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
        seconds = _parse_retry_after(str(value))
        if seconds is not None:
            return seconds
    return None


def _parse_retry_after(value: str) -> float | None:
    try:
        seconds = float(value)
    except ValueError:
        try:
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if parsed is None:
            return None
        if parsed.tzinfo is None:  # RFC 9110 dates are GMT; "-0000" parses naive
            parsed = parsed.replace(tzinfo=UTC)
        seconds = parsed.timestamp() - time.time()
    return max(0.0, seconds) if math.isfinite(seconds) else None


# LiteLLM refuses locally, before any request, when no key is configured (OPENAI_BASE_URL set, OPENAI_API_KEY not),
# and reports it as a 500: it is a credentials problem no retry can fix.
_MISSING_CREDENTIALS = re.compile(
    r"missing credentials|api_key client option must be set|no api key provided|api key (?:is )?(?:not set|missing)",
    re.IGNORECASE,
)


def classify_litellm_error(exc: BaseException) -> JudgeCallError:
    """Sort a LiteLLM/OpenAI exception into a retryable or final reason."""
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    message = f"{name}: {str(exc)[:300]}"
    if isinstance(exc, asyncio.TimeoutError | TimeoutError) or "Timeout" in name:
        return JudgeCallError(ERROR_TIMEOUT, message, retryable=True)
    if _MISSING_CREDENTIALS.search(str(exc)):
        return JudgeCallError(ERROR_AUTH, message, retryable=False)
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


PROVIDERS_URL = "https://docs.litellm.ai/docs/providers"


def judge_model_problem(model: str) -> str | None:
    """Why LiteLLM cannot route this model string (an unknown provider prefix), or None; imports LiteLLM."""
    try:
        litellm_model = litellm_model_string(model)
    except ValueError as exc:
        return str(exc)
    provider = litellm_model.partition("/")[0]
    known = {getattr(p, "value", p) for p in _import_litellm().provider_list}
    if provider in known:
        return None
    return f"unknown provider {provider!r} in judge model {model!r}: LiteLLM's providers are listed at {PROVIDERS_URL}"


# The startup check's request: a few tokens, no rubric (the local test judge answers it as a check).
JUDGE_CHECK_PROMPT = "tracejudge judge check: reply with the word OK."


def check_judge_model(model: str, *, timeout: float) -> None:
    """One cheap synchronous call to the judge; raises JudgeCallError (reason, provider's message) if it cannot
    answer. Synchronous on purpose: LiteLLM caches async clients, and one bound to a throwaway event loop must not
    be handed to the judges' loop later."""
    litellm = _import_litellm()
    try:
        litellm.completion(
            model=litellm_model_string(model),
            messages=[{"role": "user", "content": JUDGE_CHECK_PROMPT}],
            temperature=0,
            max_tokens=8,
            timeout=timeout,
            max_retries=0,
            num_retries=0,
            drop_params=True,
        )
    except Exception as exc:
        raise classify_litellm_error(exc) from exc


_FLEX_LOG = logging.getLogger("tracejudge.metrics.tiers")
FLEX_FALLBACK_LOG = RateLimitedLog(_FLEX_LOG, interval_s=60.0)


class LiteLLMBackend(JudgeBackend):
    """Any LiteLLM model string; OpenAI-compatible servers through OPENAI_BASE_URL / OPENAI_API_BASE.

    `tier="flex"` sends `service_tier="flex"` (half price, slower) and prices the answer at the map's flex prices;
    a "no flex capacity" refusal is made again at the standard tier at once (counted in the reply)."""

    def __init__(self, model: str, *, tier: str = TIER_STANDARD) -> None:
        self.model_name = model
        self.litellm_model = litellm_model_string(model)
        self._cache_breakpoint = needs_cache_breakpoint(self.litellm_model)
        self.tier = tier

    async def warm_up(self) -> None:
        """LiteLLM's import takes seconds: on the event loop it would stall every judgement and fire their timeouts,
        inside an attempt it would time the attempt out. Done once, on a worker thread."""
        if not _LITELLM_IMPORTED.is_set():
            await asyncio.to_thread(_import_litellm)

    @contextlib.asynccontextmanager
    async def slot(self, *, wait_s: float | None = None) -> AsyncIterator[None]:
        """While the model's response mode is unproven one attempt probes it and the others wait here, outside
        their timeouts, so a slow first answer does not time out the calls queued behind it. The wait is bounded
        by `wait_s`: a probe that never ends (its loop gone, a hang past every timeout) cannot stall the rest."""
        _, probing = await RESPONSE_MODES.acquire(self.litellm_model, wait_s=wait_s)
        token = _IN_SLOT.set(self.litellm_model)
        try:
            yield
        finally:
            _IN_SLOT.reset(token)
            if probing:
                RESPONSE_MODES.release(self.litellm_model)

    async def complete(
        self, messages: list[dict[str, str]], *, timeout: float, response_format: dict[str, Any] | None = None
    ) -> JudgeReply:
        litellm = _import_litellm()
        kwargs: dict[str, Any] = {
            "model": self.litellm_model,
            "messages": with_cache_breakpoint(messages) if self._cache_breakpoint else messages,
            "temperature": 0,
            "timeout": timeout,
            "max_retries": 0,  # retries are ours: one policy, honouring Retry-After, bounded
            "num_retries": 0,
            "drop_params": True,
        }
        if response_format is None:
            return await self._tiered_call(litellm, kwargs)
        if _IN_SLOT.get() == self.litellm_model:  # the attempt's slot has waited its turn (and releases a probe)
            mode, probing = RESPONSE_MODES.candidate(self.litellm_model), False
        else:
            mode, probing = await RESPONSE_MODES.acquire(self.litellm_model, wait_s=2 * timeout)
        try:
            while True:
                if mode == MODE_JSON_SCHEMA:
                    kwargs["response_format"] = response_format
                elif mode == MODE_JSON_OBJECT:
                    kwargs["response_format"] = {"type": "json_object"}
                else:
                    kwargs.pop("response_format", None)
                try:
                    reply = await self._tiered_call(litellm, kwargs, rejectable=mode != MODE_TEXT)
                except _FormatRejected:
                    mode = RESPONSE_MODES.rejected(self.litellm_model, mode)
                    continue
                RESPONSE_MODES.learnt(self.litellm_model, mode)
                return reply
        finally:
            if probing:
                RESPONSE_MODES.release(self.litellm_model)

    async def _tiered_call(self, litellm: Any, kwargs: dict[str, Any], *, rejectable: bool = False) -> JudgeReply:
        """At the flex tier: `service_tier="flex"`, and on the provider's capacity refusal the same call at once at
        the standard tier; the reply is priced at the tier that answered."""
        if self.tier != TIER_FLEX:
            reply = await self._call(litellm, kwargs, rejectable=rejectable)
            reply.tier = TIER_STANDARD
            return reply
        try:
            reply = await self._call(litellm, {**kwargs, "service_tier": TIER_FLEX}, rejectable=rejectable, flex=True)
        except _FlexUnavailable as exc:
            FLEX_FALLBACK_LOG.warning(
                "judge %s: no flex capacity (%s); judged at the standard tier (full price) instead. Counted in "
                "tracejudge_judge_tier_fallbacks_total; frequent fallbacks: try --judge-tier batch",
                self.model_name,
                str(exc.__cause__)[:160],
            )
            box = TIER_FALLBACKS.get()
            if box is not None:  # counted whatever the standard call then gives (an error included)
                box[0] += 1
            reply = await self._call(litellm, kwargs, rejectable=rejectable)
            reply.tier, reply.tier_fallbacks = TIER_STANDARD, 1
            return reply
        reply.tier = TIER_FLEX
        priced = tier_cost(
            self.litellm_model,
            TIER_FLEX,
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            cached_input_tokens=reply.cached_input_tokens,
            cache_write_input_tokens=reply.cache_write_input_tokens,
        )
        if priced is not None:
            reply.cost_usd = priced
        return reply

    @staticmethod
    async def _call(
        litellm: Any, kwargs: dict[str, Any], *, rejectable: bool = False, flex: bool = False
    ) -> JudgeReply:
        try:
            response = await litellm.acompletion(**kwargs)
        except Exception as exc:
            if flex and is_flex_unavailable(exc):
                raise _FlexUnavailable from exc
            error = classify_litellm_error(exc)
            if rejectable and rejects_response_format(exc, error):
                raise _FormatRejected from exc
            raise error from exc
        return _reply_from_response(response)


# How the verdict is asked for, best first: structured output bound to the labels, JSON mode, plain text.
MODE_JSON_SCHEMA = "json_schema"
MODE_JSON_OBJECT = "json_object"
MODE_TEXT = "text"
RESPONSE_MODES_ORDER = (MODE_JSON_SCHEMA, MODE_JSON_OBJECT, MODE_TEXT)
_FORMAT_WORDS = re.compile(r"response_format|json_schema|json_object|structured output|response_schema", re.IGNORECASE)


class _FormatRejected(Exception):
    """The provider refused the requested response_format (not the request as a whole)."""


class _FlexUnavailable(Exception):
    """The provider has no flex capacity for this request now (not charged): made again at the standard tier."""


def rejects_response_format(exc: BaseException, error: JudgeCallError) -> bool:
    """A 4xx that names the response format, or LiteLLM's UnsupportedParamsError: the model cannot do this mode."""
    if type(exc).__name__ == "UnsupportedParamsError":
        return True
    return error.kind == ERROR_BAD_REQUEST and bool(_FORMAT_WORDS.search(str(exc)))


class ResponseModes:
    """Per process and model string: which response mode works, learnt from the first rejection.

    While a model's mode is unproven only one call probes it and the others wait (any thread, any event loop), so
    a model that rejects the schema costs one rejected call per process, not one per judgement."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._learnt: dict[str, str] = {}
        self._next: dict[str, str] = {}
        self._probing: set[str] = set()

    def mode(self, model: str) -> str | None:
        with self._lock:
            return self._learnt.get(model)

    def candidate(self, model: str) -> str:
        """The mode to try now: the learnt one, else the next one down after the rejections so far."""
        with self._lock:
            return self._learnt.get(model) or self._next.get(model, MODE_JSON_SCHEMA)

    async def acquire(self, model: str, *, wait_s: float | None = None) -> tuple[str, bool]:
        """The mode to use and whether this caller is the prober (it must call `release`). After `wait_s` of
        waiting for another prober, the current candidate without probing (None: wait as long as it takes)."""
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            with self._lock:
                learnt = self._learnt.get(model)
                if learnt is not None:
                    return learnt, False
                if model not in self._probing:
                    self._probing.add(model)
                    return self._next.get(model, MODE_JSON_SCHEMA), True
                if deadline is not None and time.monotonic() >= deadline:
                    return self._next.get(model, MODE_JSON_SCHEMA), False
            await asyncio.sleep(0.02)

    def rejected(self, model: str, mode: str) -> str:
        """`mode` was refused: the next one down is tried (and is what later calls start from)."""
        fallback = RESPONSE_MODES_ORDER[min(RESPONSE_MODES_ORDER.index(mode) + 1, len(RESPONSE_MODES_ORDER) - 1)]
        with self._lock:
            if self._learnt.get(model) == mode:
                del self._learnt[model]
            self._next[model] = fallback
        return fallback

    def learnt(self, model: str, mode: str) -> None:
        with self._lock:
            self._learnt[model] = mode

    def release(self, model: str) -> None:
        with self._lock:
            self._probing.discard(model)

    def forget(self) -> None:
        """Start over (tests, or after switching a model's provider)."""
        with self._lock:
            self._learnt.clear()
            self._next.clear()
            self._probing.clear()


RESPONSE_MODES = ResponseModes()
# Flex calls made again at the standard tier during one judgement (a one-item list set by the metric's evaluate;
# mutable, so the tasks asyncio.wait_for starts, which copy the context, count into the same box).
TIER_FALLBACKS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "tracejudge_tier_fallbacks", default=None
)
# The model whose slot the current attempt is in (set by `LiteLLMBackend.slot`, read by `complete`).
_IN_SLOT: contextvars.ContextVar[str | None] = contextvars.ContextVar("tracejudge_in_slot", default=None)


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
    """Bounded retries with exponential backoff and equal jitter; Retry-After wins when the server sends it.

    Equal jitter (a random delay between half the exponential ceiling and the ceiling), not full jitter: callers are
    spread out, yet no retry comes sooner than half the backoff, which keeps pressure off a judge that is rate-limiting.
    """

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
    response_format: dict[str, Any] | None = None,
) -> tuple[JudgeReply, int]:
    """One judge call with a hard timeout per attempt; returns the reply and the number of attempts made."""
    await backend.warm_up()
    attempt = 0
    while True:
        attempt += 1
        try:
            # Waiting for a turn (the response-mode probe) is not part of the attempt's timeout, and is bounded.
            turn = backend.slot(wait_s=2 * timeout) if response_format is not None else contextlib.nullcontext()
            async with turn:
                call = backend.complete(messages, timeout=timeout, response_format=response_format)
                reply = await asyncio.wait_for(call, timeout=timeout)
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
