"""The judge backends: one judge call, one attempt, behind one interface (`JudgeBackend`), for a user's client or a
LiteLLM model string (at the standard or the flex tier); `resolve_backend` picks one for what a metric was given.
Retries are not here (`_retries`): a backend makes exactly the attempt it is asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import Any

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ._client import CustomLLMClient, JudgeReply
from ._errors import JudgeCallError
from ._litellm import (
    _LITELLM_IMPORTED,
    _import_litellm,
    litellm_model_string,
    needs_cache_breakpoint,
    with_cache_breakpoint,
)
from ._provider_errors import classify_litellm_error
from ._response_modes import MODE_JSON_OBJECT, MODE_JSON_SCHEMA, MODE_TEXT, RESPONSE_MODES, rejects_response_format
from ._results import ERROR_CLIENT, ERROR_CONNECTION, ERROR_TIMEOUT
from ._usage import _reply_from_response
from .tiers import TIER_FLEX, TIER_STANDARD, is_flex_unavailable, tier_cost


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


_FLEX_LOG = logging.getLogger("tracejudge.metrics.tiers")
FLEX_FALLBACK_LOG = RateLimitedLog(_FLEX_LOG, interval_s=60.0)


class _FormatRejected(Exception):
    """The provider refused the requested response_format (not the request as a whole)."""


class _FlexUnavailable(Exception):
    """The provider has no flex capacity for this request now (not charged): made again at the standard tier."""


# Flex calls made again at the standard tier during one judgement (a one-item list set by the metric's evaluate;
# mutable, so the tasks asyncio.wait_for starts, which copy the context, count into the same box).
TIER_FALLBACKS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "tracejudge_tier_fallbacks", default=None
)
# The model whose slot the current attempt is in (set by `LiteLLMBackend.slot`, read by `complete`).
_IN_SLOT: contextvars.ContextVar[str | None] = contextvars.ContextVar("tracejudge_in_slot", default=None)


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


def resolve_backend(model: str | CustomLLMClient | JudgeBackend) -> JudgeBackend:
    if isinstance(model, JudgeBackend):
        return model
    if isinstance(model, CustomLLMClient):
        return CustomClientBackend(model)
    if isinstance(model, str):
        litellm_model_string(model)  # validate early: an empty name is a usage error, not a judge failure
        return LiteLLMBackend(model)
    raise TypeError(f"model must be a model string or a CustomLLMClient, not {type(model).__name__}")
