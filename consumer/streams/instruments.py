"""Prometheus instruments of the Kafka runtime: state size, restoration, routing, completions, judge-queue lag."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..conversation.table import COMPLETED, OPEN

if TYPE_CHECKING:
    from .task import Task

RESTORE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
FORGOTTEN_REASONS = ("retention", "memory", "empty", "unreadable")


class StreamsInstruments:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.conversations = Gauge(
            "tracejudge_state_conversations",
            "Conversations held in this process's state stores, open or completed (kept for the retention period)",
            ["status"],
            registry=registry,
        )
        self.bytes = Gauge(
            "tracejudge_state_bytes", "Estimated bytes of conversation state held in memory", registry=registry
        )
        self.forgotten = Counter(
            "tracejudge_conversations_forgotten_total",
            "Conversations dropped from state: past retention, past the memory bound, without a turn, or unreadable",
            ["reason"],
            registry=registry,
        )
        self.completed = Counter(
            "tracejudge_conversations_completed_total",
            "Conversations completed (and sent to the judge queue) by what completed them",
            ["completed_by"],
            registry=registry,
        )
        self.restore_seconds = Histogram(
            "tracejudge_state_restore_seconds",
            "Time to restore one partition's state from its changelog before processing it",
            buckets=RESTORE_BUCKETS,
            registry=registry,
        )
        self.on_disk = Gauge(
            "tracejudge_state_disk_conversations",
            "Conversations held only in the local store on disk (--state-dir), past the memory bounds",
            registry=registry,
        )
        self.store_errors = Counter(
            "tracejudge_state_store_errors_total",
            "Failed writes to the local store (disk_full or io): the conversations stay in memory (docs/state.md)",
            ["reason"],
            registry=registry,
        )
        self.restored = Counter(
            "tracejudge_state_restored_records_total", "Changelog records read while restoring", registry=registry
        )
        self.routed = Counter(
            "tracejudge_span_events_total",
            "Conversation events by route: applied where read (local) or sent to their owner (repartition)",
            ["route"],
            registry=registry,
        )
        self.judge_queue_lag = Gauge(
            "tracejudge_judge_queue_lag",
            "Completed conversations waiting for a judge: judge-queue high watermark minus the judges' position",
            ["partition"],
            registry=registry,
        )
        self.unreadable_fetches = Counter(
            "tracejudge_kafka_fetch_answers_unreadable_total",
            "Fetch answers kafka-python could not read: their partitions' clock waits for the next full fetch",
            ["consumer"],
            registry=registry,
        )
        for consumer in ("group", "restore"):  # at 0 from the start: a rise is visible to rate() and increase()
            self.unreadable_fetches.labels(consumer=consumer)
        self.unreadable_internal = Counter(
            "tracejudge_internal_records_unreadable_total",
            "Records of tracejudge's own topics (repartition, changelog) that could not be read: skipped whole, never"
            " half applied (another program, or a newer tracejudge, writing there)",
            ["topic"],
            registry=registry,
        )
        self.duplicate_jobs = Counter(
            "tracejudge_duplicate_jobs_total",
            "Judge jobs for a transcript this worker had judged or was judging (a replay after a crash or rebalance):"
            " given that verdict instead of paying for another",
            registry=registry,
        )
        for reason in FORGOTTEN_REASONS:
            self.forgotten.labels(reason=reason)
        for reason in ("disk_full", "io"):
            self.store_errors.labels(reason=reason)
        for route in ("local", "repartition"):
            self.routed.labels(route=route)

    def fetch_answer_unreadable(self, consumer: str) -> None:
        """One fetch answer of the stream thread's `group` or `restore` consumer could not be read (kafka-python's IO
        thread; prometheus_client's counters take their own lock)."""
        self.unreadable_fetches.labels(consumer=consumer).inc()

    def report_tables(self, tasks: Iterable[Task], memory_used: int) -> int:
        """The tables' gauges and what they forgot since the last report (on the stream thread); the open count."""
        tasks = list(tasks)
        open_count = sum(task.table.open_count for task in tasks)
        total = sum(len(task.table) for task in tasks)
        self.conversations.labels(status=OPEN).set(open_count)
        self.conversations.labels(status=COMPLETED).set(total - open_count)
        self.bytes.set(memory_used)
        self.on_disk.set(sum(task.table.spilled_count for task in tasks))
        for task in tasks:
            for key, delta in task.counted_since_reported().items():
                if delta > 0 and key.startswith("forgotten_"):
                    self.forgotten.labels(reason=key.removeprefix("forgotten_")).inc(delta)
        return open_count
