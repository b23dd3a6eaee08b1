"""`tracejudge broker` through the real CLI: a local Kafka that serves, creates its topics and stops cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer

from tests.conftest import missing_part
from tracejudge.consumer.embedded_broker import BrokerUnavailable, free_port, tansu_binary


@pytest.fixture(autouse=True)
def tansu_present() -> None:
    try:
        tansu_binary()
    except BrokerUnavailable as exc:
        missing_part(f"Tansu broker ({exc})")


class BrokerCommand:
    """`python -m tracejudge.consumer broker ...` with its output read as it comes."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tracejudge.consumer", "broker", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout: list[str] = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.stdout.append(line.rstrip("\n"))
            if line.startswith("Kafka "):
                self._ready.set()
        self._ready.set()

    def wait_ready(self) -> str:
        assert self._ready.wait(30), "the broker never said where it listens"
        assert self.stdout and self.stdout[0].startswith("Kafka "), self.finish(5)
        return self.stdout[0]

    def tansu_pid(self) -> int:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        assert len(children) == 1, children
        return int(children[0])

    def finish(self, timeout: float) -> tuple[int, str]:
        """Exit code and stderr once the command has exited (stdout is the reader thread's alone)."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        self._reader.join(10)
        assert self.process.stderr is not None
        return self.process.returncode, self.process.stderr.read()


@pytest.fixture
def commands() -> Iterator[list[BrokerCommand]]:
    started: list[BrokerCommand] = []
    yield started
    for command in started:
        if command.process.poll() is None:
            command.process.kill()
            command.process.wait(10)


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def wait_until_closed(port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while listening(port):
        assert time.monotonic() < deadline, f"127.0.0.1:{port} still accepts connections: Tansu was left running"
        time.sleep(0.05)


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_serves_kafka_creates_topics_and_stops_cleanly(
    commands: list[BrokerCommand], stop_signal: signal.Signals
) -> None:
    port = free_port()
    command = BrokerCommand("--port", str(port), "--topic", "spans_a", "--topic", "spans_b", "--partitions", "3")
    commands.append(command)
    banner = command.wait_ready()
    assert f"127.0.0.1:{port}" in banner and "spans_a, spans_b" in banner
    bootstrap = f"127.0.0.1:{port}"
    probe = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        assert probe.topics() >= {"spans_a", "spans_b"}
        assert [len(probe.partitions_for_topic(t) or ()) for t in ("spans_a", "spans_b")] == [3, 3]
    finally:
        probe.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send("spans_a", key=b"conversation-1", value=b"a record").get(10)
    producer.close()
    consumer = KafkaConsumer(
        "spans_a", bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=10_000
    )
    try:
        assert [record.value for record in consumer][:1] == [b"a record"]
    finally:
        consumer.close()
    tansu = command.tansu_pid()
    command.process.send_signal(stop_signal)
    code, stderr = command.finish(30)
    assert (code, stderr) == (0, "")
    assert command.stdout[-1] == "broker stopped"
    wait_until_closed(port)
    assert not Path(f"/proc/{tansu}").exists() or "zombie" in Path(f"/proc/{tansu}/status").read_text()


def test_default_port_and_topic_in_help() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "broker", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert "(default 9092)" in completed.stdout and "(default otlp_spans)" in completed.stdout
    assert "(default 1)" in completed.stdout


def test_port_in_use_is_one_line_and_exit_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        completed = subprocess.run(
            [sys.executable, "-m", "tracejudge.consumer", "broker", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert completed.returncode == 1 and completed.stdout == ""
    assert (
        completed.stderr
        == f"tracejudge broker: 127.0.0.1:{port} is already in use (another Kafka?): stop it or pass --port\n"
    )


@pytest.mark.parametrize(
    ("args", "message"), [(("--port", "70000"), "--port 70000"), (("--partitions", "0"), "--partitions 0")]
)
def test_bad_numbers_are_one_line_and_exit_1(args: tuple[str, str], message: str) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "broker", *args], capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 1 and completed.stderr.startswith(f"tracejudge broker: {message}")
    assert completed.stderr.count("\n") == 1


def test_a_broker_that_dies_is_reported(commands: list[BrokerCommand]) -> None:
    port = free_port()
    command = BrokerCommand("--port", str(port))
    commands.append(command)
    command.wait_ready()
    os.kill(command.tansu_pid(), signal.SIGKILL)
    code, stderr = command.finish(30)
    assert code == 1
    assert stderr == f"tracejudge broker: Tansu exited with code {-signal.SIGKILL}\n"
    assert "broker stopped" not in command.stdout
