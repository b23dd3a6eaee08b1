"""The root of every error tracejudge raises on purpose; the judges and the consumer derive from it."""

from __future__ import annotations

__all__ = ["TracejudgeError"]


class TracejudgeError(Exception):
    """Base class: catch this to catch anything tracejudge raises deliberately."""
