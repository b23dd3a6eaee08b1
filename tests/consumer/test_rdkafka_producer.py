"""`--producer-client librdkafka`: the stream thread's writes through confluent-kafka, behind the surface of
kafka-python's producer that the record collector uses (consumer/kafka/rdkafka.py).

Live on Tansu: what is sent arrives as sent (partition, key, value, headers, timestamp, tombstone) and is answered
only on the thread that serves it; with no broker a flush times out and what is held fails when the producer is
closed. The user's kafka-python option names translate, or are refused in one line. The record collector's
acknowledgement and failure paths run on it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.support.pipeline import read_all, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker, free_port
from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.kafka import KafkaClients, KafkaError, KafkaTimeoutError
from tracejudge.consumer.kafka.clients import close_now
from tracejudge.consumer.kafka.rdkafka import (
    DEFAULTS,
    RdKafkaProducer,
    confluent_kafka_version,
    librdkafka_version,
    rdkafka_config,
)
from tracejudge.consumer.kafka.topics import InternalTopics
from tracejudge.consumer.settings import Settings
from tracejudge.consumer.streams import records as R
from tracejudge.consumer.streams.record_collector import RecordCollector
from tracejudge.consumer.streams.task import Task

pytest.importorskip("confluent_kafka")
ROOT = Path(__file__).resolve().parents[2]


def test_the_start_names_both_versions_whole() -> None:
    """confluent-kafka's `version()` is a plain string in 2.13+ (a pair before): its first character is no version."""
    import confluent_kafka

    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", confluent_kafka_version())
    assert librdkafka_version() == f"{confluent_kafka.libversion()[0]} (confluent-kafka {confluent_kafka_version()})"


def test_kafka_python_option_names_translate_to_librdkafkas() -> None:
    config = rdkafka_config(
        {
            "bootstrap_servers": "b:9092",
            "client_id": "c",
            "acks": -1,
            "linger_ms": 5,
            "batch_size": 262_144,
            "compression_type": None,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": "u",
            "sasl_plain_password": "p",
            "ssl_check_hostname": False,
            "retries": float("inf"),
            "buffer_memory": 32 * 1024 * 1024,
            "enable_idempotence": False,
            "api_version": (2, 8),  # negotiated by librdkafka: dropped
            "bootstrap_timeout_ms": 5_000,
        }
    )
    assert config == {
        "bootstrap.servers": "b:9092",
        "client.id": "c",
        "acks": "all",
        "linger.ms": 5,
        "batch.size": 262_144,
        "compression.type": "none",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "u",
        "sasl.password": "p",
        "ssl.endpoint.identification.algorithm": "none",
        "message.send.max.retries": 2_147_483_647,
        "queue.buffering.max.kbytes": 32 * 1024,
        "enable.idempotence": False,  # the user's choice
        **{k: v for k, v in DEFAULTS.items()},
    }
    assert DEFAULTS["partitioner"] == "murmur2_random"  # a keyed record where the Java client and kafka-python put it
    assert rdkafka_config({})["enable.idempotence"] is True  # as kafka-python 3.0's default
    # ... which it turns off where the options forbid it, as kafka-python does, rather than fail at start
    assert rdkafka_config({"retries": 0})["enable.idempotence"] is False
    assert rdkafka_config({"max_in_flight_requests_per_connection": 10})["enable.idempotence"] is False
    backoff = rdkafka_config({"reconnect_backoff_ms": 5000, "reconnect_backoff_max_ms": 1000})
    assert backoff["reconnect.backoff.max.ms"] == 5000  # librdkafka refuses a maximum below the first backoff


@pytest.mark.parametrize("option", ["socks5_proxy", "partitioner", "ssl_context", "sasl_oauth_token_provider"])
def test_an_option_librdkafka_has_no_equivalent_of_is_refused_by_name(option: str) -> None:
    with pytest.raises(ValueError, match=f"Kafka option {option} has no librdkafka equivalent"):
        rdkafka_config({option: object()})


def test_settings_refuse_librdkafka_with_an_option_it_cannot_take() -> None:
    with pytest.raises(ValueError, match="socks5_proxy has no librdkafka equivalent"):
        Settings.from_options(producer_client="librdkafka", kafka_config={"socks5_proxy": "socks5://p:1080"})
    with pytest.raises(ValueError, match="GSSAPI is not in confluent-kafka's wheels"):
        rdkafka_config({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "GSSAPI"})
    # a value librdkafka itself refuses, found at start (not when the stream thread builds its producer)
    with pytest.raises(ValueError, match="librdkafka refuses the Kafka options"):
        Settings.from_options(producer_client="librdkafka", kafka_config={"compression_type": "brotli"})
    # a consumer's option is not the producer's: accepted
    assert Settings.from_options(producer_client="librdkafka", kafka_config={"session_timeout_ms": 6000})


def test_the_cli_says_so_in_one_line() -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tracejudge.consumer",
            "consume",
            "--producer-client",
            "librdkafka",
            "--kafka-config",
            "socks5_proxy=socks5://p:1080",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in completed.stderr, completed.stderr
    assert "socks5_proxy" in lines[0] and "--producer-client kafka-python" in lines[0]


def test_what_is_sent_arrives_as_sent_and_is_answered_on_the_serving_thread(broker: EmbeddedBroker) -> None:
    topic = f"rdk-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, 2)
    producer = RdKafkaProducer(bootstrap_servers=broker.bootstrap_servers, client_id="t", acks="all", linger_ms=5)
    answered: list[tuple[int, int, int]] = []  # (partition, index, offset)
    threads: set[int] = set()
    sent = []
    try:
        for i in range(40):
            partition = i % 2
            value = None if i == 39 else f"v{i}".encode()
            future = producer.send(
                topic,
                key=f"k{i}".encode(),
                value=value,
                headers=[("kind", b"test")],
                partition=partition,
                timestamp_ms=1_700_000_000_000 + i,
            )

            def done(meta: Any, p: int = partition, i: int = i) -> None:
                threads.add(threading.get_ident())
                answered.append((p, i, meta.offset))

            future.add_callback(done).add_errback(lambda exc: pytest.fail(f"send failed: {exc!r}"))
            sent.append(future)
        # answered only inside serve/flush: the records are on the broker, their reports wait for the thread that asks
        wait_for(
            lambda: len(read_all(broker.bootstrap_servers, topic)) == 40, timeout=30, what="the 40 records written"
        )
        assert answered == []
        deadline = time.monotonic() + 30
        while len(answered) < 40 and time.monotonic() < deadline:
            producer.serve()  # what the record collector calls once a round
    finally:
        producer.close(5)
    assert threads == {threading.get_ident()}
    assert len(answered) == 40
    late: list[Any] = []
    sent[0].add_callback(late.append)  # answered already: called at once, as kafka-python's future
    assert late == [sent[0]]
    for p in (0, 1):
        offsets = [offset for partition, _, offset in sorted(answered, key=lambda a: a[1]) if partition == p]
        assert offsets == list(range(20))  # in send order, each its own offset
    records = sorted(read_all(broker.bootstrap_servers, topic), key=lambda r: r.timestamp)
    assert [(r.partition, r.key, r.value, r.timestamp) for r in records] == [
        (i % 2, f"k{i}".encode(), None if i == 39 else f"v{i}".encode(), 1_700_000_000_000 + i) for i in range(40)
    ]
    assert all(list(r.headers) == [("kind", b"test")] for r in records)


def test_with_no_broker_a_flush_times_out_and_closing_fails_what_is_held() -> None:
    producer = RdKafkaProducer(bootstrap_servers=f"127.0.0.1:{free_port()}", client_id="t", acks="all")
    failed: list[BaseException] = []
    acked: list[Any] = []
    for _ in range(5):
        producer.send("t", key=b"k", value=b"v", partition=0).add_callback(acked.append).add_errback(failed.append)
    started = time.monotonic()
    with pytest.raises(KafkaTimeoutError, match=r"\d+ records or events unanswered"):
        producer.flush(0.5)
    assert time.monotonic() - started < 5
    assert failed == [] and acked == []
    started = time.monotonic()
    close_now(producer)  # Java's close(0): what is held fails now, once each
    assert time.monotonic() - started < 5
    assert len(failed) == 5 and acked == []
    assert all(isinstance(exc, KafkaError) and "PURGE" in str(exc) for exc in failed)
    producer.close(1)  # closed already: nothing more
    assert len(failed) == 5
    with pytest.raises(KafkaTimeoutError, match="closed"):
        producer.flush(1)  # a closed producer never says everything was answered
    with pytest.raises(KafkaError, match="closed"):
        producer.send("t", key=b"k", value=b"v", partition=0)


def test_a_full_queue_blocks_a_send_at_most_max_block_ms() -> None:
    producer = RdKafkaProducer(
        bootstrap_servers=f"127.0.0.1:{free_port()}", client_id="t", buffer_memory=1024, max_block_ms=500
    )
    try:
        producer.send("t", key=b"k", value=b"x" * 900, partition=0)  # fills the 1 KiB queue
        started = time.monotonic()
        with pytest.raises(KafkaTimeoutError, match="no room"):
            producer.send("t", key=b"k", value=b"x" * 900, partition=0)
        assert 0.4 < time.monotonic() - started < 5
    finally:
        producer.force_close()


def test_close_waits_at_most_its_timeout_then_fails_the_rest() -> None:
    producer = RdKafkaProducer(bootstrap_servers=f"127.0.0.1:{free_port()}", client_id="t")
    failed: list[BaseException] = []
    producer.send("t", key=b"k", value=b"v", partition=0).add_errback(failed.append)
    started = time.monotonic()
    producer.close(0.5)
    assert 0.4 < time.monotonic() - started < 5
    assert len(failed) == 1


def collector(
    bootstrap: str, tmp_path: Path, topic: str, **kafka_config: Any
) -> tuple[RecordCollector, InternalTopics]:
    """A record collector on librdkafka's producer, with these client options (`--kafka-config`)."""
    settings = Settings.from_options(
        topic=topic,
        group_id=f"g-{uuid.uuid4().hex[:6]}",
        state_dir=str(tmp_path),
        producer_client="librdkafka",
        kafka_config=kafka_config,
    )
    topics = InternalTopics(settings.group_id)
    clients = KafkaClients(bootstrap, settings.kafka_config)
    return RecordCollector(settings, ConsumerInstruments(CollectorRegistry()), topics, clients), topics


def test_the_record_collector_applies_acknowledgements_from_librdkafka(broker: EmbeddedBroker, tmp_path: Path) -> None:
    topic = f"rdk-{uuid.uuid4().hex[:6]}"
    rc, topics = collector(broker.bootstrap_servers, tmp_path, topic)
    broker.create_topic(topics.changelog, 2)
    rc.open()
    try:
        assert isinstance(rc.producer, RdKafkaProducer)
        task = Task(1, None, restoring=False)  # type: ignore[arg-type]
        for i in range(3):
            rc.send(topics.changelog, f"c{i}", b"{}", R.POSITIONS, partition=1, acked=task)
        assert task.changelog_acked is None
        # a round's wake serves librdkafka's answers on this thread, with no flush
        wait_for(lambda: (rc.wake(), task.changelog_acked)[1] == 3, timeout=30, what="the acknowledgements served")
        rc.send(topics.changelog, "c3", b"{}", R.POSITIONS, partition=1, acked=task)
        assert rc.flushed(30)
        assert task.changelog_acked == 4  # the next offset after the last acknowledged
        assert not rc.failed
    finally:
        rc.close(5)


def test_a_renewal_with_sends_held_is_not_a_new_failure(tmp_path: Path) -> None:
    rc, topics = collector(f"127.0.0.1:{free_port()}", tmp_path, "t")
    rc.open()
    try:
        old = rc.producer
        for i in range(3):
            rc.send(topics.changelog, f"c{i}", b"{}", R.POSITIONS, partition=0)
        started = time.monotonic()
        rc.renew()  # the old producer's held sends fail: recovered from by the renewal, not remembered
        assert time.monotonic() - started < 5  # no flush without a limit while the broker is away
        assert rc.producer is not old and not rc.failed
    finally:
        rc.close(0.5)


def test_a_send_that_times_out_and_one_after_close_are_heard(tmp_path: Path) -> None:
    rc, topics = collector(f"127.0.0.1:{free_port()}", tmp_path, "t", delivery_timeout_ms=1000)
    rc.open()
    try:
        rc.send(topics.changelog, "c", b"{}", R.POSITIONS, partition=0)
        wait_for(lambda: (rc.wake(), rc.failed)[1], timeout=30, what="the timed-out send heard")
    finally:
        rc.close(0.5)
    rc2, topics2 = collector(f"127.0.0.1:{free_port()}", tmp_path, "t")
    rc2.open()
    assert rc2.producer is not None
    rc2.producer.force_close()
    rc2.send(topics2.changelog, "c", b"{}", R.POSITIONS, partition=0)  # on a closed producer: a failure, not a raise
    assert rc2.failed


def test_the_record_collector_hears_a_failed_send_and_renews(tmp_path: Path) -> None:
    rc, topics = collector(f"127.0.0.1:{free_port()}", tmp_path, "t")
    rc.open()
    try:
        old = rc.producer
        rc.send(topics.changelog, "c", b"{}", R.POSITIONS, partition=0)
        assert not rc.flushed(0.5)  # unanswered: nothing may be committed
        assert not rc.failed
        assert isinstance(old, RdKafkaProducer)
        old.force_close()  # its held send fails: heard as this producer's failure
        assert rc.failed
        rc.renew()
        assert rc.producer is not old and not rc.failed
    finally:
        rc.close(0.5)
