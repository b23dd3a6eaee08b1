"""The notifier's delivery against a real HTTP endpoint on 127.0.0.1 and the real Tansu broker: a duplicate waits for
the post under way, a redirect is a failed attempt, a hanging endpoint holds nothing past --notify-retry-for, the
delivery thread never dies in silence, recording a delivery never holds up the next POST (yet a post is done only
once recorded), and the delivered ids (and the results topic) are read to their high watermark."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
import uuid
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.consumer.test_notify_export_units import judgement
from tests.support.pipeline import consumer_settings, wait_for
from tests.support.webhook_receiver import WebhookReceiver
from tracejudge.consumer.embedded_broker import BrokerUnavailable, EmbeddedBroker
from tracejudge.consumer.emit import KafkaWriter
from tracejudge.consumer.emit.notify import ATTEMPT_TIMEOUT_S, DeliveredIds, NotificationInstruments, Notifier

CONSUMER = {"enable_auto_commit": False}


def outcomes(instruments: NotificationInstruments, *names: str) -> list[float]:
    return [instruments.notifications.labels(outcome=name)._value.get() for name in names]


def delivered_ids(broker: EmbeddedBroker, topic: str, **producer_config: Any) -> DeliveredIds:
    writer = KafkaWriter(broker.bootstrap_servers, topic, durable=True, **producer_config).start()
    return DeliveredIds(broker.bootstrap_servers, topic, CONSUMER, writer)


# Records written as one batch: Tansu answers ListOffsets (end_offsets) with the last batch's base offset + 1 (1 here),
# which ended the old reads after their first poll (500 records), forgetting the rest.
ONE_BATCH = {"batch_size": 1 << 20, "linger_ms": 200}


def test_a_duplicate_of_a_result_still_being_posted_waits_for_that_post() -> None:
    """Its offset must not be committed before the first POST is through: `emit` returns that post's event."""
    hold = threading.Event()
    with WebhookReceiver(hold=hold) as receiver:
        notifier = Notifier([receiver.url]).start()
        try:
            (first,) = notifier.emit(judgement("c1", "hallucination"))
            wait_for(lambda: len(receiver.deliveries) == 1, 10, "the first POST under way")
            duplicate = notifier.emit(judgement("c1", "hallucination"))
            assert duplicate == [first] and not first.is_set()
            hold.set()
            assert first.wait(10)
        finally:
            notifier.close()
    assert len(receiver.deliveries) == 1  # sent once


def test_a_redirect_is_a_failed_attempt_counted_said_and_retried_never_followed(caplog: Any) -> None:
    instruments = NotificationInstruments(CollectorRegistry())
    errors: list[int] = []
    with WebhookReceiver() as target, WebhookReceiver(status=302, location=f"{target.url}/moved") as receiver:
        notifier = Notifier(
            [receiver.url],
            instruments=instruments,
            on_error=lambda: errors.append(1),
            retry_for_s=2.0,
            base_backoff_s=0.05,
        ).start()
        try:
            with caplog.at_level(logging.WARNING, logger="tracejudge.consumer.notify"):
                (done,) = notifier.emit(judgement("c1", "hallucination"))
                assert done.wait(15)
        finally:
            notifier.close()
    assert target.gets == [] and target.deliveries == []  # neither re-sent as a GET nor as a POST elsewhere
    assert len(receiver.deliveries) >= 2  # retried
    assert outcomes(instruments, "delivered", "given_up") == [0, 1]
    assert len(errors) == len(receiver.deliveries)
    assert "HTTP 302 redirect" in caplog.text and "set --notify-url to the URL it redirects to" in caplog.text


# timing-sensitive: asserts how long it took, so it runs alone (tests/run_suite.py's serial phase)
@pytest.mark.serial
def test_a_hanging_endpoint_holds_no_commit_past_the_retry_horizon() -> None:
    """One thread posts: without bounding each attempt by what is left of the horizon, three posts to an endpoint
    that never answers would hold their commits 5, 10 and 15 s against a 1 s --notify-retry-for."""
    instruments = NotificationInstruments(CollectorRegistry())
    with WebhookReceiver(hold=threading.Event()) as receiver:
        notifier = Notifier([receiver.url], instruments=instruments, retry_for_s=1.0, base_backoff_s=0.05).start()
        try:
            started = time.monotonic()
            done = [e for i in range(3) for e in notifier.emit(judgement(f"c{i}", "hallucination"))]
            assert all(event.wait(30) for event in done)
            held = time.monotonic() - started
        finally:
            notifier.close()
    assert held < ATTEMPT_TIMEOUT_S, f"commits held {held:.1f} s against a 1 s horizon"
    assert outcomes(instruments, "delivered", "given_up") == [0, 3]
    assert len(receiver.deliveries) >= 1


class FailingIds(DeliveredIds):
    """An unexpected error where the delivery thread records a delivery (a bug stands in for any)."""

    def __init__(self) -> None:
        self.calls = 0

    def add(self, result_id: str, url: str, on_written: Any = None) -> threading.Event:
        self.calls += 1
        raise RuntimeError("boom")

    def close(self, timeout_s: float) -> None:
        pass


def test_an_unexpected_error_on_the_delivery_thread_is_counted_said_and_stops_the_consumer(caplog: Any) -> None:
    """As the judge thread's: the owner is told (the consumer stops, saying why); the post stays undone
    (uncommitted, sent again after the restart)."""
    fatal: list[BaseException] = []
    errors: list[int] = []
    stopped = threading.Event()
    with WebhookReceiver() as receiver:
        notifier = Notifier(
            [receiver.url],
            delivered_ids=FailingIds(),
            on_error=lambda: errors.append(1),
            on_fatal=lambda exc: (fatal.append(exc), stopped.set()),
        )
        notifier._delivery.start()  # start() would load the delivered ids from Kafka: this one has none
        try:
            with caplog.at_level(logging.ERROR, logger="tracejudge.consumer.notify"):
                (done,) = notifier.emit(judgement("c1", "hallucination"))
                assert stopped.wait(10), "the delivery thread died in silence"
        finally:
            notifier.close()
    assert [str(exc) for exc in fatal] == ["boom"] and errors == [1] and not done.is_set()
    assert "delivery thread failed; the consumer stops" in caplog.text


def test_without_an_owner_to_stop_the_delivery_thread_goes_on_after_an_unexpected_error() -> None:
    ids = FailingIds()
    errors: list[int] = []
    with WebhookReceiver() as receiver:
        notifier = Notifier([receiver.url], delivered_ids=ids, on_error=lambda: errors.append(1))
        notifier._delivery.start()
        try:
            notifier.emit(judgement("c1", "hallucination"))
            wait_for(lambda: ids.calls == 1, 10, "the first delivery")
            notifier.emit(judgement("c2", "hallucination"))
            wait_for(lambda: ids.calls == 2, 10, "the second delivery, after the error")
            assert notifier._delivery.alive and errors == [1, 1]
        finally:
            notifier.close()
    assert len(receiver.deliveries) == 2


@pytest.fixture
def own_broker() -> Any:
    """A broker of this test's own: it is frozen (SIGSTOP) for a while."""
    try:
        instance = EmbeddedBroker().start()
    except BrokerUnavailable as exc:
        pytest.skip(f"Tansu broker ({exc})")
    yield instance
    process = instance._process
    if process is not None and process.poll() is None:
        process.send_signal(signal.SIGCONT)
    instance.stop()


def test_recording_a_delivery_never_holds_up_the_next_post_and_a_post_is_done_only_once_recorded(
    own_broker: EmbeddedBroker,
) -> None:
    """The broker frozen: the POSTs go on (the old synchronous wait took 10 s per post), but none is done (its
    conversation committable) before its delivery is written; thawed, all are."""
    instruments = NotificationInstruments(CollectorRegistry())
    ids = delivered_ids(own_broker, f"tj-{uuid.uuid4().hex[:8]}-notifications")
    process = own_broker._process
    assert process is not None
    with WebhookReceiver() as receiver:
        notifier = Notifier([receiver.url], instruments=instruments, delivered_ids=ids).start()
        try:
            process.send_signal(signal.SIGSTOP)
            try:
                done = [e for i in range(3) for e in notifier.emit(judgement(f"c{i}", "hallucination"))]
                wait_for(lambda: len(receiver.deliveries) == 3, 8, "three POSTs while the broker is frozen")
                assert not any(event.is_set() for event in done)
                assert outcomes(instruments, "delivered") == [0]
            finally:
                process.send_signal(signal.SIGCONT)
            assert all(event.wait(60) for event in done)
            assert outcomes(instruments, "delivered") == [3]
        finally:
            notifier.close()
    reader = DeliveredIds(own_broker.bootstrap_servers, ids.topic, CONSUMER, None)
    try:
        again = reader.load()
    finally:
        reader.stop_reading()
    assert {result_id for result_id, _ in again} == {json.loads(d.body)["id"] for d in receiver.deliveries}


def test_the_delivered_ids_are_read_to_the_high_watermark(broker: EmbeddedBroker) -> None:
    """More than one poll's worth, in one batch (ONE_BATCH): the old read forgot all but 500 (notified twice after a
    restart)."""
    topic = f"tj-{uuid.uuid4().hex[:8]}-notifications"
    broker.create_topic(topic, 1)
    ids = delivered_ids(broker, topic, **ONE_BATCH)
    events = [ids.add(f"r{i}", "http://127.0.0.1:9/hook") for i in range(1200)]
    assert all(event.wait(30) for event in events)
    ids.close(5)
    reader = DeliveredIds(broker.bootstrap_servers, topic, CONSUMER, None)
    try:
        assert len(reader.load()) == 1200
    finally:
        reader.stop_reading()


def test_follow_waits_for_the_partitions_of_a_topic_created_after_it_started(broker: EmbeddedBroker) -> None:
    topic = f"tj-{uuid.uuid4().hex[:8]}-notifications"
    reader = DeliveredIds(broker.bootstrap_servers, topic, CONSUMER, None)
    assert reader.load() == set()  # no such topic yet
    found: set[tuple[str, str]] = set()
    stop = threading.Event()
    thread = threading.Thread(target=reader.follow, args=(found.update, stop), daemon=True)
    thread.start()
    try:
        broker.create_topic(topic, 1)
        writer = delivered_ids(broker, topic)
        assert writer.add("r1", "http://127.0.0.1:9/hook").wait(30)
        wait_for(lambda: ("r1", "http://127.0.0.1:9/hook") in found, 30, "the id written after follow started")
        writer.close(5)
    finally:
        stop.set()
        thread.join(10)


def test_the_results_topic_is_read_to_its_high_watermark(broker: EmbeddedBroker) -> None:
    from tracejudge.consumer.cli.compare import read_results

    results = f"results-{uuid.uuid4().hex[:8]}"
    broker.create_topic(results, 1)
    writer = KafkaWriter(broker.bootstrap_servers, results, durable=True, **ONE_BATCH).start()
    events = [writer.write(b"c", json.dumps({"result_id": f"r{i}"}).encode()) for i in range(1200)]
    assert all(event.wait(30) for event in events)
    writer.close(5)
    settings = consumer_settings(broker.bootstrap_servers, "unused", results_topic=results)
    assert len(read_results(settings)) == 1200


def test_the_consumer_stops_and_says_why_when_its_notifier_thread_fails(
    broker: EmbeddedBroker, topic: str, judge_server: Any
) -> None:
    """The real consumer: the notifier's delivery thread failing (an error injected where it records a delivery)
    stops the service with that failure, as the judge thread's would; nothing is committed past the undone post."""
    from tests.consumer.test_export_notify import conversations, scripted
    from tests.support.pipeline import RunningConsumer, play, traced_app

    judge_server.responder = scripted()
    with WebhookReceiver() as receiver:
        settings = consumer_settings(broker.bootstrap_servers, topic, metrics="failure_rate", notify_url=[receiver.url])
        consumer = RunningConsumer(settings)
        notifier = consumer.app.outputs.notifier
        assert notifier is not None and notifier.delivered_ids is not None

        def broken(*args: Any, **kwargs: Any) -> threading.Event:
            raise RuntimeError("injected")

        notifier.delivered_ids.add = broken  # type: ignore[method-assign]
        with consumer:
            play(traced_app(broker.bootstrap_servers, topic), dict(list(conversations().items())[:2]))  # conv-01
            consumer.thread.join(120)
            assert not consumer.thread.is_alive(), "the consumer went on without its notifier"
    assert repr(consumer.app.service.failure) == "RuntimeError('injected')"
    assert consumer.value("tracejudge_output_errors_total", output="notify") == 1
