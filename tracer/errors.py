"""The root of every error tracejudge raises on purpose; the tracer, the judges and the consumer all derive from it."""

from __future__ import annotations

__all__ = ["TracedAgentWarning", "TracejudgeError"]


class TracejudgeError(Exception):
    """Base class: catch this to catch anything tracejudge raises deliberately."""


class TracedAgentWarning(UserWarning):
    """`@traced_agent` could not tell, from the decorated function's signature, where the conversation id or the
    user's message is: said once, at decoration time, with what each call will record instead and how to fix it."""
