"""A logger that cannot flood: the first occurrence, then at most one line per interval with a suppressed count.

Shared: the tracer logs its own trouble through it, the judges their failures, the consumer per-record trouble.
"""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["RateLimitedLog"]


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
