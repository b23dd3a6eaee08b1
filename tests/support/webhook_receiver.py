"""A webhook endpoint on 127.0.0.1 that records every POST (headers and body) and answers `status` (settable).

`location`: sent with the answer (a 3xx's target; a GET there is recorded in `gets` and answered 200). `hold`: while
it is clear, a POST is recorded and then not answered until it is set (a hanging endpoint)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from tests.support.loopback import LoopbackHTTPServer, QuietHandler


@dataclass(frozen=True)
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # what the receiver answered


class WebhookReceiver:
    def __init__(self, status: int = 200, *, location: str | None = None, hold: threading.Event | None = None) -> None:
        self.status = status
        self.location = location
        self.hold = hold
        self.deliveries: list[Delivery] = []
        self.gets: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                with receiver._lock:
                    status = receiver.status
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    receiver.deliveries.append(Delivery(self.path, headers, body, status))
                if receiver.hold is not None:
                    receiver.hold.wait(60)
                self.send_response(status)
                if receiver.location:
                    self.send_header("location", receiver.location)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                with receiver._lock:
                    receiver.gets.append(self.path)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

        self._http = LoopbackHTTPServer(Handler, name="webhook-receiver")

    @property
    def url(self) -> str:
        return f"{self._http.url}/hook"

    def accepted(self) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if 200 <= d.status < 300]

    def refused(self) -> int:
        with self._lock:
            return sum(1 for d in self.deliveries if d.status >= 300)

    def __enter__(self) -> WebhookReceiver:
        self._http.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.hold is not None:
            self.hold.set()
        self._http.stop()
