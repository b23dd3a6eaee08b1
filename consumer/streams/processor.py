"""What a task does with a record (Kafka Streams' processor topology): events into its conversation table, routed
to their owner, completed conversations out to the judge queue.

A record's events whose conversation hashes to the partition they were read from (our exporter keys by conversation
id) are applied at once; the others (the Collector keys by trace id) go to their owner through the repartition
topic, with the record's timestamp. Nothing a record contains stops the consumer: what cannot be read is counted,
said, and set aside in the dead-letter topic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from tracejudge._shared.rate_limited_log import RateLimitedLog
from tracejudge._shared.text import clip

from ..adapters import ConversationEvent
from ..conversation.job import MAX_FIELD_CHARS, JudgeJob
from ..conversation.reading import read_events
from ..conversation.textless import TextlessSpans
from ..emit.prometheus import ConsumerInstruments
from ..judging.judgement import OUTCOME_SAMPLED_OUT
from ..kafka.partitioner import state_partition
from ..kafka.topics import InternalTopics
from . import records as R
from .clock import FUTURE_SLACK_MS, record_time, wall_ms
from .instruments import StreamsInstruments
from .record_collector import RecordCollector
from .task import Task, active

logger = logging.getLogger("tracejudge.consumer.streams")
ROUTED_RECORD_BYTES = 512 * 1024


def _clipped(event: ConversationEvent) -> dict[str, Any]:
    """An event as routed: its text clipped as the table would clip it (a routed record stays small)."""
    data = R.event_to_json(event)
    turn = data.get("turn")
    if turn is not None:
        for side in ("input", "output"):
            if turn.get(side) is not None:
                turn[side] = clip(turn[side], MAX_FIELD_CHARS)
    feedback = data.get("feedback")
    if feedback is not None and feedback.get("comment") is not None:
        feedback["comment"] = clip(feedback["comment"], 1_000)
    return data


def _chunks(events: list[dict[str, Any]]) -> list[bytes]:
    """Routed events in records of at most ROUTED_RECORD_BYTES (one event a record at the very least)."""
    if len(events) == 1:  # the usual record (a turn): encoded once, not measured first
        return [R.dumps({"events": events})]
    out: list[bytes] = []
    batch: list[dict[str, Any]] = []
    size = 0
    for event in events:
        encoded = len(R.dumps(event))
        if batch and size + encoded > ROUTED_RECORD_BYTES:
            out.append(R.dumps({"events": batch}))
            batch, size = [], 0
        batch.append(event)
        size += encoded
    if batch:
        out.append(R.dumps({"events": batch}))
    return out


class Processor:
    """Input and repartition records into the tasks' tables, and their completions to the judge queue."""

    def __init__(
        self,
        collector: RecordCollector,
        topics: InternalTopics,
        partitions: int,
        prometheus: ConsumerInstruments,
        instruments: StreamsInstruments,
        select: Callable[[JudgeJob], bool],
        *,
        max_record_bytes: int,
    ) -> None:
        self.collector = collector
        self.topics = topics
        self.partitions = partitions
        self.prometheus = prometheus
        self.instruments = instruments
        self.select = select
        self.max_record_bytes = max_record_bytes
        self.textless = TextlessSpans(prometheus.record_textless_span)
        # The counters' children looked up once: `labels()` costs more than the increment, on every record.
        self._ok = prometheus.records.labels(outcome="ok")
        self._local = instruments.routed.labels(route="local")
        self._repartitioned = instruments.routed.labels(route="repartition")
        self._malformed_log = RateLimitedLog(logger, interval_s=10.0)
        self._unreadable = instruments.unreadable_internal.labels(topic="repartition")
        self._unreadable_log = RateLimitedLog(logger, interval_s=10.0)

    def input(self, task: Task, record: Any) -> None:
        """One record of the task's input partition: its events applied here or routed to their owner."""
        events, failure = read_events(record.value, max_bytes=self.max_record_bytes, textless=self.textless)
        ts = record_time(record)
        task.input_record(ts)
        remote: dict[str, list[ConversationEvent]] = {}
        local = 0
        key = record.key
        for event in events:
            if state_partition(event.conversation_id, self.partitions) == task.partition:
                # In order only if the producer keyed the record by this conversation (our exporter does).
                ordered = key is not None and key == event.conversation_id.encode("utf-8", "surrogatepass")
                failure = self._apply(task, event, ts, ordered=ordered) or failure
                local += 1
            else:
                remote.setdefault(event.conversation_id, []).append(event)
        if local:
            self._local.inc(local)
        for cid, items in remote.items():
            for chunk in _chunks([_clipped(e) for e in items]):  # well under the brokers' 1 MB record limit
                self.collector.send(
                    self.topics.repartition,
                    cid,
                    chunk,
                    R.EVENTS,
                    partition=state_partition(cid, self.partitions),
                    timestamp_ms=ts,
                )
            self._repartitioned.inc(len(items))
        if failure is not None:
            self._malformed(record, failure)
        else:
            self._ok.inc()

    def _apply(self, task: Task, event: ConversationEvent, ts: int, *, ordered: bool = True) -> str | None:
        try:
            task.table.apply(event, ts, ordered=ordered)
        except Exception as exc:  # nothing a record contains may stop the consumer
            return f"a span could not be folded in: {exc!r}"[:300]
        if event.feedback is not None:  # the judge worker joins feedback to verdicts: same partition, same owner
            state = task.table.get(event.conversation_id)
            known = state.agent if state is not None else None
            agent = event.agent if event.agent_named else (known or event.agent)
            self.collector.send(
                self.topics.judge_queue,
                event.conversation_id,
                R.dumps({"agent": agent, "feedback": R.event_to_json(event)["feedback"]}),
                R.FEEDBACK,
                partition=task.partition,
                timestamp_ms=ts,
            )
        return None

    def repartitioned(self, task: Task, record: Any) -> None:
        """One record of the task's repartition partition: routed events, another source's watermark, or a verdict.

        None of them moves the task's clock, which says how far its OWN input was read (it completes the
        conversations and is broadcast as how far this partition has routed its records). A routed event carries the
        time of the partition it was read from; a task whose repartition partition is read before its input backlog
        (just restored: the manually assigned consumer fetches at once, the input resumes from its committed offset
        later) took that time, claimed input it had not read, and an end marker completed a conversation whose turn
        was still in that backlog. Watermarks and verdict acks are stamped with wall time: the same, worse. The
        conversations with routed events complete by their sources' watermarks."""
        ts = record_time(record)
        kind = R.kind_of(record.headers)
        try:
            value = R.loads(record.value)
            if kind == R.WATERMARK:
                for source, ms in self._watermarks(value).items():
                    task.source_watermark(source, ms)
                return
            cid = record.key.decode("utf-8", "surrogatepass")
            if kind == R.EVENTS:
                for item in value["events"]:
                    self._apply(task, R.event_from_json(cid, item), ts, ordered=False)
            elif kind == R.VERDICT:
                task.table.verdict(cid, str(value["content_id"]), str(value["outcome"]), ts)
        except Exception as exc:
            self._unreadable.inc()
            self._unreadable_log.warning(
                "unreadable repartition record at %d/%d, skipped: %r (does another program, or a newer tracejudge,"
                " write to the repartition topic?)",
                record.partition,
                record.offset,
                exc,
            )

    def _watermarks(self, value: Any) -> dict[int, int]:
        """A watermark record's sources, read whole before any is applied: every source of the sending replica
        (`sources`, clock.broadcast), else the single-source form of a replica of an earlier version. A source that
        is not one of the input partitions, or a time past the future slack, makes the record unreadable."""
        sources = value.get("sources")
        if sources is None:
            sources = {value["source"]: value["ms"]}
        ceiling = wall_ms() + FUTURE_SLACK_MS
        read: dict[int, int] = {}
        for source, ms in sources.items():
            partition, at = int(source), int(ms)
            if not 0 <= partition < self.partitions or not 0 <= at <= ceiling:
                raise ValueError(f"watermark out of range: source {source!r}, ms {ms!r}")
            read[partition] = at
        return read

    def dispatch(self, tasks: Iterable[Task]) -> None:
        """The active tasks' completed conversations to the judge queue, each marked sampled or not.

        A job sampled out is answered by the judge worker with exactly that outcome: the table records it now, so the
        conversation goes to the changelog once, with its completion, in the same commit as the job, and the job says
        so (`answered`): the worker sends no outcome back through the repartition topic. A restart or a move before
        the worker read the job finds the outcome in the restored state."""
        for task in active(tasks):
            for dispatch in task.table.take_dispatches():
                job = dispatch.job
                sampled = self.select(job)
                if not sampled:
                    job = replace(job, answered=True)
                    task.table.verdict(job.conversation_id, job.content_id, OUTCOME_SAMPLED_OUT, dispatch.completed_ms)
                self.collector.send(
                    self.topics.judge_queue,
                    job.conversation_id,
                    R.dumps_job(job, sampled=sampled, completed_ms=dispatch.completed_ms),
                    R.JOB,
                    partition=task.partition,
                    timestamp_ms=dispatch.completed_ms,
                )
                self.instruments.completed.labels(completed_by=job.completed_by).inc()

    def _malformed(self, record: Any, reason: str) -> None:
        self.prometheus.record_records("malformed")
        self._malformed_log.warning(
            "malformed record at partition %d offset %d: %s", record.partition, record.offset, reason
        )
        self.collector.set_aside(record, reason)
