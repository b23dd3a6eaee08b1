"""Guards that keep tracing from ever hurting the traced application."""

from __future__ import annotations

import logging

from tracejudge._shared.rate_limited_log import RateLimitedLog

logger = logging.getLogger("tracejudge.tracer")


_internal_errors = RateLimitedLog(logger, interval_s=60.0)
_misuse: dict[str, RateLimitedLog] = {}  # one per kind of misuse (a few, fixed in the code): one cannot hide another


def report_internal_error() -> None:
    """Log the exception being handled (rate-limited); tracing carries on and the application never sees it."""
    _internal_errors.warning("internal tracejudge error (tracing continues)", exc_info=True)


def report_misuse(kind: str, message: str) -> None:
    """A call tracing cannot honour (say what was done instead and how to fix it): heard, rate-limited, never raised."""
    log = _misuse.get(kind) or _misuse.setdefault(kind, RateLimitedLog(logger, interval_s=60.0))
    log.warning("tracejudge: %s", message)


class handle_internal_errors:
    """Swallow and log any bug of ours inside the block (a class, not @contextmanager: this is the hot path)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc_type is None or not issubclass(exc_type, Exception):
            return False
        report_internal_error()
        return True
