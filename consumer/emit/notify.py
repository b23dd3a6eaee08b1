"""Notifications per verdict: one HTTP POST per matching verdict (`--notify-url`, `--notify-on`), off the judge path.

A CloudEvents 1.0 JSON event in structured mode (the CNCF SDK makes it; `id` is the result id, `subject` the
conversation id, `data` the result record and a link to the trace) or a Slack incoming-webhook message; signed with
HMAC-SHA256 when a secret is set. `emit` only queues: one delivery thread posts, retrying with backoff for at most
`retry_for` seconds, so a failing endpoint slows no judgement, and holds a conversation's commit (the events `emit`
returns) no longer than that. At least once: a verdict whose POST did not succeed keeps its conversation uncommitted,
so a restart sends it again. Never twice for one result id in a process; across restarts the delivered ids are kept
in a compacted topic (`<group>-notifications`, read back at start and followed while running, so what another
replica delivered is known here after a rebalance), so a replay after a crash is not sent again either (only a POST
that succeeded in the moment before a kill -9 can be repeated: the receiver can dedupe on `id`).
Per agent a token bucket (`rate_per_minute`) holds back the excess, counted; the agent's next event says how many.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import itertools
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ..judgement import Judgement
from ..results import result_record

logger = logging.getLogger("tracejudge.consumer.notify")
OUTPUT = "notify"  # its label in tracejudge_output_errors_total
SIGNATURE_HEADER = "X-Tracejudge-Signature"
EVENT_TYPE = "dev.tracejudge.verdict"
OUTCOMES = ("delivered", "held_back", "given_up", "duplicate")
MAX_BACKOFF_S = 30.0
ATTEMPT_TIMEOUT_S = 5.0  # one POST; the delivery thread is the only one that waits for it
# The delivered-ids topic: compacted (one record per result and URL), and what is older than a week deleted (a replay
# reaches further back only after a reset); its size is bounded by the rate limit.
TOPIC_CONFIGS = {"cleanup.policy": "compact,delete", "retention.ms": str(7 * 86_400_000)}
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
            "Notifications queued or waiting for a retry",
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
    """One notification to one URL."""

    url: str
    body: bytes
    headers: dict[str, str]
    result_id: str
    first_at: float
    done: threading.Event = field(default_factory=threading.Event)
    attempts: int = 0


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
        # --replication-factor (None: the cluster's default) and --internal-topic-config, as every internal topic.
        self.replication_factor = replication_factor
        self.topic_configs = {**(topic_configs or {}), **TOPIC_CONFIGS}

    def ensure_topic(self) -> None:
        """Created compacted if missing (replication: --replication-factor, else the cluster's default); a cluster
        that refuses leaves it to auto-creation, said once."""
        from kafka.admin import KafkaAdminClient, NewTopic
        from kafka.errors import TopicAlreadyExistsError

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers, **_admin_options(self.consumer_config))
        try:
            if self.topic not in set(admin.list_topics()):
                replication = self.replication_factor if self.replication_factor is not None else -1
                admin.create_topics([NewTopic(self.topic, 1, replication, topic_configs=self.topic_configs)])
        except TopicAlreadyExistsError:
            pass
        except Exception as exc:
            logger.warning("creating %s failed (%r): it is left to the cluster's auto-creation", self.topic, exc)
        finally:
            admin.close()

    def load(self) -> set[tuple[str, str]]:
        """Every (result id, url) delivered so far, read to the topic's end; the reader stays open for `follow`."""
        from kafka import KafkaConsumer, TopicPartition

        self._reader = consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap_servers, **{**self.consumer_config, "enable_auto_commit": False}
        )
        ids: set[tuple[str, str]] = set()
        partitions = consumer.partitions_for_topic(self.topic) or set()
        assigned = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        if not assigned:
            return ids
        consumer.assign(assigned)
        consumer.seek_to_beginning(*assigned)
        ends = consumer.end_offsets(assigned)
        idle = 0
        while idle < 20 and any(consumer.position(tp) < ends[tp] for tp in assigned):
            batches = consumer.poll(timeout_ms=500)
            idle = 0 if batches else idle + 1
            ids.update(_delivered(batches))
        return ids

    def follow(self, add: Callable[[set[tuple[str, str]]], None], stop: threading.Event) -> None:
        """Keep reading what the other replicas of the group deliver (a rebalance hands their uncommitted
        conversations here); on its own thread until `stop`."""
        consumer = getattr(self, "_reader", None)
        if consumer is None:
            return
        if not consumer.assignment():
            consumer.close()
            return
        try:
            while not stop.is_set():
                try:
                    found = _delivered(consumer.poll(timeout_ms=500))
                except Exception as exc:  # a broker outage: the in-memory ids still stop duplicates in this process
                    logger.debug("reading the delivered notifications: %r", exc)
                    stop.wait(1.0)
                    continue
                if found:
                    add(found)
        finally:
            consumer.close()

    def add(self, result_id: str, url: str) -> threading.Event:
        """Key: the result id and the URL (each endpoint gets each result once)."""
        return self.writer.write(f"{result_id}\x1f{url}".encode(), b"1")  # type: ignore[no-any-return]

    def close(self, timeout_s: float) -> None:
        self.writer.close(timeout_s)


def _delivered(batches: Any) -> set[tuple[str, str]]:
    found = set()
    for batch in batches.values():
        for record in batch:
            result_id, _, url = (record.key or b"").decode("utf-8", "replace").partition("\x1f")
            if url:
                found.add((result_id, url))
    return found


def _admin_options(config: dict[str, Any]) -> dict[str, Any]:
    from kafka.admin import KafkaAdminClient

    return {k: v for k, v in config.items() if k in KafkaAdminClient.DEFAULT_CONFIG}


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
    ) -> None:
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
        self.base_backoff_s = base_backoff_s
        self.clock = clock
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._delivered_before: set[tuple[str, str]] = set()  # (result id, url) from the delivered-ids topic
        self._buckets: dict[str, _Bucket] = {}
        self._held_back: dict[str, int] = {}
        self._lock = threading.Lock()  # emit runs on the pool thread (and the poll thread for sampled-out ones)
        self._queue: queue.SimpleQueue[_Post | None] = queue.SimpleQueue()
        self._retry: list[tuple[float, int, _Post]] = []
        self._order = itertools.count()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tracejudge-notify", daemon=True)
        self._failures = RateLimitedLog(logger, interval_s=60.0)

    # -- the sink ------------------------------------------------------------------------------------------------

    def start(self) -> Notifier:
        if self.delivered_ids is not None:
            self.delivered_ids.ensure_topic()
            remembered = self.delivered_ids.load()
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
        self._thread.start()
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
            posts = self._admit(record)
            for post in posts:
                self.instruments.pending.inc()
                self._queue.put(post)
                done.append(post.done)
        return done

    def _remember(self, result_id: str) -> None:
        self._seen[result_id] = None
        if len(self._seen) > REMEMBERED_IDS:
            self._seen.popitem(last=False)

    def _admit(self, record: dict[str, Any]) -> list[_Post]:
        result_id, agent = str(record["result_id"]), str(record.get("agent"))
        now = self.clock()
        with self._lock:
            urls = [url for url in self.urls if (result_id, url) not in self._delivered_before]
            if result_id in self._seen or not urls:
                self.instruments.notifications.labels(outcome="duplicate").inc()
                return []
            self._remember(result_id)
            bucket = self._buckets.get(agent)
            if bucket is None:
                bucket = self._buckets[agent] = _Bucket(self.rate_per_minute, now)
            if not bucket.take(now):
                self._held_back[agent] = self._held_back.get(agent, 0) + 1
                self.instruments.notifications.labels(outcome="held_back").inc()
                return []
            held_back = self._held_back.pop(agent, 0)
        body, content_type = self.body(record, held_back)
        headers = {"Content-Type": content_type, "User-Agent": "tracejudge-notify"}
        if self.secret:
            headers[SIGNATURE_HEADER] = signature(self.secret, body)
        return [_Post(url, body, headers, result_id, now) for url in urls]

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

    def _next(self) -> _Post | None:
        """The next post due: a retry whose time has come, else a new one (waiting at most until the next retry)."""
        now = self.clock()
        if self._retry and self._retry[0][0] <= now:
            return heapq.heappop(self._retry)[2]
        wait = min(0.5, self._retry[0][0] - now) if self._retry else 0.5
        try:
            return self._queue.get(timeout=max(0.0, wait))
        except queue.Empty:
            return None

    def _run(self) -> None:
        while not (self._closing.is_set() and self._queue.empty() and not self._retry):
            post = self._next()
            if post is None:
                if self._closing.is_set() and self._queue.empty():
                    break  # what is left waits for a retry: left undelivered (its conversation uncommitted)
                continue
            self._attempt(post)

    def _attempt(self, post: _Post) -> None:
        post.attempts += 1
        problem, retryable = self._post(post)
        if problem is None:
            self._finish(post, "delivered")
            if self.delivered_ids is not None:
                if not self.delivered_ids.add(post.result_id, post.url).wait(10.0):
                    logger.warning("notifications: result %s delivered but not yet recorded as such", post.result_id)
            return
        if self.on_error is not None:
            self.on_error()
        elapsed = self.clock() - post.first_at
        if not retryable or elapsed >= self.retry_for_s:
            self._failures.warning(
                "notification of result %s to %s given up after %d attempts over %.0f s: %s (check the endpoint; "
                "its conversation is committed without it)",
                post.result_id,
                _redacted(post.url),
                post.attempts,
                elapsed,
                problem,
            )
            self._finish(post, "given_up")
            return
        self._failures.warning(
            "notification to %s failed: %s; retried with backoff for up to %.0f s (check the endpoint)",
            _redacted(post.url),
            problem,
            self.retry_for_s,
        )
        delay = min(MAX_BACKOFF_S, self.base_backoff_s * 2 ** (post.attempts - 1))
        heapq.heappush(self._retry, (self.clock() + delay, next(self._order), post))

    def _post(self, post: _Post) -> tuple[str | None, bool]:
        """(None, _) when the endpoint took it; else what went wrong and whether a retry can help."""
        request = urllib.request.Request(post.url, data=post.body, headers=post.headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=ATTEMPT_TIMEOUT_S) as response:
                response.read()
                return None, True
        except urllib.error.HTTPError as exc:
            retryable = exc.code in (408, 425, 429) or exc.code >= 500
            return f"HTTP {exc.code}", retryable
        except Exception as exc:  # URLError, OSError, and http.client's own (BadStatusLine, IncompleteRead, ...)
            return f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}", True

    def _finish(self, post: _Post, outcome: str) -> None:
        self.instruments.notifications.labels(outcome=outcome).inc()
        self.instruments.pending.dec()
        post.done.set()

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued within the deadline; what is left stays undelivered (and uncommitted)."""
        self._closing.set()
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self.delivered_ids is not None:
            self.delivered_ids.close(max(0.5, timeout_s))


def _redacted(url: str) -> str:
    """A URL for a log line: a Slack webhook's path is its secret."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/…" if parts.path.strip("/") else url


_VERDICT_ICONS = {"hallucination": ":rotating_light:", "stall": ":hourglass:", "none": ":warning:"}


def slack_message(record: dict[str, Any], link: str | None, held_back: int) -> dict[str, Any]:
    """A Slack incoming-webhook body (mrkdwn text): what was judged, why, and where the trace is."""
    icon = _VERDICT_ICONS.get(str(record.get("verdict")), ":mag:")
    conversation = f"<{link}|{record['conversation_id']}>" if link else f"`{record['conversation_id']}`"
    lines = [
        f"{icon} *{record.get('agent')}*: {record['metric']} = *{record['verdict']}* on conversation {conversation}",
    ]
    if record.get("reason"):
        lines.append("> " + " ".join(str(record["reason"]).split())[:500])
    for item in (record.get("evidence") or [])[:3]:
        lines.append("• " + " ".join(str(item).split())[:300])
    lines.append(f"model {record.get('model')}, rubric {record.get('rubric_version')}, result `{record['result_id']}`")
    if held_back:
        lines.append(f"_{held_back} more notifications for this agent were held back by the rate limit_")
    return {"text": "\n".join(lines)}
