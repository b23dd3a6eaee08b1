"""Warnings of the tracer, said to the developer of a traced application (never raised into it)."""

from __future__ import annotations

__all__ = ["TracedAgentWarning"]


class TracedAgentWarning(UserWarning):
    """`@traced_agent` could not tell, from the decorated function's signature, where the conversation id or the
    user's message is: said once, at decoration time, with what each call will record instead and how to fix it."""
