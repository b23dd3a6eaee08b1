"""Reaching the brokers: a client's construction (it connects there) turned into one clear error.

kafka-python logs every failed bootstrap attempt and raises a bare timeout; an operator needs one line saying whether
the brokers did not answer (KafkaUnreachable, exit 69) or answered and refused us (KafkaRefused, exit 77: TLS
certificate not trusted, SASL login refused). kafka-python 3.0 exposes the reason of a failed connection only in its
log lines, so `_ConnectionFailures` reads them: a work-around of the client (not of any broker) that a client with
typed connection errors would replace.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .._errors import EXIT_NOPERM, KafkaUnreachable, StartupError
from .._logging import quiet_kafka_connections

__all__ = ["KafkaRefused", "reaching_kafka"]


class KafkaRefused(StartupError):
    """The brokers answered but the connection was refused: their TLS certificate is not trusted, or the SASL login
    failed."""

    exit_code = EXIT_NOPERM


class _ConnectionFailures(logging.Handler):
    """Keeps the last reason kafka-python gave for a failed bootstrap connection (its lines are dropped meanwhile)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "Bootstrap connection to" in message and " failed: " in message:
            self.reasons.append(message.split(" failed: ", 1)[1].split(" (backoff", 1)[0])
        elif record.name.startswith("kafka.net.sasl"):
            self.reasons.append("sasl")


def _refusal(failures: _ConnectionFailures, config: dict[str, Any]) -> str | None:
    """What the failed bootstrap attempts say, when it is the brokers refusing us rather than not answering."""
    reasons = failures.reasons
    tls = next((r for r in reversed(reasons) if "Handshake failed" in r or "CERTIFICATE" in r or "SSL" in r), None)
    if tls is not None:
        return (
            f"the TLS handshake failed ({tls.removeprefix('KafkaConnectionError: ')}): check ssl_cafile (the CA that "
            "signed the brokers' certificate) and ssl_check_hostname"
        )
    protocol = str(config.get("security_protocol", "PLAINTEXT"))
    answered = [r for r in reasons if "ECONNREFUSED" not in r and "timed out" not in r.lower()]
    if protocol.startswith("SASL") and answered:
        return (
            f"the brokers refused the SASL login ({config.get('sasl_mechanism')} as "
            f"{config.get('sasl_plain_username')!r}): check sasl_mechanism, sasl_plain_username and sasl_plain_password"
        )
    return None


@contextmanager
def reaching_kafka(bootstrap_servers: str, config: dict[str, Any] | None = None) -> Iterator[None]:
    """Around a Kafka client's construction (it connects there): kafka-python's retry lines are dropped, and a
    broker that does not answer within `bootstrap_timeout_ms` becomes one KafkaUnreachable saying what to check (one
    that refuses our TLS or SASL login, one KafkaRefused saying which)."""
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError, MetadataEmptyBrokerList, NodeNotReadyError

    timeout_ms = (config or {}).get("bootstrap_timeout_ms")
    within = f" within {int(timeout_ms) / 1000:g} s" if timeout_ms else ""
    failures = _ConnectionFailures()
    kafka_logger = logging.getLogger("kafka")
    kafka_logger.addHandler(failures)
    with quiet_kafka_connections():
        try:
            yield
        except (KafkaTimeoutError, KafkaConnectionError, MetadataEmptyBrokerList, NodeNotReadyError) as exc:
            refusal = _refusal(failures, config or {})
            if refusal is not None:
                raise KafkaRefused(f"cannot connect to Kafka at {bootstrap_servers}: {refusal}") from None
            raise KafkaUnreachable(
                f"cannot reach Kafka at {bootstrap_servers}{within} ({type(exc).__name__}): check "
                "--bootstrap-servers / TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS and that the brokers are up "
                "(wait longer with --kafka-config bootstrap_timeout_ms=MS)"
            ) from None
        finally:
            kafka_logger.removeHandler(failures)
