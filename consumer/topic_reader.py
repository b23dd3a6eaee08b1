"""Reading a topic from its beginning to its end, where the end is the high watermark a fetch answers.

`consumer.highwater(tp)` after a fetch, never `end_offsets()`: Tansu answers ListOffsets wrongly (1 for a partition
holding 50 records), and a fetch is what clients trust on any broker. No count of empty polls ends the read: a slow
broker makes it slower, never shorter (a short read would forget what the topic says: delivered notifications sent
twice, results missing from an export); while it waits it says so twice a minute. A broker that dies or freezes
mid-read is no slow broker: once a read has made no progress (no record, no position moved) for `stall_s`, it stops
with KafkaUnreachable (one line, exit 69) rather than hang; so does the partition lookup before it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ._errors import KafkaUnreachable

logger = logging.getLogger("tracejudge.consumer.topic_reader")
POLL_MS = 500
SAY_EVERY_S = 30.0
# How long a read may make no progress before the brokers are taken for gone: the bootstrap timeout
# (`--kafka-config bootstrap_timeout_ms=MS`, the time the first connection may take), and never less than this (a
# loaded broker may pause a fetch for seconds; a wrong "unreachable" would stop a consumer at startup).
MIN_STALL_S = 15.0


def stall_bound_s(config: dict[str, Any]) -> float:
    """No progress for this long ends a read: `bootstrap_timeout_ms` of the client config, at least MIN_STALL_S."""
    return max(MIN_STALL_S, float(config.get("bootstrap_timeout_ms") or 0) / 1000.0)


def _unreachable(what: str, stall_s: float) -> KafkaUnreachable:
    return KafkaUnreachable(
        f"Kafka stopped answering while reading {what}: no progress for {stall_s:g} s; check that the brokers are up "
        "and reachable, then run it again (wait longer with --kafka-config bootstrap_timeout_ms=MS)"
    )


def partitions_for(consumer: Any, topic: str, *, what: str, stall_s: float) -> set[int]:
    """`consumer.partitions_for_topic(topic)` (an empty set: no such topic), bounded: kafka-python's metadata request
    waits without a timeout for a broker that froze. The lookup runs on a daemon thread; KafkaUnreachable when it
    has not answered within `stall_s` (the thread is left to the client's close)."""
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
        raise _unreachable(what, stall_s)
    if isinstance(answer[0], BaseException):
        raise answer[0]
    return set(answer[0] or ())


def _position(consumer: Any, tp: Any) -> int | None:
    try:
        return consumer.position(tp, timeout_ms=POLL_MS)  # type: ignore[no-any-return]
    except Exception:  # not known yet, and the broker not answering
        return None


def caught_up(consumer: Any, partitions: Sequence[Any]) -> bool:
    """Every partition read to the high watermark its last fetch answered (None before one has)."""
    for tp in partitions:
        end = consumer.highwater(tp)
        if end is None:
            return False
        position = _position(consumer, tp)
        if position is None or position < end:
            return False
    return True


def records_to_end(
    consumer: Any,
    partitions: Sequence[Any],
    *,
    what: str,
    stop: threading.Event | None = None,
    stall_s: float | None = None,
) -> Iterator[Any]:
    """Assign `partitions`, seek to their beginning and yield every record up to their high watermarks (an empty
    partition: once a fetch answered 0). Stops early only when `stop` is set; KafkaUnreachable once nothing has
    moved for `stall_s` (None: waits as long as it takes)."""
    consumer.assign(list(partitions))
    consumer.seek_to_beginning(*partitions)
    said = moved = time.monotonic()
    marks: tuple[Any, ...] = ()
    while not (stop is not None and stop.is_set()):
        for batch in consumer.poll(timeout_ms=POLL_MS).values():
            if batch:
                moved = time.monotonic()
            yield from batch
        if caught_up(consumer, partitions):
            return
        now_marks = tuple((consumer.highwater(tp), _position(consumer, tp)) for tp in partitions)
        if now_marks != marks:
            marks, moved = now_marks, time.monotonic()
        if stall_s is not None and time.monotonic() - moved >= stall_s:
            raise _unreachable(what, stall_s)
        if time.monotonic() - said >= SAY_EVERY_S:
            said = time.monotonic()
            logger.warning(
                "still reading %s to its end (%s); is the broker slow or unreachable?",
                what,
                ", ".join(
                    f"partition {tp.partition} at {_position(consumer, tp)} of {consumer.highwater(tp)}"
                    for tp in partitions
                ),
            )
