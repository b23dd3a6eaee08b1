"""Kafka client options checked before any connection, so a wrong setting is one clear error, not a hang later."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

SECURITY_PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})
SASL_MECHANISMS = frozenset({"PLAIN", "GSSAPI", "OAUTHBEARER", "SCRAM-SHA-256", "SCRAM-SHA-512"})
_SSL_FILES = ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_crlfile")


# Options tracejudge decides for every client, whatever `--kafka-config` says (Settings refuses them there, naming the
# flag to use): where the internal topics are read from (every completed conversation is judged), the durability of
# the state and verdicts it writes (acks), its commits, groups and members.
DECIDED_OPTIONS: dict[str, str] = {
    "auto_offset_reset": "use --start-from (the internal topics are always read from their beginning)",
    "enable_auto_commit": "tracejudge commits only what its outputs acknowledged",
    "group_id": "use --group-id",
    "group_instance_id": "use --group-instance-id",
    "acks": "tracejudge writes its state and verdicts with acks=all",
}


def check_kafka_options(options: Mapping[str, Any], known: Iterable[str]) -> None:
    """Raise ValueError naming the first problem: an unknown option, a bad protocol or mechanism, missing files."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"unknown Kafka client option(s): {', '.join(unknown)}")
    protocol = str(options.get("security_protocol", "PLAINTEXT"))
    if protocol not in SECURITY_PROTOCOLS:
        raise ValueError(f"security_protocol {protocol!r} is not one of {', '.join(sorted(SECURITY_PROTOCOLS))}")
    mechanism = options.get("sasl_mechanism")
    if protocol.startswith("SASL_"):
        if mechanism is None:
            raise ValueError(f"security_protocol {protocol} needs sasl_mechanism")
        if mechanism not in SASL_MECHANISMS:
            raise ValueError(f"sasl_mechanism {mechanism!r} is not one of {', '.join(sorted(SASL_MECHANISMS))}")
        if mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and not (
            options.get("sasl_plain_username") and options.get("sasl_plain_password")
        ):
            raise ValueError(f"sasl_mechanism {mechanism} needs sasl_plain_username and sasl_plain_password")
    for name in _SSL_FILES:
        path = options.get(name)
        if path is not None and not os.path.isfile(str(path)):
            raise ValueError(f"{name} {path!r} is not a readable file")


def construct_client(factory: Any, **config: Any) -> Any:
    """`factory(**config)` (KafkaConsumer, KafkaProducer) that leaves no thread behind when it raises.

    kafka-python 3.0 starts a client's IO thread in the constructor, then bootstraps; when no broker answers the
    constructor raises and the started thread runs on, with no object to close (a process retrying through an outage
    gained one thread and its sockets per try). The client the constructor made is kept here and closed on failure.
    `factory` must take kafka-python's `kafka_client` option (KafkaConsumer and KafkaProducer do)."""
    base: Any = config.get("kafka_client")
    if base is None:
        try:
            from kafka.net.compat import KafkaNetClient

            base = KafkaNetClient
        except ImportError:  # another kafka-python layout: nothing to keep
            return factory(**config)
    made: list[Any] = []

    def client(*args: Any, **kwargs: Any) -> Any:
        made.append(base(*args, **kwargs))
        return made[-1]

    try:
        return factory(**{**config, "kafka_client": client})
    except BaseException:
        for each in made:
            try:
                each.close()
            except Exception:
                pass
        raise
