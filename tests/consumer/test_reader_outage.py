"""Reading a topic to its end when the broker dies or freezes mid-read (the real Tansu broker, SIGKILL / SIGSTOP):
`compare` / `export` (read_results) and the consumer's start (the delivered notifications) stop with one
KafkaUnreachable (exit 69) once the read makes no progress for the stall bound, never hang; so does the partition
lookup before it, which kafka-python makes without a timeout. Ctrl-C ends `export` with one line and exit 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.support.pipeline import consumer_settings
from tracejudge.consumer._errors import EXIT_UNAVAILABLE, KafkaUnreachable
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit import KafkaWriter
from tracejudge.consumer.emit.notify import NotificationInstruments

STALL_S = 3.0  # the bound under test (one fetch's request timeout, ~31 s by default), shortened


@pytest.fixture
def own_broker() -> Any:
    instance = EmbeddedBroker().start()
    yield instance
    process = instance._process
    if process is not None and process.poll() is None:
        process.send_signal(signal.SIGCONT)
    instance.stop()


@pytest.fixture
def short_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    import tracejudge.consumer.kafka.reader as topic_reader

    monkeypatch.setattr(topic_reader, "MIN_STALL_S", STALL_S)
    monkeypatch.setattr(topic_reader, "REQUEST_TIMEOUT_MS", 500)  # one fetch's bound, shortened with it


def _fill(broker: EmbeddedBroker, topic: str, n: int = 400) -> None:
    broker.create_topic(topic, 1)
    writer = KafkaWriter(broker.bootstrap_servers, topic, durable=True, batch_size=1 << 20, linger_ms=200).start()
    events = [writer.write(b"c", json.dumps({"result_id": f"r{i}", "x": "y" * 2000}).encode()) for i in range(n)]
    assert all(event.wait(60) for event in events)
    writer.close(5)


def _in_thread(call: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # handed to the test
            out.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_read_results_stops_with_kafka_unreachable_when_the_broker_vanishes_mid_read(
    own_broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch, short_stall: None, how: signal.Signals
) -> None:
    import tracejudge.consumer.kafka.reader as topic_reader
    from tracejudge.consumer.cli.compare import read_results

    results = f"results-{uuid.uuid4().hex[:8]}"
    _fill(own_broker, results, n=3000)  # more than the client prefetches: the read is mid-way when it vanishes
    original = topic_reader.records_to_end
    vanished = threading.Event()

    def vanishing(consumer: Any, partitions: Any, **kwargs: Any) -> Any:
        for n, record in enumerate(original(consumer, partitions, **kwargs)):
            if n == 10:
                assert own_broker._process is not None
                own_broker._process.send_signal(how)
                vanished.set()
            yield record

    monkeypatch.setattr(topic_reader, "records_to_end", vanishing)
    settings = consumer_settings(
        own_broker.bootstrap_servers,
        "unused",
        results_topic=results,
        kafka_config={"max_partition_fetch_bytes": 8192, "fetch_max_bytes": 8192},  # many fetches: read mid-way
    )
    thread, out = _in_thread(lambda: read_results(settings))
    thread.join(STALL_S + 30)
    assert not thread.is_alive(), "read_results still running long after the broker vanished"
    assert vanished.is_set()
    assert len(out) == 1 and isinstance(out[0], KafkaUnreachable), out
    assert out[0].exit_code == EXIT_UNAVAILABLE and "\n" not in str(out[0])
    assert "no progress for 5 s" in str(out[0])  # the bootstrap timeout (5 s) is longer than the shortened floor


def test_the_partition_lookup_is_bounded_when_the_broker_freezes(
    own_broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch, short_stall: None
) -> None:
    from kafka import KafkaConsumer

    from tracejudge.consumer.cli.compare import read_results

    results = f"results-{uuid.uuid4().hex[:8]}"
    own_broker.create_topic(results, 1)
    original = KafkaConsumer.partitions_for_topic

    def freezing(self: Any, topic: str) -> Any:
        assert own_broker._process is not None
        own_broker._process.send_signal(signal.SIGSTOP)
        return original(self, topic)

    monkeypatch.setattr(KafkaConsumer, "partitions_for_topic", freezing)
    settings = consumer_settings(own_broker.bootstrap_servers, "unused", results_topic=results)
    thread, out = _in_thread(lambda: read_results(settings))
    thread.join(STALL_S + 30)
    assert not thread.is_alive(), "read_results hangs in partitions_for_topic with the broker frozen"
    assert len(out) == 1 and isinstance(out[0], KafkaUnreachable), out


def test_consume_start_fails_with_kafka_unreachable_when_the_delivered_ids_read_stalls(
    own_broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch, short_stall: None
) -> None:
    """build_notifier reads `<group>-notifications` to its end; the broker frozen mid-read once stuck the start with
    no way to stop it. Now the start fails with KafkaUnreachable (consume: one line, exit 69)."""
    import tracejudge.consumer.kafka.table as table
    from tracejudge.consumer.app import build_notifier

    settings = consumer_settings(own_broker.bootstrap_servers, "unused", notify_url=["http://127.0.0.1:9/hook"])
    topic = f"{settings.group_id}-notifications"
    own_broker.create_topic(topic, 1)
    writer = KafkaWriter(own_broker.bootstrap_servers, topic, durable=True).start()
    assert all(writer.write(f"r{i}\x1fhttp://127.0.0.1:9/hook".encode(), b"1").wait(30) for i in range(20))
    writer.close(5)

    class Freezing(table.TopicReader):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            # Frozen once connected, before the partitions are assigned: kafka-python's IO thread fetches as soon as
            # they are, and a fetch answered before a freeze at the first poll let the whole read finish (CI, loaded).
            assert own_broker._process is not None
            own_broker._process.send_signal(signal.SIGSTOP)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(table, "TopicReader", Freezing)
    thread, out = _in_thread(lambda: build_notifier(settings, NotificationInstruments(CollectorRegistry())))
    thread.join(STALL_S + 30)
    assert not thread.is_alive(), "consumer start stuck in the delivered-ids read with the broker frozen"
    assert len(out) == 1 and isinstance(out[0], KafkaUnreachable), out
    assert out[0].exit_code == EXIT_UNAVAILABLE


def test_ctrl_c_ends_export_with_one_line_and_exit_130(own_broker: EmbeddedBroker, tmp_path: Any) -> None:
    """The broker frozen after the connection: export waits for progress; SIGINT is one line and exit 130."""
    results = f"results-{uuid.uuid4().hex[:8]}"
    _fill(own_broker, results, n=50)
    process = subprocess.Popen(
        [sys.executable, "-m", "tracejudge.consumer", "export", "--bootstrap-servers", own_broker.bootstrap_servers,
         "--results-topic", results, "--output", str(tmp_path / "out.jsonl"), "--log-level", "INFO"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )  # fmt: skip
    try:
        assert process.stderr is not None
        assert own_broker._process is not None
        own_broker._process.send_signal(signal.SIGSTOP)  # whatever it had read, it waits 15 s for more
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert process.returncode in (130, EXIT_UNAVAILABLE) or process.returncode == -signal.SIGINT, (
        process.returncode,
        stderr,
    )
    assert "Traceback" not in stderr, stderr
    assert len(lines) <= 1, stderr


def test_a_failed_delivered_ids_write_is_counted_as_a_notify_output_error_and_names_the_topic(
    own_broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """build_notifier's `<group>-notifications` writer once had no on_error: its failures were neither counted in
    tracejudge_output_errors_total nor said with the topic and the grants it needs."""
    import logging

    from tests.support.pipeline import wait_for
    from tracejudge.consumer.app import build_notifier

    settings = consumer_settings(
        own_broker.bootstrap_servers,
        "unused",
        notify_url=["http://127.0.0.1:9/hook"],
        # the producer gives a send up after 5 s without a broker, not kafka-python's 60: how long is not tested here
        kafka_config={"max_block_ms": 5000},
    )
    errors: list[str] = []
    notifier = build_notifier(settings, NotificationInstruments(CollectorRegistry()), errors.append)
    try:
        assert own_broker._process is not None
        own_broker._process.send_signal(signal.SIGKILL)
        own_broker._process.wait(10)
        assert notifier.delivered_ids is not None
        with caplog.at_level(logging.WARNING, logger="tracejudge.consumer"):
            notifier.delivered_ids.add("r1", "http://127.0.0.1:9/hook")
            wait_for(lambda: "notify" in errors, timeout=90)
    finally:
        notifier.close(1)
    topic = f"{settings.group_id}-notifications"
    assert any(f"Write and Describe topic {topic!r}" in r.getMessage() for r in caplog.records), caplog.text
