"""`FetchAnswers`: what a consumer's fetches answered, and when each was sent (a kafka-python work-around, any
broker). Live on Tansu, which answers full fetches; Apache Kafka's incremental sessions and quota throttling with the
answers kafka-python decodes."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

import tracejudge.consumer.kafka.highwater as highwater
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


TP = TopicPartition("spans", 0)
SESSION = 7  # an Apache Kafka incremental fetch session


@pytest.mark.parametrize("top", [{"throttle_time_ms": 100}, {"error_code": 70}], ids=["throttled", "error"])
def test_a_throttled_or_failed_fetch_answers_nothing_about_what_it_left_out(top: dict[str, int]) -> None:
    """A fetch throttled by a quota answers empty; a failed session answers an error: neither says the partition is
    unchanged."""
    answers = FetchAnswers()
    answers.answered(1, {TP: 0}, time.monotonic() - 5.0, fetch_response({0: 10}, session_id=SESSION))
    first = answers.latest(TP)
    answers.answered(
        1,
        {TP: 0},
        time.monotonic(),
        fetch_response(
            {}, session_id=SESSION, throttle_time_ms=top.get("throttle_time_ms", 0), error_code=top.get("error_code", 0)
        ),
    )
    assert answers.latest(TP) == first


def test_an_answer_to_an_older_fetch_says_less_than_a_newer_one() -> None:
    """Two brokers (a leader moved): the fetch sent earlier may be answered later; the newer fetch's answer stands."""
    answers = FetchAnswers()
    now = time.monotonic()
    answers.answered(1, {TP: 0}, now, fetch_response({0: 20}))
    answers.answered(2, {TP: 0}, now - 3.0, fetch_response({0: 12}))
    answer = answers.latest(TP)
    assert answer is not None and answer.highwater == 20


def test_only_the_session_that_answered_a_value_carries_it_over() -> None:
    """Left out by another session (a new one after a reset, another broker's) says nothing about this value; a
    partition's error forgets it until the session answers it again."""
    answers = FetchAnswers()
    answers.answered(1, {TP: 0}, time.monotonic() - 5.0, fetch_response({0: 10}, session_id=SESSION))
    kept = answers.latest(TP)
    answers.answered(1, {TP: 0}, time.monotonic(), fetch_response({}, session_id=SESSION + 1))
    answers.answered(2, {TP: 0}, time.monotonic(), fetch_response({}, session_id=SESSION))
    assert answers.latest(TP) == kept
    failed = fetch_response({0: -1}, session_id=SESSION)
    failed.responses[0].partitions[0].error_code = 6  # NOT_LEADER_OR_FOLLOWER
    answers.answered(1, {TP: 0}, time.monotonic(), failed)
    answers.answered(1, {TP: 0}, time.monotonic(), fetch_response({}, session_id=SESSION))
    assert answers.latest(TP) is None


def test_answers_are_ordered_by_when_they_were_sent_not_by_a_wall_clock_that_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The host's wall clock stepped back a minute (NTP, a resumed VM) between two answers of one session: the newer
    one (15) is kept, so the session leaving the partition out later means 15, never the older 10 (a task at 12
    with 3 records unread would be claimed read). Found in review."""
    wall = {"s": 1_000_000.0}
    mono = {"s": 500.0}
    monkeypatch.setattr(highwater, "time", SimpleNamespace(time=lambda: wall["s"], monotonic=lambda: mono["s"]))
    answers = FetchAnswers()
    answers.answered(1, {TP: 0}, mono["s"], fetch_response({0: 10}, session_id=SESSION))
    wall["s"], mono["s"] = 1_000_000.0 - 59, 501.0
    answers.answered(1, {TP: 10}, mono["s"], fetch_response({0: 15}, session_id=SESSION))
    wall["s"], mono["s"] = 1_000_000.0 + 2, 562.0
    answers.answered(1, {TP: 12}, mono["s"], fetch_response({}, session_id=SESSION))
    latest = answers.latest(TP)
    assert latest is not None and latest.highwater == 15
    assert latest.sent_ms == int(wall["s"] * 1000)  # sent just now, as the wall clock reads now


def test_an_answer_that_cannot_be_read_forgets_its_partitions_and_asks_for_a_full_fetch() -> None:
    """An answer missed breaks "left out means unchanged": its partitions claim nothing until answered again, and
    the session's next fetch is a full one (kafka-python's own step after a session error)."""
    answers, fetcher, handler = _installed()
    fetcher._handle_fetch_response(1, {TP: 0}, time.monotonic(), fetch_response({0: 10}, session_id=SESSION))
    assert answers.latest(TP) is not None
    fetcher._handle_fetch_response(1, {TP: 0}, time.monotonic(), object())  # not a fetch answer
    assert answers.latest(TP) is None
    assert handler.next_metadata.session_id == SESSION and handler.next_metadata.is_full


def test_each_answer_that_cannot_be_read_is_counted_per_consumer() -> None:
    """Heard and counted: the clock's two consumers each count into tracejudge_kafka_fetch_answers_unreadable_total,
    at 0 from the start; a counter that fails never reaches kafka-python's IO loop."""
    from prometheus_client import CollectorRegistry

    from tracejudge.consumer.streams.clock import StreamClock
    from tracejudge.consumer.streams.instruments import StreamsInstruments

    registry = CollectorRegistry()
    instruments = StreamsInstruments(registry)
    clock = StreamClock("spans", "spans-repartition", 1, instruments.fetch_answer_unreadable)

    def consumer() -> SimpleNamespace:
        return SimpleNamespace(_fetcher=SimpleNamespace(_handle_fetch_response=lambda *args: None))

    group, side = consumer(), consumer()
    clock.watch(group, side)  # type: ignore[arg-type]
    name = "tracejudge_kafka_fetch_answers_unreadable_total"
    assert registry.get_sample_value(name, {"consumer": "group"}) == 0
    assert registry.get_sample_value(name, {"consumer": "restore"}) == 0
    group._fetcher._handle_fetch_response(1, {TP: 0}, time.monotonic(), object())
    group._fetcher._handle_fetch_response(1, {TP: 0}, time.monotonic(), fetch_response({0: 10}, session_id=SESSION))
    side._fetcher._handle_fetch_response(1, {TP: 0}, time.monotonic(), object())
    group._fetcher._handle_fetch_response(1, {TP: 0}, time.monotonic(), object())
    assert registry.get_sample_value(name, {"consumer": "group"}) == 2
    assert registry.get_sample_value(name, {"consumer": "restore"}) == 1

    def broken() -> None:
        raise RuntimeError("a counter that fails")

    answers = FetchAnswers.install(consumer(), broken)
    assert answers is not None
    answers.unreadable(1, {TP: 0}, ValueError("unreadable"))  # does not raise


def _installed() -> tuple[FetchAnswers, SimpleNamespace, SimpleNamespace]:
    """FetchAnswers over a fetcher with one session (node 1), as kafka-python holds it."""
    from kafka.consumer.fetcher import FetchMetadata

    handler = SimpleNamespace(next_metadata=FetchMetadata(SESSION, 3))
    fetcher = SimpleNamespace(
        _handle_fetch_response=lambda node, asked, sent, response: None, _session_handlers={1: handler}
    )
    answers = FetchAnswers.install(SimpleNamespace(_fetcher=fetcher))
    assert answers is not None
    return answers, fetcher, handler


def test_a_partition_forgotten_inside_a_live_session_is_answered_again_by_a_full_fetch() -> None:
    """Assigned again while its fetch session lives on (Apache Kafka): the broker resends a partition only when
    something about it changed, so with traffic stopped it would be left out for ever and the clock never move again.
    Forgetting it makes the next fetch a full one. Found in review."""
    answers, fetcher, handler = _installed()
    fetcher._handle_fetch_response(1, {TP: 10}, time.monotonic() - 5.0, fetch_response({0: 10}, session_id=SESSION))
    answers.forget([TP])
    assert answers.latest(TP) is None and handler.next_metadata.is_full
    fetcher._handle_fetch_response(1, {TP: 10}, time.monotonic(), fetch_response({0: 10}, session_id=SESSION))
    latest = answers.latest(TP)
    assert latest is not None and latest.highwater == 10


def test_an_answer_to_a_fetch_sent_before_forgetting_is_not_kept() -> None:
    """In flight when the partition was assigned again (or sought): about an earlier reading."""
    answers, fetcher, _handler = _installed()
    sent = time.monotonic() - 1.0
    answers.forget([TP])
    fetcher._handle_fetch_response(1, {TP: 10}, sent, fetch_response({0: 10}, session_id=SESSION))
    assert answers.latest(TP) is None


def test_an_answer_kafka_python_failed_to_handle_breaks_no_carry_over() -> None:
    """kafka-python's handler raised after its session took the answer (the broker cached 15): what the session
    leaves out later is not the older 10 carried over (a task at 10 with 5 records unread claimed read). Found in
    review."""
    from kafka.consumer.fetcher import FetchMetadata

    def kafka_python_handler(node: object, asked: object, sent: float, response: Any) -> None:
        if response.responses and response.responses[0].partitions[0].high_watermark == 15:
            raise KeyError(TP)

    handler = SimpleNamespace(next_metadata=FetchMetadata(SESSION, 3))
    fetcher = SimpleNamespace(_handle_fetch_response=kafka_python_handler, _session_handlers={1: handler})
    answers = FetchAnswers.install(SimpleNamespace(_fetcher=fetcher))
    assert answers is not None
    fetcher._handle_fetch_response(1, {TP: 0}, time.monotonic(), fetch_response({0: 10}, session_id=SESSION))
    with pytest.raises(KeyError):
        fetcher._handle_fetch_response(1, {TP: 10}, time.monotonic(), fetch_response({0: 15}, session_id=SESSION))
    fetcher._handle_fetch_response(1, {TP: 10}, time.monotonic(), fetch_response({}, session_id=SESSION))
    assert answers.latest(TP) is None and handler.next_metadata.is_full


def test_the_assembler_watches_its_consumers_fetches_before_it_subscribes(tmp_path: Path) -> None:
    """Without `clock.watch` in `Assembler.open` the clock falls back to kafka-python's remembered high watermark
    dated now: the bug this module fixes. Found in review: no other test would notice."""
    from tests.consumer.test_task_ownership import new_assembler

    events: list[str] = []

    class _Fetcher:
        def _handle_fetch_response(self, node_id: object, asked: object, sent: float, response: object) -> None:
            events.append("kafka-python handled")

    class _Consumer:
        def __init__(self, **config: object) -> None:
            self._fetcher = _Fetcher()

        def subscribe(self, topics: object, listener: object = None) -> None:
            watched = "_handle_fetch_response" in vars(self._fetcher)  # the instance's handler: FetchAnswers'
            events.append("subscribed watched" if watched else "subscribed unwatched")

        def __getattr__(self, name: str) -> object:
            return lambda *a, **k: None

    assembler = new_assembler(tmp_path, partitions=1, consumer_factory=_Consumer)
    assembler.open()
    try:
        assert isinstance(assembler.group, _Consumer) and isinstance(assembler.side, _Consumer)
        for consumer, topic in ((assembler.group, "spans"), (assembler.side, "g-conversations-repartition")):
            tp = TopicPartition(topic, 0)
            consumer._fetcher._handle_fetch_response(1, {tp: 0}, time.monotonic(), fetch_response({0: 4}, topic=topic))
        task = SimpleNamespace(partition=0)
        answer = assembler.clock.answer(task, assembler.group)  # type: ignore[arg-type]
        assert answer is not None and answer.highwater == 4
        assert events == ["subscribed watched", "kafka-python handled", "kafka-python handled"]
        # An answer that cannot be read is counted on the served registry, by the consumer it came to.
        assembler.side._fetcher._handle_fetch_response(1, {TopicPartition("spans", 0): 4}, time.monotonic(), object())
        counted = {
            sample.labels["consumer"]: sample.value
            for family in assembler.instruments.unreadable_fetches.collect()
            for sample in family.samples
            if sample.name == "tracejudge_kafka_fetch_answers_unreadable_total"
        }
        assert counted == {"group": 0, "restore": 1}
    finally:
        assembler.collector.close(0)
