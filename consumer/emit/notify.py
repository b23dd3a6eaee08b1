"""Notifications per verdict: one HTTP POST per matching verdict (`--notify-url`, `--notify-on`), off the judge path.

A CloudEvents 1.0 JSON event in structured mode (the CNCF SDK makes it; `id` is the result id, `subject` the
conversation id, `data` the result record and a link to the trace) or a Slack incoming-webhook message; signed with
HMAC-SHA256 when a secret is set. `emit` only queues: one delivery thread posts, retrying with backoff for at most
`retry_for` seconds, so a failing endpoint slows no judgement, and holds a conversation's commit (the events `emit`
returns) no longer than that: an attempt has a deadline (5 s, and never past its own post's horizon) after which its
socket is shut down, whatever the endpoint does (urllib's timeout bounds each read, not the answer: an endpoint
trickling a byte at a time would keep it forever), and at most 64 KiB of the answer is read; a timer thread gives up
the other waiting posts when their horizon passes, even while an attempt is under way (one delivery thread, not
several: a failing endpoint then costs one connection, and posts keep their order; a healthy endpoint answers well
within the 5 s an attempt may take, and is never cut short because another post is older). A redirect is not followed (a
POST re-sent as a GET elsewhere is no delivery): it is a failed attempt, retried, and said. At least once: a verdict
whose POST did not succeed, or whose delivery is not yet written to the delivered-ids topic, keeps its conversation
uncommitted, so a restart sends it again; a duplicate of a result still being posted waits for it. Never twice for one
result id in a process; across restarts the delivered ids are kept in a compacted topic (`<group>-notifications`, read
back to its high watermark at start and followed while running, so what another replica delivered is known here after a
rebalance), so a replay after a crash is not sent again either. A repeat (the receiver can dedupe on `id`) remains
where a delivery cannot be known: an answer lost or late after the endpoint took the POST, a delivery whose record was
not acknowledged before the process ended, a rebalance before the record was read, a replay past the topic's
retention (docs/feedback-and-backfill.md lists them). The delivery thread never waits for that write (it completes the
post when the broker acknowledges it). Per agent a token bucket (`rate_per_minute`) holds back the excess, counted; the
agent's next event says how many. An unexpected error on the delivery thread is counted, logged and handed to `on_fatal`
(the consumer stops and says why, as for its judge thread); without `on_fatal` the thread keeps going.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import http.client
import itertools
import json
import logging
import math
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from tracejudge._shared.bounded_worker import Backoff, BoundedWorker
from tracejudge._shared.rate_limited_log import RateLimitedLog

from ..judging.judgement import Judgement
from ..judging.results import result_record
from ..kafka import KafkaClients
from ..kafka.connect import reaching_kafka
from ..kafka.table import CompactedTable
from ..kafka.topics import NOTIFICATIONS, TopicLayout, TopicSpec, ensure_topics

logger = logging.getLogger("tracejudge.consumer.notify")
OUTPUT = "notify"  # its label in tracejudge_output_errors_total
SIGNATURE_HEADER = "X-Tracejudge-Signature"
EVENT_TYPE = "dev.tracejudge.verdict"
OUTCOMES = ("delivered", "held_back", "given_up", "duplicate")
MAX_BACKOFF_S = 30.0
ATTEMPT_TIMEOUT_S = 5.0  # one POST; the delivery thread is the only one that waits for it
MAX_ANSWER_BYTES = 64 * 1024  # of an endpoint's answer, read and dropped (only its status matters)
GIVE_UP_LOG_INTERVAL_S = 60.0
# The delivered-ids topic's settings: the registry's (compacted, a week's retention).
TOPIC_CONFIGS = dict(NOTIFICATIONS.configs)
REMEMBERED_IDS = 100_000  # result ids kept in memory for "never twice"; older ones are forgotten first


class NotificationInstruments:
    """The notifier's series, registered with the consumer's (pass a CollectorRegistry in)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.notifications = Counter(
            "tracejudge_notifications_total",
            "Notifications per verdict by outcome: delivered, held_back (rate limit), given_up, duplicate",
            ["outcome"],
            registry=registry,
        )
        for outcome in OUTCOMES:
            self.notifications.labels(outcome=outcome)
        self.pending = Gauge(
            "tracejudge_notifications_pending",
            "Notifications queued, waiting for a retry, or delivered and not yet recorded",
            registry=registry,
        )


def signature(secret: str, body: bytes) -> str:
    """The signature header's value: `sha256=` and the hex HMAC-SHA256 of the exact body bytes under the secret."""
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """What a receiver does (constant-time comparison)."""
    return header is not None and hmac.compare_digest(signature(secret, body), header)


@dataclass(frozen=True, slots=True)
class Rule:
    metric: str | None  # None: any metric
    verdict: str  # "*": any verdict of the metric

    @classmethod
    def parse(cls, text: str) -> Rule:
        metric, sep, verdict = text.strip().rpartition("=")
        return cls(metric if sep else None, verdict)

    def matches(self, metric: str, verdict: str) -> bool:
        return (self.metric is None or self.metric == metric) and self.verdict in ("*", verdict)


class _Bucket:
    """A token bucket: `rate_per_minute` tokens a minute, as many in a burst."""

    __slots__ = ("capacity", "per_second", "stamp", "tokens")

    def __init__(self, rate_per_minute: float, now: float) -> None:
        self.capacity = max(1.0, rate_per_minute)
        self.per_second = rate_per_minute / 60.0
        self.tokens = self.capacity
        self.stamp = now

    def take(self, now: float) -> bool:
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.per_second)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass(slots=True)
class _Post:
    """One notification to one URL; `done` is set once it is delivered (and recorded as such) or given up."""

    url: str
    body: bytes
    headers: dict[str, str]
    result_id: str
    first_at: float
    seq: int
    done: threading.Event = field(default_factory=threading.Event)
    attempts: int = 0


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx answer stays an HTTPError: urllib would re-send a redirected POST as a GET, and count it delivered."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Deadline:
    """An attempt's deadline: when `expire()` is called (by a timer) the attempt's socket is shut down, so the
    delivery thread's read ends at once, however the endpoint trickles its answer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.expired = False

    def track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)
        return sock

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


def _tracked(base: type[http.client.HTTPConnection]) -> Any:
    class Connection(base):  # type: ignore[valid-type,misc]
        """Its socket is handed to the attempt's deadline as soon as it is connected (before a TLS handshake)."""

        def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            connect: Callable[..., socket.socket] = self._create_connection  # type: ignore[has-type]
            self._create_connection = lambda *a, **k: deadline.track(connect(*a, **k))

    return Connection


_HTTPConnection = _tracked(http.client.HTTPConnection)
_HTTPSConnection = _tracked(http.client.HTTPSConnection)


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(functools.partial(_HTTPConnection, deadline=self.deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline, context: Any = None) -> None:
        super().__init__(context=context)
        self.deadline = deadline
        self.context = context  # None: http.client's default (the system's CAs, hostname checked)

    def https_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(functools.partial(_HTTPSConnection, deadline=self.deadline), req, context=self.context)


class _GiveUps:
    """Give-ups are always heard: the first of a minute at once, the rest in a summary once the minute is over
    (`flush`, called by the timer thread), never held until some later warning."""

    def __init__(self, interval_s: float = GIVE_UP_LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._last = -float("inf")
        self._held = 0
        self._latest = ""

    def say(self, line: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last < self.interval_s:
                self._held += 1
                self._latest = line
                return
            self._last = now
        logger.warning("%s", line)

    def flush(self, force: bool = False) -> None:
        with self._lock:
            if not self._held or (not force and time.monotonic() - self._last < self.interval_s):
                return
            held, latest, self._held, self._last = self._held, self._latest, 0, time.monotonic()
        logger.warning("%d more notifications given up in the last minute; the latest: %s", held, latest)


class DeliveredIds:
    """The result ids already notified, kept in a compacted topic (key: result id) and read back at start."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        consumer_config: dict[str, Any],
        writer: Any,
        *,
        replication_factor: int | None = None,
        topic_configs: dict[str, str] | None = None,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.consumer_config = consumer_config
        self.writer = writer  # a durable KafkaWriter on `topic`
        self._table: CompactedTable | None = None  # once loaded: followed
        # --replication-factor (None: the cluster's default) and --internal-topic-config, as every internal topic.
        self.replication_factor = replication_factor
        self.topic_configs = {**(topic_configs or {}), **TOPIC_CONFIGS}

    def ensure_topic(self) -> None:
        """Created as every internal topic is (kafka/topics.py's one policy, its NOTIFICATIONS entry): if missing,
        one partition, compacted, --replication-factor (else the cluster's default) and --internal-topic-config; a
        pre-created one is used as it is. A refusal is one line and an exit code (77: pre-create it; 78: a layout
        the cluster refuses), never a topic left to auto-creation with the wrong cleanup policy."""
        spec = TopicSpec(self.topic, NOTIFICATIONS.partitions or 1, self.topic_configs, checked=False)
        with reaching_kafka(self.bootstrap_servers, self.consumer_config):
            with KafkaClients(self.bootstrap_servers, self.consumer_config).admin() as admin:
                ensure_topics(admin, [spec], TopicLayout(self.replication_factor))

    def load(self, stop: threading.Event | None = None) -> set[tuple[str, str]]:
        """Every (result id, url) delivered so far, the topic read to its end as a table (`kafka.table`: however slow
        the broker, a short read would send them again); the table stays open for `follow`. A topic without
        partitions yet (just created) holds nothing: `follow` waits for them. A broker that stops answering (no
        progress for the stall bound of kafka.reader: the bootstrap timeout, at least 15 s) fails the start with
        KafkaUnreachable (exit 69): starting without the ids would send them again."""
        from .._logging import quiet_kafka_connections

        found: set[tuple[str, str]] = set()
        clients = KafkaClients(self.bootstrap_servers, self.consumer_config)
        table = CompactedTable(clients, self.topic, lambda records: found.update(_delivered(records)), what=self._what)
        try:
            with quiet_kafka_connections():
                table.load(stop)
        except BaseException:
            threading.Thread(target=table.close, name="tracejudge-notify-close", daemon=True).start()
            raise
        self._table = table
        return found

    @property
    def _what(self) -> str:
        return f"the delivered notifications {self.topic!r}"

    def follow(self, add: Callable[[set[tuple[str, str]]], None], stop: threading.Event) -> None:
        """Keep reading what the other replicas of the group deliver (a rebalance hands their uncommitted
        conversations here); on its own thread until `stop` (`kafka.table.CompactedTable.follow`)."""
        table: CompactedTable | None = self._table
        if table is None:
            return
        table.apply = lambda records: add(found) if (found := _delivered(records)) else None
        try:
            table.follow(stop)
        finally:
            table.close()

    def add(self, result_id: str, url: str, on_written: Callable[[], None] | None = None) -> threading.Event:
        """Key: the result id and the URL (each endpoint gets each result once). Never blocks: the event is set, and
        `on_written` called, once the broker acknowledged the record."""
        return self.writer.write(  # type: ignore[no-any-return]
            f"{result_id}\x1f{url}".encode(), b"1", on_written=on_written
        )

    def stop_reading(self) -> None:
        """Close the table's reader when it is never followed (`follow` closes it otherwise)."""
        if self._table is not None:
            self._table.close()
            self._table = None

    def close(self, timeout_s: float) -> None:
        self.writer.close(timeout_s)


def _delivered(records: Iterable[Any]) -> set[tuple[str, str]]:
    found = set()
    for record in records:
        result_id, _, url = (record.key or b"").decode("utf-8", "replace").partition("\x1f")
        if url:
            found.add((result_id, url))
    return found


class Notifier:
    """A result sink (`emit`); `start()` loads the delivered ids and starts the delivery thread, `close()` stops it."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        notify_on: Sequence[str] = ("failure_rate=hallucination",),
        body_format: str = "cloudevents",
        secret: str | None = None,
        trace_url_template: str | None = None,
        rate_per_minute: float = 30.0,
        retry_for_s: float = 600.0,
        source: str = "/tracejudge",
        instruments: NotificationInstruments | None = None,
        on_error: Callable[[], None] | None = None,
        delivered_ids: DeliveredIds | None = None,
        base_backoff_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        if not math.isfinite(retry_for_s) or retry_for_s <= 0:  # nan would give every post up before an attempt
            raise ValueError(f"retry_for_s must be a finite number of seconds, positive, got {retry_for_s!r}")
        self.urls = list(urls)
        self.rules = [Rule.parse(item) for item in notify_on]
        self.body_format = body_format
        self.secret = secret
        self.trace_url_template = trace_url_template
        self.rate_per_minute = rate_per_minute
        self.retry_for_s = retry_for_s
        self.source = source
        self.instruments = instruments or NotificationInstruments(CollectorRegistry())
        self.on_error = on_error
        self.delivered_ids = delivered_ids
        self.backoff = Backoff(base_backoff_s, MAX_BACKOFF_S)
        self.clock = clock
        self.on_fatal = on_fatal
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._delivered_before: set[tuple[str, str]] = set()  # (result id, url) from the delivered-ids topic
        self._buckets: dict[str, _Bucket] = {}
        self._held_back: dict[str, int] = {}
        self._lock = threading.Lock()  # emit runs on the pool thread (and the poll thread for sampled-out ones)
        self._outstanding: dict[str, list[_Post]] = {}  # result id -> its posts not done yet (a duplicate waits)
        self._unposted: dict[int, _Post] = {}  # posts not yet taken by an endpoint, oldest first (the horizon)
        self._seq = itertools.count()
        self._closing = threading.Event()
        # One delivery thread; its queue is bounded by the rate limit. A retry waits for its post's own backoff.
        self._delivery: BoundedWorker[_Post] = BoundedWorker(
            self._deliver, name="tracejudge-notify", backoff=self.backoff, on_error=self._delivery_failed, start=False
        )
        self._timer = threading.Thread(target=self._expiring, name="tracejudge-notify-expiry", daemon=True)
        self._inflight: _Post | None = None  # the post being attempted: its own attempt ends by its horizon
        self._failures = RateLimitedLog(logger, interval_s=60.0)
        self._give_ups = _GiveUps()

    # -- the sink ------------------------------------------------------------------------------------------------

    def start(self) -> Notifier:
        if self.delivered_ids is not None:
            self.delivered_ids.ensure_topic()
            remembered = self.delivered_ids.load(stop=self._closing)  # close() ends a read a dead broker stalls
            with self._lock:
                self._delivered_before = remembered
            if remembered:
                logger.info("notifications: %d already delivered (not sent again)", len(remembered))
            threading.Thread(
                target=self.delivered_ids.follow,
                args=(self._delivered_elsewhere, self._closing),
                name="tracejudge-notify-ids",
                daemon=True,
            ).start()
        self._delivery.start()
        self._timer.start()
        return self

    def _delivered_elsewhere(self, found: set[tuple[str, str]]) -> None:
        with self._lock:
            self._delivered_before |= found

    def emit(self, judgement: Judgement) -> list[threading.Event]:
        """Queue a notification for every matching production verdict; returns the events set once each is
        delivered or given up (never blocks)."""
        done: list[threading.Event] = []
        for result in judgement.results:  # never the shadow judge's
            if result.verdict is None or not any(rule.matches(result.name, result.verdict) for rule in self.rules):
                continue
            record = result_record(judgement, result)
            posts, waits = self._admit(record)
            for post in posts:
                self.instruments.pending.inc()
                self._delivery.put(post)
                done.append(post.done)
            done.extend(waits)  # a duplicate of a result still being posted: its commit waits for that post
        return done

    def _remember(self, result_id: str) -> None:
        self._seen[result_id] = None
        if len(self._seen) > REMEMBERED_IDS:
            self._seen.popitem(last=False)

    def _admit(self, record: dict[str, Any]) -> tuple[list[_Post], list[threading.Event]]:
        """The posts to queue, and for a duplicate the done events of the same result's posts still pending. All
        under the lock: a duplicate arriving meanwhile finds the posts registered."""
        result_id, agent = str(record["result_id"]), str(record.get("agent"))
        with self._lock:
            now = self.clock()  # under the lock: `_unposted` stays in the order of `first_at`
            urls = [url for url in self.urls if (result_id, url) not in self._delivered_before]
            if result_id in self._seen or not urls:
                self.instruments.notifications.labels(outcome="duplicate").inc()
                return [], [post.done for post in self._outstanding.get(result_id, ())]
            self._remember(result_id)
            bucket = self._buckets.get(agent)
            if bucket is None:
                bucket = self._buckets[agent] = _Bucket(self.rate_per_minute, now)
            if not bucket.take(now):
                self._held_back[agent] = self._held_back.get(agent, 0) + 1
                self.instruments.notifications.labels(outcome="held_back").inc()
                return [], []
            held_back = self._held_back.pop(agent, 0)
            body, content_type = self.body(record, held_back)
            headers = {"Content-Type": content_type, "User-Agent": "tracejudge-notify"}
            if self.secret:
                headers[SIGNATURE_HEADER] = signature(self.secret, body)
            posts = [_Post(url, body, headers, result_id, now, next(self._seq)) for url in urls]
            self._outstanding[result_id] = list(posts)
            self._unposted.update((post.seq, post) for post in posts)
        return posts, []

    def trace_url(self, record: dict[str, Any]) -> str | None:
        if not self.trace_url_template or not record.get("trace_id"):
            return None
        fields = {k: record.get(k) or "" for k in ("trace_id", "conversation_id", "agent", "result_id")}
        return self.trace_url_template.format(**fields)

    def body(self, record: dict[str, Any], held_back: int = 0) -> tuple[bytes, str]:
        """The bytes posted and their content type."""
        link = self.trace_url(record)
        if self.body_format == "slack":
            return json.dumps(slack_message(record, link, held_back), ensure_ascii=False).encode(), "application/json"
        from cloudevents.core.bindings.http import to_structured_event
        from cloudevents.core.v1.event import CloudEvent

        attributes: dict[str, Any] = {
            "type": EVENT_TYPE,
            "source": self.source,
            "id": record["result_id"],
            "subject": record["conversation_id"],
            "datacontenttype": "application/json",
            "metric": record["metric"],
            "verdict": record["verdict"],
        }
        try:
            attributes["time"] = datetime.fromisoformat(record["judged_at"])
        except (TypeError, ValueError):
            pass
        data = {"result": record, "trace_url": link, "held_back": held_back}
        message = to_structured_event(CloudEvent(attributes, data))
        return message.body, message.headers.get("content-type", "application/cloudevents+json")

    # -- the delivery thread -------------------------------------------------------------------------------------

    def _deliver(self, posts: list[_Post]) -> None:
        self._expire()
        for post in posts:
            if not post.done.is_set():  # else given up when its horizon passed while it waited
                self._attempt(post)

    def _delivery_failed(self, exc: Exception) -> bool:
        """An unexpected error on the delivery thread: never in silence. Counted, said, and the owner told (the
        thread then ends); without an owner the thread goes on, after a backoff (a fault that repeats does not spin)."""
        self._count_error()
        if self.on_fatal is not None:
            logger.exception(
                "the notifications' delivery thread failed; the consumer stops (notifications not delivered "
                "keep their conversations uncommitted: a restart sends them). Please report this error."
            )
            self.on_fatal(exc)
            return False
        self._failures.warning(
            "the notifications' delivery thread failed (it goes on): %r. Please report this error.", exc, exc_info=True
        )
        return True

    def _expire(self) -> None:
        """Give up every post whose retry horizon has passed, oldest first, wherever it waits (the one being
        attempted is left to its attempt, which ends by its horizon)."""
        while True:
            with self._lock:
                now = self.clock()
                due = []
                for p in self._unposted.values():  # oldest first
                    if now - p.first_at < self.retry_for_s:
                        break
                    if p is not self._inflight:
                        due.append(p)
            if not due:
                return
            for post in due:
                self._give_up(post, now - post.first_at, f"its --notify-retry-for ({self.retry_for_s:.0f} s) passed")

    def _expiring(self) -> None:
        """The timer thread: gives up posts on time while the delivery thread is busy, and says the give-ups."""
        while not self._closing.wait(0.1):
            try:
                self._expire()
                self._give_ups.flush()
            except Exception:  # never dies in silence; the delivery thread's own `_expire` still runs
                self._failures.warning("expiring notifications failed: please report this error", exc_info=True)
        self._give_ups.flush(force=True)

    def _attempt(self, post: _Post) -> None:
        post.attempts += 1
        left = self.retry_for_s - (self.clock() - post.first_at)  # its own horizon, never another post's
        with self._lock:
            self._inflight = post
        try:
            problem, retryable = self._post(post, max(0.001, min(ATTEMPT_TIMEOUT_S, left)))
        finally:
            with self._lock:
                self._inflight = None
        if problem is None:
            self._posted(post)
            return
        self._count_error()
        elapsed = self.clock() - post.first_at
        delay = self.backoff.delay(post.attempts)
        if not retryable or elapsed + delay >= self.retry_for_s:
            self._give_up(post, elapsed, problem)
            return
        self._failures.warning(
            "notification to %s failed: %s; retried with backoff for up to %.0f s (check the endpoint)",
            _redacted(post.url),
            problem,
            self.retry_for_s,
        )
        self._delivery.put(post, after_s=delay)

    def _count_error(self) -> None:
        if self.on_error is not None:
            try:
                self.on_error()
            except Exception:
                logger.exception("counting a notification error failed")

    def _give_up(self, post: _Post, elapsed: float, problem: str) -> None:
        if self._finish(post, "given_up"):  # said once, by whichever thread gave it up
            self._give_ups.say(
                f"notification of result {post.result_id} to {_redacted(post.url)} given up after {post.attempts} "
                f"attempts over {elapsed:.0f} s: {problem} (check the endpoint; its conversation is committed "
                "without it)"
            )

    def _posted(self, post: _Post) -> None:
        """The endpoint took it: delivered once recorded in the delivered-ids topic (written without waiting; the
        post's event is set when the broker acknowledged it, so its conversation is committed only after)."""
        with self._lock:
            self._unposted.pop(post.seq, None)
        if self.delivered_ids is None:
            self._finish(post, "delivered")
        else:
            self.delivered_ids.add(post.result_id, post.url, on_written=functools.partial(self._delivered, post))

    def _post(self, post: _Post, timeout_s: float) -> tuple[str | None, bool]:
        """(None, _) when the endpoint took it; else what went wrong and whether a retry can help. The attempt ends
        by `timeout_s` however the endpoint answers: a timer shuts its socket down."""
        deadline = _Deadline()
        timer = threading.Timer(timeout_s, deadline.expire)
        timer.daemon = True
        opener = urllib.request.build_opener(_NoRedirect, _HTTPHandler(deadline), _HTTPSHandler(deadline))
        timer.start()
        try:
            request = urllib.request.Request(post.url, data=post.body, headers=post.headers, method="POST")
            with opener.open(request, timeout=timeout_s) as response:
                response.read(MAX_ANSWER_BYTES)
            if deadline.expired:  # a shut socket reads as the end of the headers: no answer is no delivery
                return f"no complete answer within {timeout_s:.3g} s (the attempt's deadline)", True
            return None, True
        except urllib.error.HTTPError as exc:
            exc.close()
            if 300 <= exc.code < 400:
                location = exc.headers.get("Location") if exc.headers is not None else None
                where = f" to {_redacted(location)}" if location else ""
                return (
                    f"HTTP {exc.code} redirect{where}, not followed (a notification is POSTed to the given URL only): "
                    "set --notify-url to the URL it redirects to",
                    True,
                )
            retryable = exc.code in (408, 425, 429) or exc.code >= 500
            return f"HTTP {exc.code}", retryable
        except Exception as exc:  # URLError, OSError, and http.client's own (BadStatusLine, IncompleteRead, ...)
            if deadline.expired:
                return f"no complete answer within {timeout_s:.3g} s (the attempt's deadline)", True
            return f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}", True
        finally:
            timer.cancel()
            deadline.expire()  # the connection is closed by now; a socket left behind is shut

    def _delivered(self, post: _Post) -> None:
        self._finish(post, "delivered")

    def _finish(self, post: _Post, outcome: str) -> bool:
        """Once per post (True: this call finished it): from the delivery thread, the timer thread, or the
        delivered-ids writer's when its record is written."""
        with self._lock:
            if post.done.is_set():
                return False
            self._unposted.pop(post.seq, None)
            posts = self._outstanding.get(post.result_id)
            if posts is not None:
                posts[:] = [p for p in posts if p is not post]
                if not posts:
                    del self._outstanding[post.result_id]
            post.done.set()
        self.instruments.notifications.labels(outcome=outcome).inc()
        self.instruments.pending.dec()
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued within the deadline; what is left stays undelivered (and uncommitted)."""
        self._closing.set()
        self._delivery.close(timeout_s)
        if self._timer.is_alive():
            self._timer.join(1.0)
        if self.delivered_ids is not None:
            self.delivered_ids.close(max(0.5, timeout_s))


def _redacted(url: str) -> str:
    """A URL for a log line: a Slack webhook's path is its secret."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return "an invalid URL"
    return f"{parts.scheme}://{parts.netloc}/…" if parts.path.strip("/") else url


_VERDICT_ICONS = {"hallucination": ":rotating_light:", "stall": ":hourglass:", "none": ":warning:"}


def slack_message(record: dict[str, Any], link: str | None, held_back: int) -> dict[str, Any]:
    """A Slack incoming-webhook body (mrkdwn text): what was judged, why, and where the trace is."""
    icon = _VERDICT_ICONS.get(str(record.get("verdict")), ":mag:")
    conversation = f"<{link}|{record['conversation_id']}>" if link else f"`{record['conversation_id']}`"
    lines = [
        f"{icon} *{record.get('agent')}*: {record['metric']} = *{record['verdict']}* on conversation {conversation}",
    ]
    if record.get("failure_mode"):
        lines[0] += f" (about: {record['failure_mode']})"
    if record.get("reason"):
        lines.append("> " + " ".join(str(record["reason"]).split())[:500])
    for item in (record.get("evidence") or [])[:3]:
        lines.append("• " + " ".join(str(item).split())[:300])
    lines.append(f"model {record.get('model')}, rubric {record.get('rubric_version')}, result `{record['result_id']}`")
    if held_back:
        lines.append(f"_{held_back} more notifications for this agent were held back by the rate limit_")
    return {"text": "\n".join(lines)}
