"""kafka-python 3.0 starts a client's IO thread before it bootstraps, and a constructor that cannot bootstrap raises
with that thread still running and nothing to close. `construct_client` closes what the constructor made: both
sides, against a port where nothing listens, and a client it builds against the broker works as usual."""

from __future__ import annotations

import threading

import pytest
from kafka import KafkaConsumer, KafkaProducer

from tracejudge._shared.kafka_options import construct_client
from tracejudge.consumer.embedded_broker import EmbeddedBroker, free_port


def io_threads(client_id: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"kafka-io-{client_id}" and t.is_alive()]


@pytest.mark.parametrize("factory", [KafkaConsumer, KafkaProducer])
def test_a_constructor_that_cannot_bootstrap_leaves_no_thread(factory: type) -> None:
    client_id = f"nobody-{factory.__name__}"
    with pytest.raises(Exception):  # noqa: B017 - kafka-python raises NoBrokersAvailable or a timeout by version
        construct_client(
            factory, bootstrap_servers=f"127.0.0.1:{free_port()}", client_id=client_id, bootstrap_timeout_ms=300
        )
    assert io_threads(client_id) == []


def test_without_it_kafka_python_leaves_the_io_thread_running() -> None:
    with pytest.raises(Exception):  # noqa: B017
        KafkaConsumer(bootstrap_servers=f"127.0.0.1:{free_port()}", client_id="bare", bootstrap_timeout_ms=300)
    leftover = io_threads("bare")
    assert leftover, "kafka-python now stops its IO thread itself: construct_client's work-around can go"
    leftover[0].join(0.5)
    assert leftover[0].is_alive()
    leftover[0]._target.__self__.close()  # type: ignore[attr-defined]  # the IO loop it runs: only reachable so
    leftover[0].join(10)
    assert not leftover[0].is_alive()


def test_a_client_it_builds_works_and_closes(broker: EmbeddedBroker, topic: str) -> None:
    consumer = construct_client(KafkaConsumer, bootstrap_servers=broker.bootstrap_servers, client_id="built")
    try:
        assert consumer.partitions_for_topic(topic) == {0, 1, 2}
    finally:
        consumer.close()
    assert io_threads("built") == []
