"""The notifier's time bounds against real HTTP endpoints on 127.0.0.1: an attempt ends at its deadline however the
endpoint answers (urllib's own timeout bounds each read only), posts are given up on time while an attempt is under
way, a healthy slow endpoint is never cut short because another endpoint's post is older, and every give-up is said."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.consumer.test_notify_export_units import judgement
from tests.support.loopback import LoopbackHTTPServer
from tests.support.webhook_receiver import WebhookReceiver
from tracejudge.consumer.emit.notify import NotificationInstruments, Notifier


def _count(instruments: NotificationInstruments, outcome: str) -> float:
    return instruments.notifications.labels(outcome=outcome)._value.get()


class Trickler:
    """Answers `200` then one byte of a header line every 0.3 s for `total_s`: every read gets data in time."""

    def __init__(self, total_s: float = 20.0) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.total_s = total_s
        self.requests = 0
        self.cut = 0  # connections the client shut before the answer ended
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        self.requests += 1
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        deadline = time.monotonic() + self.total_s
        while time.monotonic() < deadline:
            try:
                conn.sendall(b"X")  # a header line that never ends
            except OSError:
                self.cut += 1
                return
            if self.stop.wait(0.3):
                break
        conn.close()

    def close(self) -> None:
        self.stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (closing the socket alone would not)
        except OSError:
            pass
        self.sock.close()


# timing-sensitive: asserts how long it took, so it runs alone (tests/run_suite.py's serial phase)
@pytest.mark.serial
def test_a_trickling_endpoint_is_cut_at_the_horizon_and_frees_the_commits() -> None:
    """200 then a byte every 0.3 s for 20 s: both posts are given up within a little more than the 1 s horizon (the
    second one by the timer while the first's attempt is still reading), and the connection is shut."""
    server = Trickler(total_s=20.0)
    instruments = NotificationInstruments(CollectorRegistry())
    notifier = Notifier([server.url], instruments=instruments, retry_for_s=1.0, base_backoff_s=0.05).start()
    try:
        started = time.monotonic()
        done = [e for i in range(2) for e in notifier.emit(judgement(f"c{i}", "hallucination"))]
        assert all(e.wait(8) for e in done), "commits still held 8 s against a 1 s --notify-retry-for"
        held = time.monotonic() - started
        assert held < 3.0, f"held {held:.1f} s against a 1 s horizon"
        assert (_count(instruments, "given_up"), _count(instruments, "delivered")) == (2, 0)
    finally:
        server.close()
        notifier.close(1)


class Slow:
    """Takes `delay_s` to answer 200; records the event ids it received."""

    def __init__(self, delay_s: float) -> None:
        self.ids: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                outer.ids.append(json.loads(body)["id"])
                time.sleep(delay_s)  # the endpoint's own slowness, not a barrier
                try:
                    self.send_response(200)
                    self.send_header("content-length", "0")
                    self.end_headers()
                except OSError:
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = LoopbackHTTPServer(Handler)
        self.server.start()
        self.url = f"{self.server.url}/hook"


def test_an_older_post_to_a_failing_endpoint_does_not_cut_a_healthy_slow_one() -> None:
    """A failing endpoint's post near its horizon once shortened every attempt: the slow (1 s) healthy endpoint was
    cut after it had the POST, and got the same event again. Each attempt is bounded by its own post's horizon."""
    instruments = NotificationInstruments(CollectorRegistry())
    offset = [0.0]
    slow = Slow(1.0)
    with WebhookReceiver(status=500) as failing:
        notifier = Notifier(
            [failing.url, slow.url],
            instruments=instruments,
            retry_for_s=3.0,
            base_backoff_s=0.05,
            clock=lambda: time.monotonic() + offset[0],
        ).start()
        try:
            first = notifier.emit(judgement("c1", "hallucination"))
            offset[0] += 2.2  # the clock jumps: c1's posts have < 1 s of their horizon left
            second = notifier.emit(judgement("c2", "hallucination"))
            assert all(e.wait(20) for e in first + second)
        finally:
            notifier.close()
            slow.server.stop()
    assert sorted(slow.ids) == sorted(set(slow.ids)), f"the healthy endpoint got duplicates: {slow.ids}"
    # c2 (its whole horizon ahead) reaches the slow endpoint once; c1's attempt there had only its own 0.8 s left
    assert _count(instruments, "delivered") == 1
    assert _count(instruments, "given_up") == 3


def test_every_given_up_notification_is_said(caplog: Any) -> None:
    """The 'retried' warnings of the same minute once suppressed the give-up line; now the first give-up is said at
    once and later ones in a summary when the notifier closes (or the minute is over)."""
    instruments = NotificationInstruments(CollectorRegistry())
    with WebhookReceiver(status=500) as receiver:
        notifier = Notifier([receiver.url], instruments=instruments, retry_for_s=1.0, base_backoff_s=0.05).start()
        try:
            with caplog.at_level(logging.WARNING, logger="tracejudge.consumer.notify"):
                (done,) = notifier.emit(judgement("c1", "hallucination"))
                assert done.wait(10)
                later = [e for i in (2, 3) for e in notifier.emit(judgement(f"c{i}", "hallucination"))]
                assert all(e.wait(10) for e in later)
                notifier.close()
        finally:
            notifier.close()
    assert _count(instruments, "given_up") == 3
    lines = [r.getMessage() for r in caplog.records]
    assert any("result " in line and "given up after" in line for line in lines), lines
    assert any(line.startswith("2 more notifications given up") for line in lines), lines
