"""The HTTP plumbing the tests' stand-in servers share: a handler class served from a thread on 127.0.0.1."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler without access logs, which would only clutter the test output."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class ClosingHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server whose close ends every connection it holds and joins their threads.

    A client that keeps connections alive (LiteLLM's shared httpx pool, the OTLP and webhook senders) holds a handler
    thread blocked on its socket for as long as it likes; `server_close` would leave those threads running after the
    test that started the server. Each open connection is shut down first, so each thread ends and is joined."""

    daemon_threads = True
    block_on_close = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        with self._open_lock:
            open_connections = list(self._open)
        for connection in open_connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        socketserver.TCPServer.server_close(self)
        deadline = time.monotonic() + 10  # a handler sleeping out a scripted delay is given that long
        threads = getattr(self, "_threads", None)  # a list once a request came (block_on_close), else a stand-in
        for thread in list(threads) if isinstance(threads, list) else []:
            thread.join(max(0.0, deadline - time.monotonic()))


class LoopbackHTTPServer:
    """`handler` served on a free 127.0.0.1 port from a daemon thread, once started until stopped; `stop` ends every
    connection and joins every thread it started."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], *, name: str | None = None) -> None:
        self.httpd = ClosingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)
