"""`FetchAnswers`: what a consumer's fetches answered, and when each was sent (a kafka-python work-around, any
broker). Live on Tansu, which answers full fetches; Apache Kafka's incremental sessions and quota throttling with the
answers kafka-python decodes."""

from __future__ import annotations

import time
import uuid

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from tests.consumer.test_streams_clock import fetch_response
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.kafka.highwater import FetchAnswers


def test_a_real_consumer_answers_each_fetch_and_a_paused_partition_gets_none(broker: EmbeddedBroker) -> None:
    """Installed on kafka-python's own consumer: its fetches' high watermarks come with when they were sent. A
    partition it stops fetching (paused, as in a rebalance) gets no new answer, while `highwater()` still says the
    old end: what the stream clock must not take for one."""
    topic = f"fa-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 1)
    tp = TopicPartition(topic, 0)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, fetch_max_wait_ms=100)
    try:
        answers = FetchAnswers.install(consumer)
        assert answers is not None, "kafka-python moved its fetcher's answer handler: FetchAnswers needs updating"
        for i in range(3):
            producer.send(topic, value=b"%d" % i, partition=0)
        producer.flush()
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        started = int(time.time() * 1000)
        read = 0
        deadline = time.monotonic() + 15
        while read < 3 and time.monotonic() < deadline:
            read += sum(len(records) for records in consumer.poll(timeout_ms=200).values())
        assert read == 3
        answer = answers.latest(tp)
        assert answer is not None and answer.highwater == 3
        assert started - 1_000 <= answer.sent_ms <= int(time.time() * 1000)
        consumer.pause(tp)
        for _ in range(2):
            consumer.poll(timeout_ms=200)  # what the fetch in flight when paused answered, if any
        paused = answers.latest(tp)
        for i in range(2):
            producer.send(topic, value=b"late %d" % i, partition=0)
        producer.flush()
        for _ in range(5):
            consumer.poll(timeout_ms=200)
        assert answers.latest(tp) == paused and consumer.highwater(tp) == 3  # remembered, never answered again
        consumer.resume(tp)
        deadline = time.monotonic() + 15
        while (latest := answers.latest(tp)) is not None and latest.highwater < 5 and time.monotonic() < deadline:
            consumer.poll(timeout_ms=200)
        assert latest is not None and latest.highwater == 5 and paused is not None and latest.sent_ms > paused.sent_ms
    finally:
        consumer.close()
        producer.close()


def test_a_consumer_without_the_handler_is_not_watched() -> None:
    """A kafka-python that keeps its fetcher elsewhere: nothing is installed (the clock says so in its log)."""

    class Elsewhere:
        pass

    assert FetchAnswers.install(Elsewhere()) is None


@pytest.mark.parametrize(
    "top", [{"throttle_time_ms": 100}, {"error_code": 70}, {"session_id": -1}], ids=["throttled", "error", "quota"]
)
def test_a_throttled_or_failed_fetch_answers_nothing(top: dict[str, int]) -> None:
    """A fetch throttled by a quota answers empty; a failed session answers an error: neither says the partition is
    unchanged."""
    answers = FetchAnswers()
    tp = TopicPartition("spans", 0)
    answers.answered({tp: 0}, time.monotonic() - 5.0, fetch_response({0: 10}, session_id=7))
    first = answers.latest(tp)
    answers.answered({tp: 0}, time.monotonic(), fetch_response({}, **{"session_id": 7, **top}))
    assert answers.latest(tp) == first


def test_an_answer_to_an_older_fetch_says_less_than_a_newer_one() -> None:
    """Two brokers (a leader moved): the fetch sent earlier may be answered later; the newer fetch's answer stands."""
    answers = FetchAnswers()
    tp = TopicPartition("spans", 0)
    now = time.monotonic()
    answers.answered({tp: 0}, now, fetch_response({0: 20}))
    answers.answered({tp: 0}, now - 3.0, fetch_response({0: 12}))
    answer = answers.latest(tp)
    assert answer is not None and answer.highwater == 20
