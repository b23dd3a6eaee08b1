"""BoundedBatchSpanProcessor: bounded queue, batching on one worker, drops counted, deadlines on flush and shutdown.

These run on every opentelemetry-sdk the package allows (the floor, 1.30, has no readable drop count of its own).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from tracejudge.tracer._batch import _SUPPRESS_INSTRUMENTATION_KEY, BoundedBatchSpanProcessor
from tracejudge.tracer.exporter import ExporterStats


class BlockingExporter(SpanExporter):
    """Records batches; while `gate` is closed an export blocks, as a producer waiting on a dead broker would."""

    def __init__(self, *, raise_on_export: bool = False) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[int] = []
        self.suppressed: list[object] = []
        self.shut_down = False
        self.raise_on_export = raise_on_export
        self.gate.set()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.suppressed.append(otel_context.get_value(_SUPPRESS_INSTRUMENTATION_KEY))
        self.gate.wait(30)
        if self.raise_on_export:
            raise RuntimeError("exporter bug")
        self.batches.append(len(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut_down = True

    @property
    def exported(self) -> int:
        return sum(self.batches)


@pytest.fixture
def exporter() -> Iterator[BlockingExporter]:
    exporter = BlockingExporter()
    yield exporter
    exporter.gate.set()


Built = tuple[BoundedBatchSpanProcessor, TracerProvider, ExporterStats]


def build(exporter: BlockingExporter, **options: float) -> Built:
    stats = ExporterStats()
    processor = BoundedBatchSpanProcessor(exporter, stats=stats, **options)  # type: ignore[arg-type]
    provider = TracerProvider()
    provider.add_span_processor(processor)
    return processor, provider, stats


def end_spans(provider: TracerProvider, count: int) -> None:
    tracer = provider.get_tracer("test")
    for i in range(count):
        tracer.start_span(f"s{i}").end()


def test_full_queue_drops_are_counted_exactly(exporter: BlockingExporter) -> None:
    processor, provider, stats = build(exporter, max_queue_size=8, max_export_batch_size=4, schedule_delay_millis=10)
    exporter.gate.clear()
    end_spans(provider, 1)
    assert exporter.entered.wait(10)  # the worker holds that one span inside a blocked export
    end_spans(provider, 8 + 5)  # the queue takes 8; the next 5 have nowhere to go
    assert processor.queue_full_drops == 5 and processor.spans_dropped == 5
    assert stats.queue_full_drops == 5 and stats.spans_dropped == 5
    exporter.gate.set()
    assert processor.force_flush(10_000)
    assert exporter.exported == 1 + 8 and max(exporter.batches) <= 4
    provider.shutdown()
    assert exporter.shut_down and stats.spans_dropped == 5


def test_batches_on_the_worker_and_flushes_everything(exporter: BlockingExporter) -> None:
    processor, provider, stats = build(exporter, max_queue_size=2048, max_export_batch_size=100)
    end_spans(provider, 1000)
    assert processor.force_flush(10_000)
    assert exporter.exported == 1000 and max(exporter.batches) <= 100
    assert set(exporter.suppressed) == {True}  # instrumented clients inside an export do not trace themselves
    assert stats.spans_dropped == 0 and processor.queue_full_drops == 0
    provider.shutdown()


def test_schedule_delay_exports_without_a_flush(exporter: BlockingExporter) -> None:
    _, provider, _ = build(exporter, schedule_delay_millis=20)
    end_spans(provider, 3)
    deadline = time.monotonic() + 10
    while exporter.exported < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert exporter.exported == 3
    provider.shutdown()


def test_shutdown_keeps_its_deadline_and_counts_what_is_left(exporter: BlockingExporter) -> None:
    processor, provider, stats = build(
        exporter, max_queue_size=100, max_export_batch_size=10, schedule_delay_millis=10, export_timeout_millis=300
    )
    exporter.gate.clear()
    end_spans(provider, 1)
    assert exporter.entered.wait(10)
    end_spans(provider, 50)
    started = time.monotonic()
    provider.shutdown()  # the export never returns in time: shutdown must not wait for it
    assert time.monotonic() - started < 5
    assert exporter.shut_down
    assert processor.spans_dropped == 50 and stats.spans_dropped == 50 and stats.queue_full_drops == 0
    end_spans(provider, 3)  # after shutdown: not queued, counted
    assert processor.spans_dropped == 53 and stats.spans_dropped == 53 and processor.queued == 0


def test_an_exporter_that_raises_is_counted_and_the_worker_goes_on() -> None:
    exporter = BlockingExporter(raise_on_export=True)
    processor, provider, stats = build(exporter, max_export_batch_size=5)
    end_spans(provider, 12)
    processor.force_flush(10_000)
    assert processor.spans_dropped == 12 and stats.spans_dropped == 12 and stats.export_failures == 3
    exporter.raise_on_export = False
    end_spans(provider, 2)
    assert processor.force_flush(10_000) and exporter.exported == 2
    provider.shutdown()


def test_unsampled_spans_are_not_queued(exporter: BlockingExporter) -> None:
    processor = BoundedBatchSpanProcessor(exporter, max_queue_size=1)
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(processor)
    end_spans(provider, 10)
    assert processor.force_flush(10_000) and exporter.exported == 0 and processor.queue_full_drops == 0
    provider.shutdown()


def test_settings_come_from_the_sdk_environment_variables(
    monkeypatch: pytest.MonkeyPatch, exporter: BlockingExporter
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "3")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "not a number")
    processor = BoundedBatchSpanProcessor(exporter)
    assert processor.max_queue_size == 3 and processor.max_export_batch_size == 3
    processor.shutdown()


def test_shutdown_passes_its_deadline_to_the_exporter_and_never_raises() -> None:
    class DeadlineExporter(BlockingExporter):
        def __init__(self) -> None:
            super().__init__()
            self.timeouts: list[int] = []

        def shutdown(self, timeout_millis: int = 30_000) -> None:  # type: ignore[override]
            self.timeouts.append(timeout_millis)
            raise RuntimeError("exporter shutdown bug")

    exporter = DeadlineExporter()
    processor, provider, _ = build(exporter, export_timeout_millis=2_000)
    end_spans(provider, 3)
    provider.shutdown()  # the exporter's error is logged, not raised into the application
    assert exporter.exported == 3 and len(exporter.timeouts) == 1 and 0 < exporter.timeouts[0] <= 2_000
    assert processor.spans_dropped == 0


def test_every_span_is_exported_or_counted_when_shutdown_races_many_threads() -> None:
    class SlowExporter(BlockingExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            time.sleep(random.random() / 1000)
            return super().export(spans)

    for round_ in range(3):
        exporter = SlowExporter()
        processor, provider, stats = build(
            exporter, max_queue_size=64, max_export_batch_size=16, schedule_delay_millis=1, export_timeout_millis=5_000
        )
        start = threading.Barrier(9)

        def produce(start: threading.Barrier = start, provider: TracerProvider = provider) -> None:
            start.wait()
            end_spans(provider, 2_000)

        threads = [threading.Thread(target=produce) for _ in range(8)]
        for thread in threads:
            thread.start()
        start.wait()
        time.sleep(0.002 * round_)
        provider.shutdown()  # while the producers are still ending spans
        for thread in threads:
            thread.join()
        assert exporter.exported + processor.spans_dropped == 8 * 2_000, (exporter.exported, processor.spans_dropped)
        assert stats.spans_dropped == processor.spans_dropped and stats.queue_full_drops == processor.queue_full_drops
        assert processor.queued == 0 and exporter.shut_down


def test_force_flush_gives_up_at_its_timeout_while_an_export_hangs(exporter: BlockingExporter) -> None:
    processor, provider, _ = build(exporter, max_export_batch_size=2, schedule_delay_millis=10)
    exporter.gate.clear()
    end_spans(provider, 1)
    assert exporter.entered.wait(10)
    end_spans(provider, 4)
    started = time.monotonic()
    assert processor.force_flush(200) is False
    assert time.monotonic() - started < 5 and processor.queued == 4
    exporter.gate.set()
    assert processor.force_flush(10_000) and exporter.exported == 5
    provider.shutdown()
    assert processor.force_flush(1_000) is False  # after shutdown there is nothing it can flush


def test_the_worker_survives_an_exporter_that_raises() -> None:
    exporter = BlockingExporter(raise_on_export=True)
    processor, provider, stats = build(exporter, schedule_delay_millis=5)
    end_spans(provider, 3)
    deadline = time.monotonic() + 10
    while stats.export_failures == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    exporter.raise_on_export = False
    end_spans(provider, 2)
    while exporter.exported < 2 and time.monotonic() < deadline:
        time.sleep(0.005)  # no force_flush: only the worker thread exports here
    assert stats.export_failures >= 1 and exporter.exported == 2 and processor.spans_dropped == 3
    provider.shutdown()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_its_own_empty_queue_and_worker(exporter: BlockingExporter) -> None:
    processor, provider, _ = build(exporter, schedule_delay_millis=5)
    exporter.gate.clear()
    end_spans(provider, 1)
    assert exporter.entered.wait(10)
    end_spans(provider, 4)  # queued in the parent behind a hung export
    pid = os.fork()
    if pid == 0:  # the child: the parent's spans are not exported twice; its own are, by its own worker
        code = 1
        try:
            exporter.batches.clear()
            exporter.gate.set()
            end_spans(provider, 3)
            deadline = time.monotonic() + 10
            while exporter.exported < 3 and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.05)
            code = 0 if exporter.exported == 3 and processor.queued == 0 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert processor.queued == 4  # the parent's queue is untouched by the child
    exporter.gate.set()
    assert processor.force_flush(10_000) and exporter.exported == 5
    provider.shutdown()
