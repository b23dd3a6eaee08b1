"""One judge call made with bounded retries and a hard timeout per attempt, whatever the backend: the one retry
policy (exponential backoff with equal jitter, the server's Retry-After honoured up to a cap) so that no backend or
library below it retries on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass
from typing import Any

from ._backends import JudgeBackend
from ._client import JudgeReply
from ._errors import JudgeCallError
from ._results import ERROR_TIMEOUT

_MAX_RETRY_AFTER_S = 60.0


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
