"""Guards that keep tracing from ever hurting the traced application."""

from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger("tracejudge.tracer")


class RateLimitedLog:
    """Log the first occurrence, then at most once per interval with how many were suppressed meanwhile."""

    def __init__(self, log: logging.Logger, interval_s: float = 30.0) -> None:
        self._log = log
        self._interval_s = interval_s
        self._last = -float("inf")
        self._suppressed = 0
        self._lock = threading.Lock()

    def warning(self, message: str, *args: object, exc_info: bool = False) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last < self._interval_s:
                self._suppressed += 1
                return
            suppressed, self._suppressed, self._last = self._suppressed, 0, now
        if suppressed:
            message += f" ({suppressed} similar messages suppressed)"
        self._log.warning(message, *args, exc_info=exc_info)


_internal_errors = RateLimitedLog(logger, interval_s=60.0)


def report_internal_error() -> None:
    """Log the exception being handled (rate-limited); tracing carries on and the application never sees it."""
    _internal_errors.warning("internal tracejudge error (tracing continues)", exc_info=True)


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
