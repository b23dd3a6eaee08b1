"""The record collector's producer wakes its sender once a round, not once a batch (issue 31): on Tansu, kafka-python
wakes the sender for every new batch; with `DeferredWakeup` the sends of a round wake it once, every record is still
delivered, a flush still sends at once, a large burst still goes out while it is written, and a send that waits on
metadata is never held."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaProducer

from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.kafka.wakeup import WAKE_EVERY, DeferredWakeup


class Wakeups:
    """Counts the wake-ups that reach the sender (installed before `DeferredWakeup`, which then calls it)."""

    def __init__(self, producer: Any) -> None:
        self.count = 0
        self._wakeup = producer._sender.wakeup
        producer._sender.wakeup = self

    def __call__(self) -> None:
        self.count += 1
        self._wakeup()


@pytest.fixture
def producer(broker: EmbeddedBroker) -> Iterator[KafkaProducer]:
    instance = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=5, max_block_ms=10_000)
    yield instance
    instance.close(timeout=5)


def fresh_topic(broker: EmbeddedBroker) -> str:
    name = f"wakeups-{uuid.uuid4().hex[:10]}"
    broker.create_topic(name, partitions=3)
    return name


def test_without_the_deferral_kafka_python_wakes_its_sender_for_every_new_batch(
    broker: EmbeddedBroker, producer: KafkaProducer
) -> None:
    topic = fresh_topic(broker)
    producer.send(topic, b"warm", partition=0).get(timeout=10)  # metadata known, nothing pending
    wakeups = Wakeups(producer)
    futures = [producer.send(topic, b"v", partition=p) for p in range(3)]
    assert wakeups.count >= 3  # a batch opened on each partition: a wake-up each
    for future in futures:
        future.get(timeout=10)


def test_a_rounds_sends_wake_the_sender_once_and_are_all_delivered(
    broker: EmbeddedBroker, producer: KafkaProducer
) -> None:
    topic = fresh_topic(broker)
    wakeups = Wakeups(producer)
    deferred = DeferredWakeup.install(producer)
    assert deferred is not None
    first = deferred.send(topic, value=b"first", partition=0)  # no metadata yet: its wait woke the sender
    assert wakeups.count >= 1
    deferred.wake()  # the batch it opened waits for the round's end (kafka-python's idle sender sleeps for long)
    first.get(timeout=10)
    before = wakeups.count
    futures = [deferred.send(topic, value=f"v{n}".encode(), partition=n % 3) for n in range(30)]
    assert wakeups.count == before and deferred.held >= 3  # new batches on three partitions, no wake-up yet
    deferred.wake()
    assert wakeups.count == before + 1 and deferred.held == 0
    offsets = [future.get(timeout=10).offset for future in futures]
    assert len(offsets) == 30 and min(offsets) >= 0


def test_a_flush_sends_at_once_and_a_burst_goes_out_while_it_is_written(broker: EmbeddedBroker) -> None:
    topic = fresh_topic(broker)
    # A batch holds one record: every send asks for a wake-up (a full batch).
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=5, batch_size=1, max_block_ms=10_000)
    try:
        producer.send(topic, b"warm", partition=0).get(timeout=10)
        wakeups = Wakeups(producer)
        deferred = DeferredWakeup.install(producer)
        assert deferred is not None
        futures = [deferred.send(topic, value=b"x" * 100, partition=0) for _ in range(WAKE_EVERY * 2)]
        assert wakeups.count >= 2  # the sender was woken while the burst was written, without waiting for the round
        lone = deferred.send(topic, value=b"lone", partition=1)
        producer.flush(timeout=10)  # kafka-python's own wake-up goes through
        assert lone.is_done and lone.succeeded()
        assert all(future.is_done and future.succeeded() for future in futures)
        assert deferred.held == 0
    finally:
        producer.close(timeout=5)


def test_a_producer_without_kafka_pythons_sender_is_left_alone() -> None:
    class Fake:
        def send(self, topic: str, **kwargs: Any) -> None:
            pass

    assert DeferredWakeup.install(Fake()) is None
