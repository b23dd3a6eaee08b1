"""Errors of the consumer service, under the project's one root."""

from __future__ import annotations

from tracejudge._shared.errors import TracejudgeError

EXIT_USAGE = 2  # invalid configuration: one line on stderr (the commands, and StartupErrors the user can fix)


class ConsumerError(TracejudgeError):
    """Something the consumer service raises on purpose."""


class StartupError(ConsumerError):
    """The command cannot start for a reason the user can fix: the CLI prints it as one line and exits `exit_code`."""

    exit_code = 1
