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
_IGNORED = frozenset({"api_version", "bootstrap_timeout_ms", "max_block_ms", "allow_auto_create_topics"})
# As kafka-python 3.0 does by default: an idempotent producer, sends answered within 120 s.
DEFAULTS: dict[str, Any] = {"enable.idempotence": True, "delivery.timeout.ms": 120_000}
MAX_BLOCK_MS = 60_000  # kafka-python's max_block_ms: how long a send waits for room in a full queue


def rdkafka_config(options: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka's properties for kafka-python's producer options; ValueError naming the first one without an
    equivalent."""
    config = dict(DEFAULTS)
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
    return config


class _OncePerMinute(logging.Filter):
    """librdkafka's log lines (`fac` and text), each distinct one let through at most once a minute."""

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key, now = record.getMessage(), time.monotonic()
        if now - self._last.get(key, -math.inf) < 60.0:
            return False
        if len(self._last) > 1000:
            self._last.clear()
        self._last[key] = now
        return True


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
        self._callbacks.append(fn)
        return self

    def add_errback(self, fn: Callable[[BaseException], Any]) -> Sent:
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
        self._producer = Producer(rdkafka_config(options), logger=_LOGGER)
        self._closed = False

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
        if not self._closed:
            self._producer.poll(0)

    def flush(self, timeout: float | None = None) -> None:
        if self._closed:
            return
        left = self._producer.flush(-1 if timeout is None else timeout)
        if left:
            raise KafkaTimeoutError(f"{left} records unanswered after {timeout}s")

    def force_close(self) -> None:
        """What is held fails now (its errbacks run), and the producer closes."""
        if self._closed:
            return
        self._producer.purge(in_queue=True, in_flight=True, blocking=False)
        self._producer.flush(0)
        self._close()

    def close(self, timeout: float | None = None) -> None:
        """What is held gets up to `timeout` to be answered; the rest fails (its errbacks run)."""
        if self._closed:
            return
        try:
            self._producer.flush(-1 if timeout is None else timeout)
        finally:
            self.force_close()

    def _close(self) -> None:
        self._closed = True
        self._producer.close()
