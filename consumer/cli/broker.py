"""`tracejudge broker`: a local Kafka in one command (the embedded Tansu), so the quickstart needs no Kafka install.

It listens on 127.0.0.1 only, keeps everything in memory, creates the span topic (so a consumer started first finds
it) and runs until SIGINT, SIGTERM or SIGHUP, then stops Tansu and exits 0. A port already taken, a missing Tansu
binary or a broker that dies is one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
from typing import Any

from ..embedded_broker import BrokerUnavailable, EmbeddedBroker

DEFAULT_PORT = 9092
DEFAULT_TOPIC = "otlp_spans"
EXIT_FAILED = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="the port on 127.0.0.1 to listen on (default %(default)s)"
    )
    parser.add_argument(
        "--topic",
        action="append",
        metavar="NAME",
        help=f"a topic to create at start, repeatable; others are created on first use (default {DEFAULT_TOPIC})",
    )
    parser.add_argument(
        "--partitions", type=int, default=1, help="partitions of each created topic (default %(default)s)"
    )


def port_taken(port: int) -> bool:
    """Whether something already listens on 127.0.0.1:port (probed as Tansu binds: with SO_REUSEADDR)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def fail(message: str) -> int:
    print(f"tracejudge broker: {message}", file=sys.stderr, flush=True)
    return EXIT_FAILED


def run_broker(namespace: argparse.Namespace) -> int:
    port: int = namespace.port
    topics: list[str] = namespace.topic or [DEFAULT_TOPIC]
    if not 0 < port < 65536:
        return fail(f"--port {port} is not a TCP port (1-65535)")
    if namespace.partitions < 1:
        return fail(f"--partitions {namespace.partitions} must be at least 1")
    if port_taken(port):
        return fail(f"127.0.0.1:{port} is already in use (another Kafka?): stop it or pass --port")
    stop = threading.Event()

    def on_signal(_signum: int, _frame: Any) -> None:
        stop.set()

    # Tansu stays in our process group, so a closed terminal or a Ctrl-C reaches it too and nothing is left behind.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    try:
        broker = EmbeddedBroker(port).start()
    except BrokerUnavailable as exc:
        return fail(str(exc))
    try:
        from ..kafka import KafkaError

        try:
            for topic in topics:
                broker.create_topic(topic, partitions=namespace.partitions)
        except KafkaError as exc:
            return fail(f"could not create the topics {', '.join(topics)}: {exc}")
        print(
            f"Kafka (embedded Tansu, in memory) at {broker.bootstrap_servers}, topic {', '.join(topics)}; "
            "Ctrl-C or SIGTERM stops it",
            flush=True,
        )
        # Wake on a signal at once; look at Tansu twice a second so a broker that dies is reported, not waited on.
        while not stop.wait(0.5):
            code = broker.returncode()
            if code is not None and not stop.is_set():
                return fail(f"Tansu exited with code {code}")
    finally:
        broker.stop()
    print("broker stopped", flush=True)
    return 0
