"""What a user can get wrong at start is one line on stderr and a non-zero exit, through the real `tracejudge` CLI:
a broker that is down (bounded wait), a metrics port in use, an OTLP endpoint that is not a URL. A new group says at
start what joining means, and "ready" comes once partitions are assigned; a replica that gets none says so once.
kafka-python's noise is tamed."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import Cancelled
from kafka.structs import OffsetAndMetadata

from tests.support.pipeline import HEARTBEAT_MS, SESSION_MS, wait_for
from tracejudge.consumer._logging import KafkaNoise, quiet_kafka_connections
from tracejudge.consumer.embedded_broker import EmbeddedBroker, free_port
from tracejudge.consumer.service import EXIT_UNAVAILABLE

ROOT = Path(__file__).resolve().parents[2]


def tracejudge(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TRACEJUDGE_JUDGE_CHECK": "false",  # Kafka's errors, not the judge's
        # the user's defaults but a short group session: the join's length is not what these tests test
        "TRACEJUDGE_KAFKA_CONFIG": f"session_timeout_ms={SESSION_MS},heartbeat_interval_ms={HEARTBEAT_MS}",
    }
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    return completed, time.monotonic() - started


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_consume_with_the_broker_down_is_one_line_within_seconds() -> None:
    closed = free_port()  # nothing listens there
    completed, took = tracejudge(
        "consume", "--bootstrap-servers", f"127.0.0.1:{closed}", "--metrics-host", "127.0.0.1", "--metrics-port", "0"
    )
    assert completed.returncode == EXIT_UNAVAILABLE == 69, completed.stderr
    line = one_line(completed.stderr)
    assert line.startswith("tracejudge: cannot reach Kafka at 127.0.0.1:") and "within 5 s" in line
    assert "bootstrap_timeout_ms" in line  # how to wait longer
    assert took < 60, took  # 5 s of connecting; the rest is the interpreter and imports on a loaded machine
    print(f"\nbroker down: exit {completed.returncode} after {took:.1f} s: {line}")


def test_the_wait_for_a_down_broker_follows_bootstrap_timeout_ms() -> None:
    closed = free_port()
    completed, _ = tracejudge(
        "consume",
        "--bootstrap-servers",
        f"127.0.0.1:{closed}",
        "--results-topic",
        "results",  # the results writer connects too: same one line
        "--metrics-host",
        "127.0.0.1",
        "--metrics-port",
        "0",
        "--kafka-config",
        "bootstrap_timeout_ms=1000",
    )
    assert completed.returncode == EXIT_UNAVAILABLE, completed.stderr
    assert "within 1 s" in one_line(completed.stderr)


def test_backfill_with_the_broker_down_is_one_line() -> None:
    closed = free_port()
    completed, _ = tracejudge(
        "backfill",
        "--from",
        "2026-11-01",
        "--to",
        "2026-11-02",
        "--bootstrap-servers",
        f"127.0.0.1:{closed}",
        "--results-topic",
        "results",
    )
    assert completed.returncode == EXIT_UNAVAILABLE, completed.stderr
    assert one_line(completed.stderr).startswith("tracejudge backfill: cannot reach Kafka at 127.0.0.1:")


def test_consume_with_the_metrics_port_in_use_is_one_line() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        # The broker is down too: the port is checked first, so the answer is the port's, at once.
        completed, _ = tracejudge(
            "consume",
            "--bootstrap-servers",
            f"127.0.0.1:{free_port()}",
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(port),
        )
    assert completed.returncode == 2, completed.stderr
    line = one_line(completed.stderr)
    assert line.startswith("tracejudge: invalid configuration: --metrics-port / TRACEJUDGE_METRICS_PORT:")
    assert f"127.0.0.1:{port}" in line and "in use" in line


@pytest.mark.parametrize("endpoint", ["not-a-url", "collector:4318", "http://", "http://collector:port"])
def test_an_otlp_endpoint_that_is_not_a_url_is_a_configuration_error(endpoint: str) -> None:
    completed, _ = tracejudge("consume", "--otlp-endpoint", endpoint)
    assert completed.returncode == 2, completed.stderr
    line = one_line(completed.stderr)
    assert line.startswith("tracejudge: invalid configuration: --otlp-endpoint / OTEL_EXPORTER_OTLP_ENDPOINT:"), line


@contextmanager
def consume_process(broker: EmbeddedBroker, topic: str, group: str) -> Iterator[tuple[subprocess.Popen, list[str]]]:
    """`tracejudge consume` with its stderr lines collected as they come (the default --start-from latest)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TRACEJUDGE_JUDGE_CHECK": "false",  # Kafka's errors, not the judge's
        # the user's defaults but a short group session: the join's length is not what these tests test
        "TRACEJUDGE_KAFKA_CONFIG": f"session_timeout_ms={SESSION_MS},heartbeat_interval_ms={HEARTBEAT_MS}",
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tracejudge.consumer",
            "consume",
            "--bootstrap-servers",
            broker.bootstrap_servers,
            "--topic",
            topic,
            "--group-id",
            group,
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            "0",
        ],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    assert process.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        yield process, lines
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
        reader.join(10)


def test_a_new_group_says_what_joining_means_and_ready_follows_assignment(broker: EmbeddedBroker, topic: str) -> None:
    group = f"tj-new-{uuid.uuid4().hex[:8]}"
    with consume_process(broker, topic, group) as (process, lines):
        wait_for(lambda: any("ready:" in line for line in lines), timeout=90, what="ready")
        joining = next(i for i, line in enumerate(lines) if "no committed offsets" in line)
        ready = next(i for i, line in enumerate(lines) if "ready:" in line)
        assert joining < ready
        note = lines[joining]
        assert "skipped with --start-from latest" in note and "--start-from earliest" in note and group in note
        assert "ready: consuming partitions [0, 1, 2]" in lines[ready]
        assert not any("Traceback" in line or " ERROR " in line for line in lines), lines
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0

    # A group with a commit: no such note. (Another group: a fresh one has no offsets whatever the stopped consumer
    # committed.)
    group = f"tj-committed-{uuid.uuid4().hex[:8]}"
    committer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id=group, enable_auto_commit=False)
    try:
        committer.assign([TopicPartition(topic, 0)])
        committer.commit({TopicPartition(topic, 0): OffsetAndMetadata(0, "", -1)})
    finally:
        committer.close()
    with consume_process(broker, topic, group) as (_process, lines):
        wait_for(lambda: any("joining topic" in line for line in lines), timeout=60, what="the joining line")
        assert not any("no committed offsets" in line for line in lines), lines


def test_a_replica_without_a_partition_says_so_once_with_the_count_and_how_to_scale(broker: EmbeddedBroker) -> None:
    """Two replicas of one group on a one-partition topic: the second joins, gets nothing, and says so once (not
    silence); the first never does. When the first stops, the second takes the partition over, as the line says."""
    topic = f"spans-one-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, partitions=1)
    group = f"tj-one-{uuid.uuid4().hex[:8]}"
    with consume_process(broker, topic, group) as (first, first_lines):
        wait_for(lambda: any("ready:" in line for line in first_lines), timeout=120, what="the first replica ready")
        assert any("ready: consuming partitions [0]" in line for line in first_lines), first_lines
        with consume_process(broker, topic, group) as (second, second_lines):
            notice = "no partition for this replica"
            wait_for(lambda: any(notice in line for line in second_lines), timeout=180, what="the no-partition line")
            line = next(line for line in second_lines if notice in line)
            assert f"topic {topic!r} has 1 partition and the other members of group {group!r} own it" in line
            assert "stands by" in line and "more partitions" in line and "--group-id" in line
            assert not any("ready:" in other for other in second_lines), second_lines
            first.send_signal(signal.SIGTERM)  # the owner leaves: the replica standing by takes over
            assert first.wait(60) == 0
            wait_for(
                lambda: any("ready: consuming partitions [0]" in other for other in second_lines),
                timeout=180,
                what="the standby taking the partition over",
            )
            assert sum(notice in other for other in second_lines) == 1, second_lines  # said once
            assert not any(notice in other for other in first_lines), first_lines
            lines = first_lines + second_lines
            told = [n for n, other in enumerate(lines) if "Traceback" in other]
            assert not told, "\n".join(lines[told[0] - 2 : told[0] + 30]) if told else ""
            second.send_signal(signal.SIGTERM)
            assert second.wait(60) == 0


def record(name: str, level: int, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_kafka_noise_drops_what_says_nothing_and_rate_limits_connection_lines() -> None:
    noise = KafkaNoise(interval_s=0.2)
    slow = "Task <Task poll> ran for 0.380s (>0.100s threshold). It is blocking the event loop -- likely a tight loop"
    assert not noise.filter(record("kafka.net.selector", logging.WARNING, slow))
    assert not noise.filter(record("kafka.cluster", logging.ERROR, "Metadata refresh: failed %s", Cancelled()))
    assert noise.filter(record("kafka.cluster", logging.ERROR, "Metadata refresh: failed %s", ValueError("x")))
    assert noise.filter(record("tracejudge.consumer", logging.WARNING, "ours"))

    failed = "Connection failed: %s"
    assert noise.filter(record("kafka.net.manager", logging.ERROR, failed, "ECONNREFUSED"))
    assert not noise.filter(record("kafka.net.manager", logging.ERROR, failed, "ECONNREFUSED"))
    assert not noise.filter(record("kafka.net.manager", logging.ERROR, failed, "ECONNREFUSED"))
    time.sleep(0.25)  # the interval itself is what is tested here
    again = record("kafka.net.manager", logging.ERROR, failed, "ECONNREFUSED")
    assert noise.filter(again) and "(2 similar lines suppressed)" in again.getMessage()
    with quiet_kafka_connections():
        time.sleep(0.25)
        assert not noise.filter(record("kafka.net.manager", logging.ERROR, failed, "ECONNREFUSED"))
        assert noise.filter(record("kafka.consumer.fetcher", logging.WARNING, "not a connection line"))
        # a failed fetch (once a second while the broker is down mid-read: export, compare) is a connection line
        fetch = "Fetch to node %s failed: %s"
        assert not noise.filter(record("kafka.consumer.fetcher", logging.ERROR, fetch, 111, "ECONNREFUSED"))
    assert noise.filter(record("kafka.consumer.fetcher", logging.ERROR, fetch, 111, "ECONNREFUSED"))
    assert not noise.filter(record("kafka.consumer.fetcher", logging.ERROR, fetch, 111, "ECONNREFUSED"))
