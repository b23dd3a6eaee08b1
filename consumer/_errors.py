"""Errors of the consumer service, under the project's one root."""

from __future__ import annotations

from tracejudge._shared.errors import TracejudgeError

EXIT_USAGE = 2  # invalid configuration: one line on stderr (the commands, and StartupErrors the user can fix)
EXIT_UNAVAILABLE = 69  # sysexits' EX_UNAVAILABLE: a service the command needs (Kafka) did not answer
EXIT_NOPERM = 77  # sysexits' EX_NOPERM: Kafka answered and refused us (TLS, SASL, ACLs)


class ConsumerError(TracejudgeError):
    """Something the consumer service raises on purpose."""


class StartupError(ConsumerError):
    """The command cannot start for a reason the user can fix: the CLI prints it as one line and exits `exit_code`."""

    exit_code = 1


class KafkaUnreachable(StartupError):
    """The brokers did not answer: at the first connection, or while a topic was read to its end."""

    exit_code = EXIT_UNAVAILABLE
