"""Reading a topic from its beginning to its end, where the end is the high watermark a fetch answers.

`consumer.highwater(tp)` after a fetch, never `end_offsets()`: Tansu answers ListOffsets wrongly (1 for a partition
holding 50 records), and a fetch is what clients trust on any broker. No count of empty polls ends the read: a slow
broker makes it slower, never shorter (a short read would forget what the topic says: delivered notifications sent
twice, results missing from an export); while it waits it says so twice a minute.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

logger = logging.getLogger("tracejudge.consumer.topic_reader")
POLL_MS = 500
SAY_EVERY_S = 30.0


def caught_up(consumer: Any, partitions: Sequence[Any]) -> bool:
    """Every partition read to the high watermark its last fetch answered (None before one has)."""
    for tp in partitions:
        end = consumer.highwater(tp)
        if end is None or consumer.position(tp) < end:
            return False
    return True


def records_to_end(
    consumer: Any, partitions: Sequence[Any], *, what: str, stop: threading.Event | None = None
) -> Iterator[Any]:
    """Assign `partitions`, seek to their beginning and yield every record up to their high watermarks (an empty
    partition: once a fetch answered 0). Stops early only when `stop` is set."""
    consumer.assign(list(partitions))
    consumer.seek_to_beginning(*partitions)
    said = time.monotonic()
    while not (stop is not None and stop.is_set()):
        for batch in consumer.poll(timeout_ms=POLL_MS).values():
            yield from batch
        if caught_up(consumer, partitions):
            return
        if time.monotonic() - said >= SAY_EVERY_S:
            said = time.monotonic()
            logger.warning(
                "still reading %s to its end (%s); is the broker slow or unreachable?",
                what,
                ", ".join(
                    f"partition {tp.partition} at {consumer.position(tp)} of {consumer.highwater(tp)}"
                    for tp in partitions
                ),
            )
