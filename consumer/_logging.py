"""Log setup shared by every subcommand: one stderr handler, text or one JSON object a line, chatty libraries quiet.

kafka-python logs each failed connection attempt (several lines a retry, for as long as a broker is down) and, in
healthy runs, lines that say nothing to an operator (a slow step of its event loop, a metadata refresh cancelled by
`close()`). `KafkaNoise` drops those and rate-limits the connection lines; while the first connection is attempted
(`quiet_kafka_connections`) they are dropped altogether, because what follows is one line: connected, or not.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

# kafka-python loggers whose WARNING/ERROR lines are about connections: one a minute each, with a suppressed count.
CONNECTION_LOGGERS = ("kafka.net", "kafka.conn", "kafka.client", "kafka.cluster", "kafka.coordinator")
CONNECTION_LOG_INTERVAL_S = 60.0

_quiet_lock = threading.Lock()
_quiet_depth = 0


@contextmanager
def quiet_kafka_connections() -> Iterator[None]:
    """While the first connection to the brokers is attempted, drop kafka-python's connection lines: the caller
    says in one line whether it connected."""
    global _quiet_depth
    with _quiet_lock:
        _quiet_depth += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_depth -= 1


def _failed_fetch(name: str, message: str) -> bool:
    """The fetcher's line for each failed fetch (once a second while a broker is down): a connection line too."""
    return name == "kafka.consumer.fetcher" and message.startswith("Fetch to node ")


class KafkaNoise(logging.Filter):
    """On the handler (so it sees records propagated from every `kafka.*` logger)."""

    def __init__(self, interval_s: float = CONNECTION_LOG_INTERVAL_S) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._last: dict[tuple[str, str], float] = {}
        self._suppressed: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("kafka"):
            return True
        message = str(record.msg)
        if "blocking the event loop" in message:  # kafka.net.selector: a slow step of its IO loop, not ours to fix
            return False
        if message.startswith("Metadata refresh: failed") and any(
            type(arg).__name__ == "Cancelled" for arg in record.args or ()
        ):  # a refresh in flight when the client closes
            return False
        if not record.name.startswith(CONNECTION_LOGGERS) and not _failed_fetch(record.name, message):
            return True
        if _quiet_depth:
            return False
        key = (record.name, message)
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(key, -float("inf")) < self.interval_s:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            self._last[key] = now
            suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            record.msg = f"{message} ({suppressed} similar lines suppressed)"
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(KafkaNoise())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    for noisy in ("kafka", "LiteLLM", "litellm", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("kafka.coordinator").setLevel(logging.ERROR)
