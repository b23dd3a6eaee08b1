"""Every Kafka client the consumer holds is built here, from the settings' bootstrap servers and client options.

One builder, so each client gets the user's options (TLS, SASL, timeouts) the same way, the failed constructor leaves
no thread behind (`construct_client`), and a test or a benchmark swaps the factories in one place."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor

from tracejudge._shared.kafka_options import DECIDED_OPTIONS, construct_client

# How long the first connection to the brokers may take before the command stops with one line (kafka-python's own
# default is 30 s of retries); `--kafka-config bootstrap_timeout_ms=MS` changes it.
BOOTSTRAP_TIMEOUT_MS = 5_000
# After a broker outage clients reconnect within a second, as the Java clients do (kafka-python backs off up to
# 30 s, which kept a consumer idle for half a minute after its broker came back).
RECONNECT_BACKOFF_MAX_MS = 1_000
KAFKA_PYTHON, LIBRDKAFKA = "kafka-python", "librdkafka"  # the producer libraries (`--producer-client`)
CLIENT_DEFAULTS: dict[str, Any] = {
    "bootstrap_timeout_ms": BOOTSTRAP_TIMEOUT_MS,
    "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
}


def known_options() -> set[str]:
    """The client options a user may set (`--kafka-config`): a consumer's or a producer's."""
    return set(KafkaConsumer.DEFAULT_CONFIG) | set(KafkaProducer.DEFAULT_CONFIG)


def consumer_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The user's options a consumer takes, over the defaults."""
    return {**CLIENT_DEFAULTS, **{k: v for k, v in options.items() if k in KafkaConsumer.DEFAULT_CONFIG}}


def producer_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The user's options a producer takes, over the defaults."""
    return {**CLIENT_DEFAULTS, **{k: v for k, v in options.items() if k in KafkaProducer.DEFAULT_CONFIG}}


def admin_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The user's options an admin client takes (its own client id excepted)."""
    config = {k: v for k, v in options.items() if k in KafkaAdminClient.DEFAULT_CONFIG and k != "client_id"}
    return {"reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS, **config}


def _undecided(options: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k not in DECIDED_OPTIONS}


class KafkaClients:
    """Builds consumers, producers and admin clients for one set of brokers and client options.

    Each client takes the tuning its caller passes (`overrides`), then the user's options over it (`--kafka-config`
    decides), then what is not theirs to change: the brokers, the client id, the group, manual commits.

    `consumer_factory`/`producer_factory`/`admin_factory` default to kafka-python's classes; tests pass their own."""

    def __init__(
        self,
        bootstrap_servers: str,
        options: Mapping[str, Any] | None = None,
        *,
        consumer_factory: Callable[..., Any] | None = None,
        producer_factory: Callable[..., Any] | None = None,
        admin_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.options = dict(options or {})
        self._factories = (consumer_factory, producer_factory, admin_factory)

    # kafka-python's classes are looked up when a client is built, not when this is: a test may swap them.
    @property
    def consumer_factory(self) -> Callable[..., Any]:
        return self._factories[0] or KafkaConsumer

    @property
    def producer_factory(self) -> Callable[..., Any]:
        return self._factories[1] or KafkaProducer

    @property
    def admin_factory(self) -> Callable[..., Any]:
        return self._factories[2] or KafkaAdminClient

    @classmethod
    def from_settings(cls, settings: Any, **factories: Callable[..., Any] | None) -> KafkaClients:
        """From the consumer's Settings (`bootstrap_servers`, `kafka_config`)."""
        return cls(settings.bootstrap_servers, settings.kafka_config, **factories)

    def consumer_config(self) -> dict[str, Any]:
        return consumer_options(self.options)

    def producer_config(self) -> dict[str, Any]:
        return producer_options(self.options)

    def _build(self, factory: Callable[..., Any], config: dict[str, Any]) -> Any:
        if isinstance(factory, type) and issubclass(factory, KafkaConsumer | KafkaProducer):
            return construct_client(factory, **config)
        return factory(**config)

    def consumer(self, client_id: str, *, group_id: str | None = None, **overrides: Any) -> Any:
        """A consumer that is assigned partitions by hand (no group join). With `group_id` it commits and reads that
        group's offsets, never joining it."""
        user = _undecided(self.consumer_config())
        config = {
            "auto_offset_reset": "earliest",
            **overrides,
            **user,  # the user's options win over the tuning here, as for every client
            "enable_auto_commit": False,
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": client_id,
            "group_id": group_id,
        }
        return self._build(self.consumer_factory, config)

    def member(self, client_id: str, group_id: str, *, instance_id: str | None = None, **overrides: Any) -> Any:
        """A consumer that joins `group_id` with the cooperative-sticky assignor (partitions move one at a time, the
        rest keep being read); subscribe it afterwards. `instance_id` makes it a static member."""
        config: dict[str, Any] = {
            "partition_assignment_strategy": [CooperativeStickyAssignor],
            "auto_offset_reset": "earliest",
            **overrides,
            **_undecided(self.consumer_config()),
            "enable_auto_commit": False,
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": client_id,
            "group_id": group_id,
        }
        if instance_id:
            config["group_instance_id"] = instance_id
        return self._build(self.consumer_factory, config)

    def producer(self, client_id: str, *, library: str = KAFKA_PYTHON, **overrides: Any) -> Any:
        """A producer; `library` "librdkafka" makes it confluent-kafka's (`rdkafka.RdKafkaProducer`) unless a test
        passed its own factory."""
        config = {
            "acks": "all",
            **overrides,
            **_undecided(self.producer_config()),
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": client_id,
        }
        if library == LIBRDKAFKA and self._factories[1] is None:
            from .rdkafka import RdKafkaProducer

            return RdKafkaProducer(**config)
        return self._build(self.producer_factory, config)

    @contextmanager
    def admin(self, client_id: str = "tracejudge-admin") -> Iterator[Any]:
        """An admin client, closed afterwards."""
        admin = self.admin_factory(
            bootstrap_servers=self.bootstrap_servers, client_id=client_id, **admin_options(self.options)
        )
        try:
            yield admin
        finally:
            admin.close()


def close_now(producer: Any) -> None:
    """Close a producer without waiting for what it holds: its unsent batches fail (their errbacks run, so the owner
    sends them again). kafka-python's `close(timeout=0)` flushes first and raises while anything is in flight,
    leaving the producer, its thread and sockets alive; its sender is force-closed first (Java's `close(0)`)."""
    if callable(getattr(producer, "force_close", None)):  # rdkafka.RdKafkaProducer
        producer.force_close()
        return
    sender = getattr(producer, "_sender", None)
    if sender is not None and hasattr(sender, "force_close"):
        sender.force_close()
        sender.join(5)
    producer.close(timeout=0)
