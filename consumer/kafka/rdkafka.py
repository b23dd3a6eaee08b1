"""A librdkafka producer (confluent-kafka) behind kafka-python's producer interface, for the stream thread's writes.

Why: kafka-python builds its batches, compresses and sends them in Python, on a sender thread that competes with the
stream thread for the interpreter lock; librdkafka does all of that in C threads, outside it. The stream thread's
producer (repartition, changelog, judge queue: every record read costs one or more writes) is where the consumer
spends that time (docs/benchmarks.md). `--producer-client librdkafka` chooses it; kafka-python stays the default.

`RdKafkaProducer` answers what the record collector asks of kafka-python's producer: `send` (a future with
`add_callback`/`add_errback`), `flush` (KafkaTimeoutError when unanswered in time), `close`, `force_close` (what is
held fails, Java's `close(0)`), plus `serve`: librdkafka answers a send only inside `poll`/`flush`, on the caller's
thread, so the record collector calls `serve` once a round and the answers come on the stream thread itself.

The user's `--kafka-config` options are kafka-python's names; `rdkafka_config` translates those librdkafka has and
refuses, in one line, those it has not (an object such as an SSL context, a kafka-python-only knob).
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from kafka.errors import KafkaError, KafkaTimeoutError

# kafka-python option -> librdkafka property (a callable converts the value).
_RENAMED: dict[str, str | tuple[str, Callable[[Any], Any]]] = {
    "bootstrap_servers": "bootstrap.servers",
    "client_id": "client.id",
    "acks": ("acks", lambda v: "all" if v in ("all", -1, "-1") else str(v)),
    "linger_ms": "linger.ms",
    "batch_size": "batch.size",
    "compression_type": ("compression.type", lambda v: "none" if v is None else str(v)),
    "enable_idempotence": "enable.idempotence",
    "delivery_timeout_ms": "delivery.timeout.ms",
    "max_in_flight_requests_per_connection": "max.in.flight.requests.per.connection",
    "max_request_size": "message.max.bytes",
    "receive_message_max_bytes": "receive.message.max.bytes",
    "allow_auto_create_topics": "allow.auto.create.topics",
    "client_dns_lookup": "client.dns.lookup",
    "request_timeout_ms": "request.timeout.ms",
    "retries": ("message.send.max.retries", lambda v: int(min(float(v), 2_147_483_647))),
    "retry_backoff_ms": "retry.backoff.ms",
    "reconnect_backoff_ms": "reconnect.backoff.ms",
    "reconnect_backoff_max_ms": "reconnect.backoff.max.ms",
    "metadata_max_age_ms": "metadata.max.age.ms",
    "connections_max_idle_ms": "connections.max.idle.ms",
    "send_buffer_bytes": "socket.send.buffer.bytes",
    "receive_buffer_bytes": "socket.receive.buffer.bytes",
    "buffer_memory": ("queue.buffering.max.kbytes", lambda v: max(1, int(v) // 1024)),
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password",
    "sasl_kerberos_service_name": "sasl.kerberos.service.name",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
    "ssl_password": "ssl.key.password",
    "ssl_crlfile": "ssl.crl.location",
    "ssl_ciphers": "ssl.cipher.suites",
    "ssl_check_hostname": ("ssl.endpoint.identification.algorithm", lambda v: "https" if v else "none"),
}
# kafka-python options that have no meaning for librdkafka: it negotiates API versions itself, connects lazily (the
# command's first connection is still made, and checked, by its kafka-python consumers) and blocks in our `send`.
_IGNORED = frozenset({"api_version", "bootstrap_timeout_ms", "max_block_ms"})
# As kafka-python 3.0 does by default: sends answered within 120 s, records of up to 1 MiB, a keyed record on
# murmur2(key) (the Java client's partitioner; librdkafka's own default is CRC32), idempotent where the options allow.
DEFAULTS: dict[str, Any] = {
    "delivery.timeout.ms": 120_000,
    "message.max.bytes": 1_048_576,
    "partitioner": "murmur2_random",
}
MAX_BLOCK_MS = 60_000  # kafka-python's max_block_ms: how long a send waits for room in a full queue


def rdkafka_config(options: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka's properties for kafka-python's producer options; ValueError naming the first one without an
    equivalent."""
    config = dict(DEFAULTS)
    if options.get("sasl_mechanism") == "GSSAPI":  # confluent-kafka's wheels are built without Kerberos
        raise ValueError("sasl_mechanism GSSAPI is not in confluent-kafka's wheels: use --producer-client kafka-python")
    for name, value in options.items():
        if name in _IGNORED:
            continue
        target = _RENAMED.get(name)
        if target is None:
            raise ValueError(
                f"Kafka option {name} has no librdkafka equivalent: leave it out or use --producer-client kafka-python"
            )
        if isinstance(target, tuple):
            key, convert = target
            config[key] = convert(value)
        else:
            config[target] = value
    if "enable_idempotence" not in options:  # kafka-python 3.0 turns it off where the options forbid it
        retries, in_flight = options.get("retries", 1), options.get("max_in_flight_requests_per_connection", 5)
        config["enable.idempotence"] = config.get("acks", "all") == "all" and retries != 0 and in_flight <= 5
    if "reconnect.backoff.ms" in config:  # librdkafka refuses a maximum below the first backoff
        config["reconnect.backoff.max.ms"] = max(
            config["reconnect.backoff.ms"], config.get("reconnect.backoff.max.ms", 0)
        )
    return config


def check_config(options: Mapping[str, Any]) -> None:
    """ValueError in one line for the options librdkafka refuses (its own checks: values, combinations), found by
    building a producer that connects nowhere."""
    from confluent_kafka import KafkaException, Producer

    config = rdkafka_config(options)
    try:
        Producer({**config, "bootstrap.servers": ""}, logger=_LOGGER)
    except (KafkaException, ValueError, TypeError) as exc:
        raise ValueError(f"librdkafka refuses the Kafka options: {exc}") from None


def confluent_kafka_version() -> str:
    """confluent-kafka's own version: `version()` is a string now, a (string, number) pair in older releases."""
    import confluent_kafka

    version = confluent_kafka.version()
    return str(version[0] if isinstance(version, tuple) else version)


def librdkafka_version() -> str:
    """librdkafka's and confluent-kafka's versions, for the start's log line."""
    import confluent_kafka

    return f"{confluent_kafka.libversion()[0]} (confluent-kafka {confluent_kafka_version()})"


class _OncePerMinute(logging.Filter):
    """librdkafka's log lines (`fac` and text), each distinct one let through at most once a minute."""

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key, now = _DIGITS.sub("", record.getMessage()), time.monotonic()  # "after 3ms", "2 identical errors"
        if now - self._last.get(key, -math.inf) < 60.0:
            return False
        if len(self._last) > 1000:
            self._last.clear()
        self._last[key] = now
        return True


_DIGITS = re.compile(r"\d+")
_LOGGER = logging.getLogger("tracejudge.consumer.kafka.librdkafka")
_LOGGER.addFilter(_OncePerMinute())


class Sent:
    """One send's answer, as kafka-python's future: callbacks get the record's metadata (`offset`), errbacks the
    error. Answered on the thread that called `serve`/`flush`."""

    __slots__ = ("_callbacks", "_errbacks", "exception", "offset")

    def __init__(self) -> None:
        self._callbacks: list[Callable[[Any], Any]] = []
        self._errbacks: list[Callable[[BaseException], Any]] = []
        self.offset: int | None = None
        self.exception: BaseException | None = None

    def add_callback(self, fn: Callable[[Any], Any]) -> Sent:
        """Called at once if the send was answered already (as kafka-python's future)."""
        if self.offset is not None:
            fn(self)
        elif self.exception is None:
            self._callbacks.append(fn)
        return self

    def add_errback(self, fn: Callable[[BaseException], Any]) -> Sent:
        if self.exception is not None:
            fn(self.exception)
        elif self.offset is None:
            self._errbacks.append(fn)
        return self

    def delivered(self, err: Any, msg: Any) -> None:
        """librdkafka's delivery report."""
        if err is None:
            self.offset = msg.offset()
            for fn in self._callbacks:
                fn(self)
        else:
            self.exception = KafkaError(f"{err.name()}: {err.str()}")
            for fn in self._errbacks:
                fn(self.exception)


class RdKafkaProducer:
    """confluent-kafka's Producer with the surface of kafka-python's KafkaProducer the record collector uses."""

    def __init__(self, **options: Any) -> None:
        from confluent_kafka import Producer  # the `librdkafka` extra; imported only when chosen

        self._max_block_s = float(options.get("max_block_ms", MAX_BLOCK_MS)) / 1000
        # librdkafka logs through this logger from `poll`/`flush` (else it writes to stderr itself, a line per
        # reconnect try while a broker is down): the same line at most once a minute.
        self._producer: Any = Producer(rdkafka_config(options), logger=_LOGGER)

    def send(
        self,
        topic: str,
        *,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Sent:
        sent = Sent()
        kwargs: dict[str, Any] = {"key": key, "value": value, "headers": headers, "on_delivery": sent.delivered}
        if partition is not None:
            kwargs["partition"] = partition
        if timestamp_ms is not None:
            kwargs["timestamp"] = timestamp_ms
        if self._producer is None:
            raise KafkaError("the producer is closed")
        deadline = time.monotonic() + self._max_block_s
        while True:
            try:
                self._producer.produce(topic, **kwargs)
                return sent
            except BufferError:  # the queue is full: wait for answers (as kafka-python's send blocks)
                if time.monotonic() >= deadline:
                    raise KafkaTimeoutError(f"no room in the producer's queue after {self._max_block_s:.0f}s") from None
                self._producer.poll(0.05)

    def serve(self) -> None:
        """The answers librdkafka has, delivered to their futures on this thread (closed: none are left)."""
        if self._producer is not None:
            self._producer.poll(0)

    def flush(self, timeout: float | None = None) -> None:
        """Every send answered (its callback or errback run); KafkaTimeoutError when not within `timeout`."""
        if self._producer is None:
            raise KafkaTimeoutError("the producer is closed")
        left = self._producer.flush(-1 if timeout is None else timeout)
        if left:  # librdkafka's queue length: sends, and any log line or error event not yet served
            raise KafkaTimeoutError(f"{left} records or events unanswered after {timeout}s")

    def force_close(self) -> None:
        """What is held fails now (the errbacks of what the purge answers at once run), and the producer is let go.

        Not confluent-kafka's `close()`: it flushes with no time limit, which would hold a shutdown or a renewal for
        as long as a broker is away. Destroying the handle (the last reference) does not flush."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        producer.purge(in_queue=True, in_flight=True, blocking=False)
        producer.poll(0)
        del producer

    def close(self, timeout: float | None = None) -> None:
        """What is held gets up to `timeout` to be answered; the rest fails (its errbacks run)."""
        if self._producer is None:
            return
        try:
            self._producer.flush(-1 if timeout is None else timeout)
        finally:
            self.force_close()
