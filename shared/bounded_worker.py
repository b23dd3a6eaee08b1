"""One bounded-queue worker: a queue its producers never wait on, one daemon thread, backoff between failed attempts,
flush and close bounded by a deadline, every drop counted.

Under every output that needs one (the tracer's batch processor; the consumer's OTLP, Kafka and notification
outputs), each keeping its own policy: what a batch is, what counts as a failure, what is retried, its metrics and log
lines. As the OpenTelemetry SDK's batch processor: `put` only appends (a full queue drops the new item), one thread
hands batches to `handle`, and a close never waits past its deadline: what is left is counted, never lost quietly.
Standard library only: the traced application imports it.
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
# Why an item was dropped (`on_drop`'s reason, the keys of `drops`): put on a full queue; put after close began; still
# queued, waiting for a retry, or failed while closing when close gave up on it.
FULL, CLOSED, UNHANDLED = "full", "closed", "unhandled"


@dataclass(frozen=True, slots=True)
class Backoff:
    """`base_s` after the first failure, doubling up to `max_s`; `jitter` spreads each delay by up to that fraction
    either way (writers that failed together do not retry together)."""

    base_s: float = 0.5
    max_s: float = 30.0
    jitter: float = 0.0

    def delay(self, failures: int) -> float:
        delay = min(self.max_s, self.base_s * 2 ** min(max(failures, 1) - 1, 32))
        return delay * random.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else delay


class BoundedWorker(Generic[T]):
    """Queues items (`put`, never blocking) and hands them to `handle` in batches on one daemon thread.

    - `max_queue` bounds the items queued and awaiting a retry (None: the owner bounds them); past it `put` drops the
      item, counts it and calls `on_drop(count, reason)` (outside the lock, on the dropping thread).
    - A batch goes once it holds `max_batch` items, its oldest item waited `linger_s`, or a flush or close asks.
    - `handle` returning False: the batch failed as a whole; it goes back to the front, in order, and the thread
      waits `backoff` (growing with each failure in a row) first. One item's retry is the policy's call:
      `put(item, after_s=...)`, from any thread.
    - `handle` raising: `on_error(exc)` (called inside the `except`) says whether the thread goes on (after a
      backoff; the batch is the policy's); without it the error is logged and the thread goes on.
    - A forked child gets its own empty queue and thread: the parent's items are the parent's.
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
        self.name, self.max_queue, self.max_batch, self.linger_s = name, max_queue, max(1, max_batch), linger_s
        self.backoff = backoff or Backoff()
        self._handle, self._on_drop, self._on_error = handle, on_drop, on_error
        self.drops = dict.fromkeys((FULL, CLOSED, UNHANDLED), 0)  # items dropped by reason (read-only outside)
        self.closed = False
        self._started = start
        self._reset()
        reference = weakref.WeakMethod(self._reset)
        os.register_at_fork(after_in_child=lambda: (method := reference()) and method())

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the thread waits here for items, a flush, a close
        self._idle = threading.Condition(self._lock)  # a flush waits here for the thread
        self._queue: collections.deque[T] = collections.deque()
        self._retries: list[tuple[float, int, T]] = []  # a heap of (due, order, item)
        self._order = itertools.count()
        self._oldest_at = -math.inf  # when the oldest queued item came: linger counts from it
        self._paused_until = 0.0
        self._failures = self._inflight = self._flushing = 0
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        if self._started and not self.closed:
            self._thread.start()

    def start(self) -> None:
        """For a worker made with `start=False`; what was put before waits for it."""
        with self._lock:
            if self._started or self.closed:
                return
            self._started = True
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def pending(self) -> int:
        """Items queued or awaiting a retry (not the batch being handled)."""
        return len(self._queue) + len(self._retries)

    @property
    def dropped(self) -> int:
        return sum(self.drops.values())

    def put(self, item: T, after_s: float | None = None) -> bool:
        """Queues `item` (with `after_s`: a retry, handled once that delay passed, before newer items), never
        blocking; False when it was dropped, counted."""
        with self._lock:
            if self.closed or (self.max_queue is not None and self.pending >= self.max_queue):
                reason = CLOSED if self.closed else FULL
                self.drops[reason] += 1
            elif after_s is not None:
                heapq.heappush(self._retries, (time.monotonic() + after_s, next(self._order), item))
                self._work.notify()
                return True
            else:
                if not self._queue:
                    self._oldest_at = time.monotonic()
                self._queue.append(item)
                if len(self._queue) == 1 or len(self._queue) >= self.max_batch:
                    self._work.notify()
                return True
        if self._on_drop is not None:
            self._on_drop(1, reason)
        return False

    def flush(self, timeout_s: float) -> bool:
        """Waits until nothing is queued, awaiting a retry or being handled; False if the deadline came first."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._flushing += 1
            self._work.notify()
            try:
                dropped = self.drops[UNHANDLED]
                while self._queue or self._retries or self._inflight:
                    if (left := deadline - time.monotonic()) <= 0:
                        return False
                    self._idle.wait(left)
                return self.drops[UNHANDLED] == dropped  # a close meanwhile may have given items up
            finally:
                self._flushing -= 1

    def close(self, timeout_s: float) -> bool:
        """Refuses new items, handles what is queued and ready until the deadline, ends the thread, and counts what
        is left (UNHANDLED). Never waits past the deadline, however long `handle` takes, nor for a backoff (flush
        first to wait for those). True if everything was handled."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self.closed = True
            unhandled_before = self.drops[UNHANDLED]
            self._work.notify()
            self._idle.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            left = self.pending
            self._queue.clear()
            self._retries.clear()
            if left:
                self.drops[UNHANDLED] += left
            done = not self._inflight and self.drops[UNHANDLED] == unhandled_before
            self._idle.notify_all()  # a flush waiting for what was just given up returns now
        if left and self._on_drop is not None:
            self._on_drop(left, UNHANDLED)
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
                    logger.exception("%s: unexpected error (the batch is dropped, the thread goes on)", self.name)
            given_up = 0
            with self._lock:
                if raised and self._on_error is None:  # no policy kept it: dropped, and counted as every drop is
                    given_up = len(batch)
                    self.drops[UNHANDLED] += given_up
                self._inflight = 0
                self._failures = self._failures + 1 if kept or raised else 0
                if self._failures:
                    self._paused_until = time.monotonic() + self.backoff.delay(self._failures)
                if kept and self.closed:  # not retried while closing: counted now
                    given_up = len(batch)
                    self.drops[UNHANDLED] += given_up
                elif kept:
                    self._queue.extendleft(reversed(batch))
                    self._oldest_at = -math.inf
                self._idle.notify_all()
            if given_up and self._on_drop is not None:
                self._on_drop(given_up, UNHANDLED)
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
                    timeout = self._oldest_at + self.linger_s - now
                    if self.closed or self._flushing or timeout <= 0 or len(self._queue) >= self.max_batch:
                        batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
                        self._inflight = len(batch)
                        return batch
                elif self.closed:
                    return None  # what awaits a backoff is not waited for: close counts it
                elif self._queue:
                    timeout = self._paused_until - now
                if self._retries:
                    timeout = min(timeout if timeout is not None else math.inf, self._retries[0][0] - now)
                self._work.wait(timeout)
