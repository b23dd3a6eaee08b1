"""A provider's failure sorted into one of the judges' reasons (ERROR_*), retryable or final, with the server's
Retry-After when it sent one. One classification for every LiteLLM call (the judges' standard and flex calls, the
batch tier, the startup check), so the same provider answer is always counted under the same reason.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import re
import socket
import time
from datetime import UTC
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


def _causes(exc: BaseException) -> list[BaseException]:
    """The exception and what it was raised from or during, outermost first (LiteLLM wraps the OpenAI SDK's error,
    which wraps httpx's, which wraps the socket's)."""
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and all(link is not seen for seen in chain) and len(chain) < 16:
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain


def _no_connection(exc: BaseException) -> bool:
    """Nothing answered: refused, unknown host, unreachable. LiteLLM reports it as InternalServerError "Connection
    error." (a 500 no server sent), so the chain under it is read."""
    for link in _causes(exc):
        name = type(link).__name__
        if "Timeout" in name:
            return False
        if name in ("APIConnectionError", "ConnectError") or isinstance(link, ConnectionError | socket.gaierror):
            return True
    return False


def unsent_request(exc: BaseException) -> str | None:
    """Why the HTTP client could not even send the request, or None: a header value HTTP does not allow (an API key
    with a newline or surrounding whitespace: h11's LocalProtocolError, which LiteLLM reports as "Connection error.")
    or cannot encode (a non-ASCII character: UnicodeEncodeError, reported as a 500). The header itself is never
    repeated: it holds the key."""
    for link in _causes(exc):
        if isinstance(link, UnicodeEncodeError):
            return f"a header holds {link.object[link.start : link.end]!r}, which {link.encoding} cannot encode"
        if type(link).__name__ == "LocalProtocolError":
            return re.split(r"\s+b['\"]", str(link), maxsplit=1)[0].strip() or "a header HTTP does not allow"
    return None


def classify_litellm_error(exc: BaseException) -> JudgeCallError:
    """Sort a LiteLLM/OpenAI exception into a retryable or final reason."""
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    message = f"{name}: {str(exc)[:300]}"
    if isinstance(exc, asyncio.TimeoutError | TimeoutError) or "Timeout" in name:
        return JudgeCallError(ERROR_TIMEOUT, message, retryable=True)
    if _MISSING_CREDENTIALS.search(str(exc)):
        return JudgeCallError(ERROR_AUTH, message, retryable=False)
    unsent = unsent_request(exc)
    if unsent is not None:  # not a connection or server problem: the same request can never be sent
        return JudgeCallError(ERROR_CLIENT, f"{name}: the request was not sent: {unsent}", retryable=False)
    if status == 429 or "RateLimit" in name:
        return JudgeCallError(ERROR_RATE_LIMITED, message, retryable=True, retry_after=_retry_after_seconds(exc))
    if "Connection" in name or _no_connection(exc):
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
