"""Errors of the consumer service, under the project's one root."""

from __future__ import annotations

from tracejudge.metrics._errors import TracejudgeError


class ConsumerError(TracejudgeError):
    """Something the consumer service raises on purpose."""


class ConfigError(ConsumerError):
    """Invalid configuration: reported in one line, exit code 2, before connecting to anything."""
