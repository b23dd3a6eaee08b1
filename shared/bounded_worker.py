"""One bounded-queue worker: a queue its producers never wait on, one daemon thread, backoff between failed attempts,
flush and close bounded by a deadline, every drop counted.

Written once for the outputs that need it (the tracer's batch processor; the consumer's OTLP, Kafka and notification
outputs), each keeping its own policy on top: what a batch is, what counts as a failure, what is retried, its metrics
and its log lines. Modelled on the OpenTelemetry SDK's batch processor: `put` only appends (a full queue drops the new
item, counted), one thread hands batches to the policy's `handle`, and a close never waits past its deadline: what is
left then is counted, never lost quietly. Standard library only: the traced application imports it.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
import os
import random
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["CLOSED", "FULL", "UNHANDLED", "Backoff", "BoundedWorker"]

T = TypeVar("T")
logger = logging.getLogger("tracejudge.bounded_worker")

# Why an item was dropped (the `reason` of `on_drop`, the keys of `drops`).
FULL = "full"  # put or retried while the queue held max_queue items
CLOSED = "closed"  # put or retried after close began
UNHANDLED = "unhandled"  # still queued, waiting for a retry, or failed while closing, when close gave up on it


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential: `base_s` after the first failure, doubling up to `max_s`; `jitter` spreads each delay by up to
    that fraction either way, so writers that failed together do not all retry together."""

    base_s: float = 0.5
    max_s: float = 30.0
    jitter: float = 0.0

    def delay(self, failures: int) -> float:
        """The wait after the `failures`-th failure in a row (1: the first)."""
        delay = min(self.max_s, self.base_s * 2 ** min(max(failures, 1) - 1, 32))
        return delay * random.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else delay


class BoundedWorker(Generic[T]):
    """Queues items (`put`, never blocking) and hands them to `handle` in batches on one daemon thread.

    - `max_queue` bounds the items queued and waiting for a retry (None: the owner bounds them); past it `put` drops
      the new item, counts it and tells `on_drop(count, reason)` (called outside the lock, on the dropping thread).
    - A batch is taken once it holds `max_batch` items, or its oldest item waited `linger_s`, or a flush or a close
      asks for it.
    - `handle` returning False means the batch failed as a whole: it goes back to the front of the queue, in order,
      and the thread waits `backoff` (growing with each failure in a row) before its next attempt. One item's own
      retry is the policy's call: `retry(item, delay_s)`, from any thread (a client's callback included).
    - A `handle` that raises does not end the thread: `on_error(exc)` (called inside the `except`) says whether to
      go on (after a backoff, as for a failure; the batch is the policy's); without it the error is logged.
    - A forked child gets its own empty queue and thread (the parent's items are the parent's to handle).
    """

    def __init__(
        self,
        handle: Callable[[list[T]], bool | None],
        *,
        name: str,
        max_queue: int | None = None,
        max_batch: int = 1,
        linger_s: float = 0.0,
        backoff: Backoff | None = None,
        on_drop: Callable[[int, str], None] | None = None,
        on_error: Callable[[Exception], bool] | None = None,
        start: bool = True,
    ) -> None:
        self.name = name
        self.max_queue = max_queue
        self.max_batch = max(1, max_batch)
        self.linger_s = linger_s
        self.backoff = backoff or Backoff()
        self._handle = handle
        self._on_drop = on_drop
        self._on_error = on_error
        self._drops: collections.Counter[str] = collections.Counter()
        self._started = start
        self._closed = False
        self._reset()
        reference = weakref.WeakMethod(self._reset)
        os.register_at_fork(after_in_child=lambda: (method := reference()) and method())

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the thread waits here for items, a flush, a close
        self._idle = threading.Condition(self._lock)  # flush waits here for the thread
        self._queue: collections.deque[T] = collections.deque()
        self._retries: list[tuple[float, int, T]] = []  # (due, order, item): a heap
        self._order = itertools.count()
        self._oldest_at = -math.inf  # when the oldest queued item came: linger counts from it
        self._paused_until = 0.0
        self._failures = 0  # failed attempts in a row
        self._inflight = 0
        self._flushing = 0
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        if self._started and not self._closed:
            self._thread.start()

    def start(self) -> None:
        """Starts the thread (for a worker made with `start=False`); items put before wait for it."""
        with self._lock:
            if self._started or self._closed:
                return
            self._started = True
        self._thread.start()

    # -- any thread ---------------------------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending(self) -> int:
        """Items queued or waiting for a retry (the batch being handled is not among them)."""
        return len(self._queue) + len(self._retries)

    @property
    def dropped(self) -> int:
        return sum(self._drops.values())

    @property
    def drops(self) -> dict[str, int]:
        """Items dropped, by reason (FULL, CLOSED, UNHANDLED)."""
        return dict(self._drops)

    def put(self, item: T) -> bool:
        """Queues `item`, never blocking; False when it was dropped (full, or closed), counted."""
        with self._lock:
            reason = self._refused()
            if reason is None:
                if not self._queue:
                    self._oldest_at = time.monotonic()
                self._queue.append(item)
                if len(self._queue) == 1 or len(self._queue) >= self.max_batch:
                    self._work.notify()
                return True
            self._drops[reason] += 1
        self._dropped(1, reason)
        return False

    def retry(self, item: T, delay_s: float) -> bool:
        """Queues `item` again once `delay_s` passed (before the items queued then); False when dropped, counted."""
        with self._lock:
            reason = self._refused()
            if reason is None:
                heapq.heappush(self._retries, (time.monotonic() + delay_s, next(self._order), item))
                self._work.notify()
                return True
            self._drops[reason] += 1
        self._dropped(1, reason)
        return False

    def _refused(self) -> str | None:
        if self._closed:
            return CLOSED
        if self.max_queue is not None and len(self._queue) + len(self._retries) >= self.max_queue:
            return FULL
        return None

    def _dropped(self, count: int, reason: str) -> None:
        if self._on_drop is not None:
            self._on_drop(count, reason)

    def flush(self, timeout_s: float) -> bool:
        """Waits until nothing is queued, waiting for a retry, or being handled; False if the deadline came first."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._flushing += 1
            self._work.notify()
            try:
                while self._queue or self._retries or self._inflight:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._idle.wait(left)
                return True
            finally:
                self._flushing -= 1

    def close(self, timeout_s: float) -> bool:
        """Refuses new items, handles what is queued and ready until the deadline, then ends the thread and counts
        what is left (UNHANDLED). Never waits past the deadline, however long a `handle` takes, nor for a backoff
        (flush first to wait for those). True if everything was handled."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._closed = True
            unhandled_before = self._drops[UNHANDLED]
            self._work.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            left = len(self._queue) + len(self._retries)
            self._queue.clear()
            self._retries.clear()
            if left:
                self._drops[UNHANDLED] += left
            done = not self._inflight and self._drops[UNHANDLED] == unhandled_before
        if left:
            self._dropped(left, UNHANDLED)
        return done

    # -- the thread ---------------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            kept = raised = False
            go_on = True
            try:
                kept = self._handle(batch) is False
            except Exception as exc:
                raised = True
                if self._on_error is not None:
                    go_on = self._on_error(exc)
                else:
                    logger.exception("%s: unexpected error (the thread goes on)", self.name)
            given_up = 0
            with self._lock:
                self._inflight = 0
                self._failures = self._failures + 1 if kept or raised else 0
                if self._failures:
                    self._paused_until = time.monotonic() + self.backoff.delay(self._failures)
                if kept and self._closed:  # not retried while closing: counted now
                    given_up = len(batch)
                    self._drops[UNHANDLED] += given_up
                elif kept:
                    self._queue.extendleft(reversed(batch))
                    self._oldest_at = -math.inf
                self._idle.notify_all()
            if given_up:
                self._dropped(given_up, UNHANDLED)
            if not go_on:
                return

    def _take(self) -> list[T] | None:
        """The next batch once it is due; None once closed with nothing ready."""
        with self._lock:
            while True:
                now = time.monotonic()
                due: list[T] = []
                while self._retries and self._retries[0][0] <= now:
                    due.append(heapq.heappop(self._retries)[2])
                if due:
                    self._queue.extendleft(reversed(due))
                    self._oldest_at = -math.inf
                timeout: float | None = None
                if self._queue and now >= self._paused_until:
                    lingered = now - self._oldest_at >= self.linger_s
                    if self._closed or self._flushing or lingered or len(self._queue) >= self.max_batch:
                        batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
                        self._inflight = len(batch)
                        return batch
                    timeout = self._oldest_at + self.linger_s - now
                elif self._closed:
                    return None  # what waits for a backoff is not waited for: close counts it
                elif self._queue:
                    timeout = self._paused_until - now
                if self._retries:
                    next_due = self._retries[0][0] - now
                    timeout = next_due if timeout is None else min(timeout, next_due)
                self._work.wait(timeout)
