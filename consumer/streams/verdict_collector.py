"""The judge worker's record collector: every write of the judge thread to Kafka, through one producer and one path
(send; on failure count it, say it and send it again at the next step; renew the producer where the failure says it
is broken), as Kafka Streams' RecordCollector is its stream thread's. Three kinds go through it: verdict
acknowledgements to the repartition topic, retry records to the retry topic, due retries forwarded to the judge queue.

A send's outcome arrives on kafka-python's sender thread, which only queues it; the judge thread applies it
(`collect`): an acknowledged send's `acked` runs there, so the worker's state changes on its own thread. A send's
`event`, if any, is set on the sender thread: it is Delivery's hold, which the judge thread waits on.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ..emit.prometheus import ConsumerInstruments
from ..kafka import KafkaClients, KafkaProducer, KafkaTimeoutError
from . import records as R
from .record_collector import close_failed

logger = logging.getLogger("tracejudge.consumer.judges")
FLUSH_TIMEOUT_S = 30.0


@dataclass(eq=False)
class Outgoing:
    """One record to write and what its acknowledgement means."""

    topic: str
    key: bytes
    value: bytes
    kind: str  # the record's kind header (records.JOB, records.VERDICT)
    partition: int
    failure: str  # the warning when it cannot be written, with %r for the error
    acked: Callable[[], None] | None = None  # run on the judge thread once the broker has it
    event: threading.Event | None = None  # set on the sender thread once the broker has it (a Delivery hold)
    wanted: Callable[[], bool] | None = None  # asked before a resend: False drops it (its partition moved away)
    # A failure stops the next commit, which renews the producer (an idempotent producer whose id the brokers forgot,
    # e.g. after they lost their state, fails every later send with InitProducerId errors and never recovers).
    gates_commit: bool = False


class VerdictCollector:
    """The judge thread's producer. `send` from any thread (the rebalance listener's too, while the judge thread
    waits in poll); `collect`, `resend` and `ready_to_commit` on the judge thread."""

    def __init__(self, clients: KafkaClients, prometheus: ConsumerInstruments) -> None:
        self.clients = clients
        self.prometheus = prometheus
        self.producer: KafkaProducer | None = None
        # (send, the producer it went to, its error or None): filled by the sender thread, emptied by `collect`
        self._outcomes: queue.SimpleQueue[tuple[Outgoing, KafkaProducer | None, BaseException | None]] = (
            queue.SimpleQueue()
        )
        self._unsent: list[Outgoing] = []  # failed, sent again at the next `resend`
        self._failed = False  # a commit-gating send failed since the last flush began
        self._flush_timed_out = False
        self._log = RateLimitedLog(logger, interval_s=10.0)

    def open(self) -> None:
        self.producer = self._new_producer()

    def _new_producer(self) -> KafkaProducer:
        producer: KafkaProducer = self.clients.producer("tracejudge-verdicts", acks="all", linger_ms=5)
        return producer

    def send(self, out: Outgoing) -> None:
        producer = self.producer
        assert producer is not None
        try:
            future = producer.send(
                out.topic, key=out.key, value=out.value, headers=R.header(out.kind), partition=out.partition
            )
        except Exception as exc:
            self._outcomes.put((out, producer, exc))
            return
        future.add_callback(lambda _metadata: self._acknowledged(out))
        future.add_errback(lambda exc: self._outcomes.put((out, producer, exc)))

    def _acknowledged(self, out: Outgoing) -> None:
        """On the sender thread: the event at once (a waiting judge thread wakes), the rest for the judge thread."""
        if out.event is not None:
            out.event.set()
        self._outcomes.put((out, None, None))

    def collect(self) -> None:
        """Apply the outcomes the sender thread queued: acknowledged sends' `acked`; failures counted, said, and kept
        for `resend`. A failure on a producer since replaced does not gate (it was recovered from by the renewal)."""
        while True:
            try:
                out, producer, exc = self._outcomes.get_nowait()
            except queue.Empty:
                return
            if exc is None:
                if out.acked is not None:
                    out.acked()
                continue
            if out.gates_commit and producer is self.producer:
                self._failed = True
            self.prometheus.record_output_error("internal_topics")
            self._log.warning(out.failure, exc)
            self._unsent.append(out)

    def resend(self) -> None:
        """Send again what failed until now (one that fails again waits for the next step)."""
        unsent, self._unsent = self._unsent, []
        for out in unsent:
            if out.wanted is None or out.wanted():
                self.send(out)

    def ready_to_commit(self) -> bool:
        """Everything sent is answered (its outcome collected) and no commit-gating send failed meanwhile. False when
        the brokers did not answer in time (an outage: nothing is committed, tried again next time) or one failed
        (the producer is renewed; its sends are sent again)."""
        assert self.producer is not None
        self.collect()  # what failed before this flush was sent again: only a failure from here on gates
        if not self._flush_timed_out:  # after a timed-out flush, a failure of what it waited for is still to be seen
            self._failed = False
        try:
            self.producer.flush(timeout=FLUSH_TIMEOUT_S)  # every callback has queued its outcome once it returns
        except KafkaTimeoutError:
            self._flush_timed_out = True
            self._log.warning("verdict acknowledgements unanswered after 30s: nothing committed (check the brokers)")
            return False
        self._flush_timed_out = False
        self.collect()
        if self._failed:
            self.renew()
            return False
        return True

    def renew(self) -> None:
        """A fresh producer; the old one is closed without waiting (what it still holds fails and is sent again)."""
        old = self.producer
        self.producer = self._new_producer()
        close_failed(old)

    def close(self, timeout_s: float) -> None:
        if self.producer is not None:
            try:
                self.producer.close(timeout=max(0.5, timeout_s))
            except Exception as exc:
                logger.warning("closing the producer: %r", exc)
