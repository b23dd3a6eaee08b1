"""The shared bounded-queue worker under the tracer's batch processor and the consumer's outputs: drops counted, a
close that keeps its deadline and says whether everything was handled, backoff between failures, no thread left."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from tracejudge._shared.bounded_worker import CLOSED, FULL, UNHANDLED, Backoff, BoundedWorker


class Handler:
    """Records batches and when each was handed over; while `gate` is closed a call blocks (a stuck export)."""

    def __init__(self, *, fail: int = 0) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.batches: list[list[int]] = []
        self.calls: list[float] = []
        self.fail = fail  # the first `fail` calls fail (return False)

    def __call__(self, batch: list[int]) -> bool:
        self.calls.append(time.monotonic())
        self.entered.set()
        self.gate.wait(30)
        if len(self.calls) <= self.fail:
            return False
        self.batches.append(batch)
        return True

    @property
    def handled(self) -> list[int]:
        return [item for batch in self.batches for item in batch]


@pytest.fixture
def handler() -> Iterator[Handler]:
    handler = Handler()
    yield handler
    handler.gate.set()  # a handler still blocked returns, so its thread ends before the leak check


def test_a_full_queue_drops_the_new_item_and_counts_it(handler: Handler) -> None:
    drops: list[tuple[int, str]] = []
    worker = BoundedWorker(handler, name="t-full", max_queue=3, on_drop=lambda n, why: drops.append((n, why)))
    handler.gate.clear()
    worker.put(0)
    assert handler.entered.wait(10)  # 0 is being handled: the queue is empty again
    assert [worker.put(i) for i in range(1, 6)] == [True, True, True, False, False]
    assert (
        worker.pending == 3 and worker.drops == {FULL: 2, CLOSED: 0, UNHANDLED: 0} and drops == [(1, FULL), (1, FULL)]
    )
    handler.gate.set()
    assert worker.flush(10)
    assert worker.close(5)
    assert handler.handled == [0, 1, 2, 3] and not worker.alive
    assert worker.put(9) is False and worker.drops[CLOSED] == 1 and worker.dropped == 3


def test_batches_by_size_and_by_linger(handler: Handler) -> None:
    worker = BoundedWorker(handler, name="t-batch", max_batch=4, linger_s=60)
    for i in range(8):
        worker.put(i)
    assert worker.flush(10) and handler.batches == [[0, 1, 2, 3], [4, 5, 6, 7]]  # full batches go at once
    lingering = BoundedWorker(handler, name="t-linger", max_batch=100, linger_s=0.05)
    lingering.put(8)
    started = time.monotonic()
    assert lingering.flush(10)  # the flush takes it at once; the linger alone would too, after 50 ms
    assert time.monotonic() - started < 5 and handler.batches[-1] == [8]
    assert worker.close(5) and lingering.close(5)


def test_close_returns_false_at_its_deadline_while_a_handler_is_stuck_and_counts_what_is_left(
    handler: Handler,
) -> None:
    drops: list[tuple[int, str]] = []
    worker = BoundedWorker(handler, name="t-stuck", on_drop=lambda n, why: drops.append((n, why)))
    handler.gate.clear()
    worker.put(0)
    assert handler.entered.wait(10)
    for i in range(1, 6):
        worker.put(i)
    started = time.monotonic()
    assert worker.close(0.2) is False
    took = time.monotonic() - started
    assert took < 2.0, f"close took {took:.2f} s against a 0.2 s deadline"
    assert worker.pending == 0 and worker.dropped == worker.drops[UNHANDLED] == 5 and drops == [(5, UNHANDLED)]
    assert worker.flush(0.05) is False  # the stuck one is still being handled
    handler.gate.set()  # it returns: the thread sees the close and ends
    worker._thread.join(10)
    assert not worker.alive and handler.handled == [0]


def test_close_handles_what_is_queued_and_returns_true(handler: Handler) -> None:
    worker = BoundedWorker(handler, name="t-close", max_batch=2, linger_s=60)
    for i in range(5):
        worker.put(i)
    assert worker.close(10) is True
    assert handler.handled == [0, 1, 2, 3, 4] and worker.dropped == 0 and not worker.alive


def test_a_failed_batch_is_kept_in_order_and_retried_after_a_growing_backoff() -> None:
    handler = Handler(fail=3)
    worker = BoundedWorker(handler, name="t-backoff", max_batch=10, backoff=Backoff(0.05, 1.0))
    worker.put(1)
    worker.put(2)
    assert worker.flush(10)
    assert handler.batches == [[1, 2]] and len(handler.calls) == 4
    gaps = [later - earlier for earlier, later in zip(handler.calls, handler.calls[1:], strict=False)]
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1 and gaps[2] >= 0.2, gaps  # 0.05 doubling: never a tight loop
    assert worker.close(5)


def test_a_retry_waits_for_its_delay_and_goes_before_newer_items(handler: Handler) -> None:
    worker: BoundedWorker[int] = BoundedWorker(handler, name="t-retry", start=False)
    worker.put(1)
    started = time.monotonic()
    assert worker.put(0, after_s=0.2)
    worker.start()
    assert worker.flush(10)
    assert handler.handled == [1, 0]  # 1 was ready, 0 only after its delay
    assert handler.calls[1] - started >= 0.2
    assert worker.close(5)
    assert worker.put(5, after_s=0.0) is False and worker.dropped == worker.drops[CLOSED] == 1


def test_close_does_not_wait_for_a_backoff_and_counts_the_failed_batch() -> None:
    handler = Handler(fail=100)
    worker = BoundedWorker(handler, name="t-paused", backoff=Backoff(30.0, 30.0))
    worker.put(1)
    worker.put(2)
    assert handler.entered.wait(10)
    started = time.monotonic()
    assert worker.close(5) is False
    assert time.monotonic() - started < 2.0 and not worker.alive
    assert worker.dropped == worker.drops[UNHANDLED] == 2 and len(handler.calls) == 1


def test_a_handler_that_raises_does_not_end_the_thread_unless_its_owner_says_so() -> None:
    errors: list[str] = []

    def handle(batch: list[int]) -> None:
        if batch == [1] or batch == [3]:
            raise RuntimeError(f"bug {batch[0]}")

    def on_error(exc: Exception) -> bool:
        errors.append(str(exc))
        return str(exc) != "bug 3"

    worker = BoundedWorker(handle, name="t-raise", backoff=Backoff(0.01, 0.01), on_error=on_error)
    worker.put(1)
    worker.put(2)
    assert worker.flush(10) and errors == ["bug 1"] and worker.alive
    worker.put(3)
    worker._thread.join(10)
    assert errors == ["bug 1", "bug 3"] and not worker.alive
    assert worker.close(1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_its_own_empty_queue_and_thread(handler: Handler) -> None:
    worker = BoundedWorker(handler, name="t-fork")
    handler.gate.clear()
    worker.put(0)
    assert handler.entered.wait(10)
    worker.put(1)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            handler.batches.clear()
            handler.gate.set()
            worker.put(2)
            code = 0 if worker.flush(10) and handler.handled == [2] and worker.pending == 0 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert worker.pending == 1
    handler.gate.set()
    assert worker.close(10) and handler.handled == [0, 1]


def test_a_flush_waiting_while_another_thread_closes_returns_false_at_once() -> None:
    """A flush waiting on a backoff while close gives the items up: it wakes at the close and says they were not
    handled (it neither sleeps its whole timeout nor reports success)."""
    handler = Handler(fail=100)
    worker = BoundedWorker(handler, name="t-flush-close", backoff=Backoff(30.0, 30.0))
    worker.put(1)
    assert handler.entered.wait(10)
    flushed: list[bool] = []
    waiting = threading.Thread(target=lambda: flushed.append(worker.flush(20)))
    waiting.start()
    started = time.monotonic()
    assert worker.close(5) is False
    waiting.join(10)
    assert flushed == [False] and time.monotonic() - started < 5.0
    assert worker.drops[UNHANDLED] == 1


def test_a_handler_that_raises_without_an_error_policy_drops_its_batch_counted() -> None:
    dropped: list[tuple[int, str]] = []

    def handle(batch: list[int]) -> None:
        raise RuntimeError("bug")

    worker = BoundedWorker(handle, name="t-raise-count", max_batch=2, on_drop=lambda n, why: dropped.append((n, why)))
    worker.put(1)
    worker.put(2)
    worker.flush(10)
    assert worker.drops[UNHANDLED] == 2 and dropped == [(2, UNHANDLED)] and worker.alive
    assert worker.close(1)


def test_the_outputs_close_waits_out_an_otlp_backoff_within_its_deadline() -> None:
    """One export fails (a collector's 503), the span waits its backoff: closing the outputs flushes through the
    provider to the acknowledging exporter (the SDK's Simple*Processor would answer at once) and acknowledges the
    judgement's ticket, instead of giving it up (a restart would judge and pay for it again)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from tracejudge.consumer.app import flush_providers, flushing
    from tracejudge.consumer.emit.acknowledged import AcknowledgingExporter, Ticket, ticket_for

    class Result:
        def __init__(self, name: str) -> None:
            self.name = name

    calls: list[float] = []
    failed = threading.Event()

    def export(items: list[object]) -> Result:
        calls.append(time.monotonic())
        if len(calls) == 1:
            failed.set()
            return Result("FAILURE")
        return Result("SUCCESS")

    provider = TracerProvider()
    provider.add_span_processor(flushing(SimpleSpanProcessor)(AcknowledgingExporter(export, schedule_delay_s=0.01)))
    ticket = Ticket(1)
    with ticket_for(ticket):
        provider.get_tracer("t").start_span("evaluate x").end()
    assert failed.wait(10)
    flush_providers(provider, timeout_s=5)
    assert len(calls) == 2 and ticket.event.is_set()
