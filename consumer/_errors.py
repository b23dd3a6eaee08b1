"""Errors of the consumer service, under the project's one root."""

from __future__ import annotations

from tracejudge._shared.errors import TracejudgeError


class ConsumerError(TracejudgeError):
    """Something the consumer service raises on purpose."""
