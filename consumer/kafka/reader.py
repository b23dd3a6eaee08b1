"""Reading partitions to their end, where the end is the high watermark a fetch answers: the one reader of a topic
to its end (the notifier's delivered ids, the batch store, `compare`, `explain`, `backfill`'s range and its results).

One stopping rule. A partition is read when its position reached the high watermark its last fetch answered
(`consumer.highwater(tp)`, never `end_offsets()`: Tansu answers ListOffsets wrongly, 1 for a partition holding 50
records, and a fetch is what clients trust on any broker), or when the caller finished it (`finish`: backfill's end
of a time range). No count of empty polls ends a read: a slow broker makes it slower, never shorter (a short read
would forget what the topic says: delivered notifications sent twice, results missing from an export); while it waits
it says so twice a minute. A broker that dies or freezes mid-read is no slow broker: once a read has made no progress
(no record, no position or high watermark moved) for `stall_s`, it stops with ReadStalled (a KafkaUnreachable: one
line, exit 69) naming the partitions not read, rather than hang; so does the partition lookup before it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from kafka import TopicPartition

from .._errors import KafkaUnreachable

logger = logging.getLogger("tracejudge.consumer.kafka.reader")
POLL_MS = 500
SAY_EVERY_S = 30.0
# How long a read may make no progress before the brokers are taken for gone: the bootstrap timeout
# (`--kafka-config bootstrap_timeout_ms=MS`, the time the first connection may take), and never less than this (a
# loaded broker may pause a fetch for seconds; a wrong "unreachable" would stop a consumer at startup).
MIN_STALL_S = 15.0


class ReadStalled(KafkaUnreachable):
    """No progress for the stall bound: `unread` names the partitions not read to their end."""

    def __init__(self, message: str, unread: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.unread = sorted(unread)


REQUEST_TIMEOUT_MS = 30_000  # kafka-python's default request_timeout_ms
FETCH_MAX_WAIT_MS = 500  # and fetch_max_wait_ms


def stall_bound_s(config: Mapping[str, Any]) -> float:
    """No progress for this long ends a read: never shorter than one fetch may legitimately take (the client's
    `request_timeout_ms` plus `fetch_max_wait_ms`, and a poll's margin), nor than `bootstrap_timeout_ms` or
    MIN_STALL_S. A slow broker makes a read slower, never a wrong "unreachable"; raising the client's request timeout
    raises this bound with it."""
    one_fetch_ms = float(config.get("request_timeout_ms") or REQUEST_TIMEOUT_MS) + float(
        config.get("fetch_max_wait_ms") or FETCH_MAX_WAIT_MS
    )
    return max(
        MIN_STALL_S,
        float(config.get("bootstrap_timeout_ms") or 0) / 1000.0,
        (one_fetch_ms + POLL_MS) / 1000.0,
    )


def _stalled(what: str, stall_s: float, unread: Sequence[int] = ()) -> ReadStalled:
    return ReadStalled(
        f"Kafka stopped answering while reading {what}: no progress for {stall_s:g} s; check that the brokers are up "
        "and reachable, then run it again (wait longer with --kafka-config bootstrap_timeout_ms=MS)",
        unread,
    )


def partitions_for(consumer: Any, topic: str, *, what: str, stall_s: float) -> set[int]:
    """`consumer.partitions_for_topic(topic)` (an empty set: no such topic), bounded: kafka-python's metadata request
    waits without a timeout for a broker that froze. The lookup runs on a daemon thread; ReadStalled when it has not
    answered within `stall_s` (the thread is left to the client's close)."""
    answer: list[Any] = []

    def lookup() -> None:
        try:
            answer.append(consumer.partitions_for_topic(topic))
        except BaseException as exc:  # handed to the caller's thread
            answer.append(exc)

    thread = threading.Thread(target=lookup, name="tracejudge-topic-lookup", daemon=True)
    thread.start()
    thread.join(stall_s)
    if not answer:
        raise _stalled(what, stall_s)
    if isinstance(answer[0], BaseException):
        raise answer[0]
    return set(answer[0] or ())


def topic_partitions(topic: str, partitions: Iterable[int]) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in sorted(partitions)]


def _position(consumer: Any, tp: Any) -> int | None:
    try:
        return consumer.position(tp, timeout_ms=POLL_MS)  # type: ignore[no-any-return]
    except Exception:  # not known yet, and the broker not answering
        return None


class TopicReader:
    """Assigns `partitions` to `consumer` (no group), seeks each to `start` (an offset per partition; the beginning
    where none is given) and yields `(tp, records)` batches until every partition is read or finished.

    `stop` ends it early (set from another thread); `stall_s` None waits as long as it takes."""

    def __init__(
        self,
        consumer: Any,
        partitions: Sequence[Any],
        *,
        what: str,
        start: Mapping[Any, int] | None = None,
        stop: threading.Event | None = None,
        stall_s: float | None = None,
    ) -> None:
        self.consumer = consumer
        self.partitions = list(partitions)
        self.what = what
        self.stop = stop
        self.stall_s = stall_s
        self.finished: set[Any] = set()
        consumer.assign(self.partitions)
        start = start or {}
        from_beginning = [tp for tp in self.partitions if tp not in start]
        if from_beginning:
            consumer.seek_to_beginning(*from_beginning)
        for tp, offset in start.items():
            consumer.seek(tp, offset)

    def finish(self, tp: Any) -> None:
        """The caller has what it needs of `tp` (paused: no more is fetched)."""
        if tp not in self.finished:
            self.finished.add(tp)
            self.consumer.pause(tp)

    def caught_up(self, tp: Any) -> bool:
        """Read to the high watermark its last fetch answered (None before one has)."""
        if tp in self.finished:
            return True
        end = self.consumer.highwater(tp)
        if end is None:
            return False
        position = _position(self.consumer, tp)
        return position is not None and position >= end

    def unread(self) -> list[int]:
        return sorted(tp.partition for tp in self.partitions if not self.caught_up(tp))

    def __iter__(self) -> Iterator[tuple[Any, list[Any]]]:
        consumer = self.consumer
        said = moved = time.monotonic()
        marks: tuple[Any, ...] = ()
        while not (self.stop is not None and self.stop.is_set()):
            if all(self.caught_up(tp) for tp in self.partitions):
                return
            for tp, batch in consumer.poll(timeout_ms=POLL_MS).items():
                if batch:
                    moved = time.monotonic()
                    yield tp, batch
            now_marks = tuple((consumer.highwater(tp), _position(consumer, tp)) for tp in self.partitions)
            if now_marks != marks:
                marks, moved = now_marks, time.monotonic()
            if self.stall_s is not None and time.monotonic() - moved >= self.stall_s:
                raise _stalled(self.what, self.stall_s, self.unread())
            if time.monotonic() - said >= SAY_EVERY_S:
                said = time.monotonic()
                logger.warning(
                    "still reading %s to its end (%s); is the broker slow or unreachable?",
                    self.what,
                    ", ".join(
                        f"partition {tp.partition} at {_position(consumer, tp)} of {consumer.highwater(tp)}"
                        for tp in self.partitions
                        if not self.caught_up(tp)
                    ),
                )


def records_to_end(
    consumer: Any,
    partitions: Sequence[Any],
    *,
    what: str,
    stop: threading.Event | None = None,
    stall_s: float | None = None,
) -> Iterator[Any]:
    """Every record of `partitions` from their beginning to their high watermarks (an empty partition: once a fetch
    answered 0), one by one."""
    for _, batch in TopicReader(consumer, partitions, what=what, stop=stop, stall_s=stall_s):
        yield from batch
