"""The HTTP plumbing the tests' stand-in servers share: a handler class served from a thread on 127.0.0.1."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler without access logs, which would only clutter the test output."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class LoopbackHTTPServer:
    """`handler` served on a free 127.0.0.1 port from a daemon thread, once started until stopped."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], *, name: str | None = None) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
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
        self.httpd.shutdown()
        self.httpd.server_close()
