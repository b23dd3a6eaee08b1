"""`tracejudge backfill --from TIME --to TIME`: judge a past time range of the span topic.

Reads the records in the range with manual assignment (no group, no commits), assembles conversations, judges
those that complete inside the range, reports those still open at --to, and skips conversations whose result id is
already in the results topic unless --rejudge.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .adapters import extract, trace_contexts
from .decode import decode_record
from .flags import EXIT_USAGE
from .pool import OUTCOME_JUDGED, OUTCOME_SKIPPED_BUDGET, Judgement
from .results import result_id
from .sessions import JudgeJob, SessionStore

logger = logging.getLogger("tracejudge.backfill")
# Timestamps within a partition are only roughly ordered (several producers): read this far past --to.
LATENESS_MS = 5 * 60_000
# Empty polls in a row (0.5 s each) after which reading stops; the partitions not read to the end are reported.
MAX_IDLE_POLLS = 20
EXIT_INCOMPLETE = 1


def parse_time(text: str) -> datetime:
    """ISO 8601 (`2026-11-29T10:00:00Z`, a date, or with an offset) or Unix seconds; naive times are UTC."""
    value = text.strip()
    try:
        return datetime.fromtimestamp(float(value), tz=UTC)
    except ValueError:
        pass
    moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@dataclass
class BackfillReport:
    records: int = 0
    malformed: int = 0
    complete: int = 0
    judged: int = 0
    failed: int = 0
    sampled_out: int = 0
    skipped_existing: int = 0
    skipped_budget: int = 0
    skipped_agent: int = 0
    partial: int = 0
    still_open: list[str] = field(default_factory=list)
    cost_usd: float = 0.0
    scanned: int = 0  # records fetched, in the range or not
    unread_partitions: list[int] = field(default_factory=list)  # not read to the end of the range
    sink_errors: int = 0


def _existing_result_ids(consumer_factory: Any, bootstrap: str, topic: str, config: dict[str, Any]) -> set[str]:
    from kafka import TopicPartition

    consumer = consumer_factory(bootstrap_servers=bootstrap, enable_auto_commit=False, **config)
    ids: set[str] = set()
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        assigned = [TopicPartition(topic, p) for p in partitions]
        if not assigned:
            return ids
        consumer.assign(assigned)
        consumer.seek_to_beginning(*assigned)
        idle_polls = 0
        while idle_polls < 3:
            batches = consumer.poll(timeout_ms=500)
            if not batches:
                idle_polls += 1
                caught_up = all(
                    consumer.highwater(tp) is not None and consumer.position(tp) >= consumer.highwater(tp)
                    for tp in assigned
                )
                if caught_up:
                    break
                continue
            idle_polls = 0
            for records in batches.values():
                for record in records:
                    try:
                        ids.add(json.loads(record.value)["result_id"])
                    except (ValueError, KeyError, TypeError):
                        continue
    finally:
        consumer.close()
    return ids


def read_range(
    consumer: Any, topic: str, start_ms: int, end_ms: int, store: SessionStore, report: BackfillReport
) -> dict[str, int]:
    """Fold every record with a timestamp in [start, end) into the store; returns each conversation's last ms.

    Partitions that could not be read to the end of the range (the reading stopped after MAX_IDLE_POLLS empty polls)
    are listed in `report.unread_partitions`.
    """
    from kafka import TopicPartition

    partitions = sorted(consumer.partitions_for_topic(topic) or set())
    assigned = [TopicPartition(topic, p) for p in partitions]
    consumer.assign(assigned)
    done: set[int] = set()
    try:
        starts = consumer.offsets_for_times({tp: start_ms for tp in assigned})
    except Exception:  # brokers without time index support: scan from the beginning and filter by timestamp
        starts = None
    for tp in assigned:
        found = starts.get(tp) if starts is not None else None
        if found is not None and found.timestamp is not None and found.timestamp < 0:
            found = None  # "no such record" as some brokers say it (an offset without a timestamp)
        if found is not None:
            consumer.seek(tp, found.offset)
        elif starts is not None:  # no record at or after --from: nothing to read in this partition
            done.add(tp.partition)
            consumer.pause(tp)
        else:
            consumer.seek_to_beginning(tp)
    last_seen: dict[str, int] = {}
    idle_polls = 0
    while len(done) < len(assigned):
        batches = consumer.poll(timeout_ms=500, max_records=1000)
        if not batches:
            idle_polls += 1
            for tp in assigned:  # the fetch high watermark, not ListOffsets, says when a partition is read
                highwater = consumer.highwater(tp)
                if highwater is not None and consumer.position(tp) >= highwater:
                    done.add(tp.partition)
            if idle_polls >= MAX_IDLE_POLLS and len(done) < len(assigned):
                report.unread_partitions = sorted(tp.partition for tp in assigned if tp.partition not in done)
                logger.warning(
                    "stopped after %d empty polls: partitions %s were not read to the end of the range",
                    idle_polls,
                    report.unread_partitions,
                )
                break
            continue
        idle_polls = 0
        for tp, records in batches.items():
            for record in records:
                report.scanned += 1
                if record.timestamp >= end_ms + LATENESS_MS:
                    done.add(tp.partition)
                    consumer.pause(tp)
                    break
                if not start_ms <= record.timestamp < end_ms:
                    continue
                report.records += 1
                try:  # nothing a record contains may stop the backfill: any exception makes it malformed
                    spans = decode_record(record.value)
                    traces = trace_contexts(spans)
                    events = [e for e in (extract(span, traces) for span in spans) if e is not None]
                    for event in events:
                        store.apply(event, tp.partition, record.offset, record.timestamp / 1000)
                        last_seen[event.conversation_id] = record.timestamp
                except Exception:
                    report.malformed += 1
    return last_seen


def run_backfill(namespace: argparse.Namespace) -> int:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from ._logging import configure_logging
    from .flags import settings_from_args

    try:
        start, end = parse_time(namespace.start), parse_time(namespace.end)
    except ValueError as exc:
        print(f"tracejudge backfill: invalid time: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if start >= end:
        print(
            f"tracejudge backfill: --from ({start.isoformat()}) must be before --to ({end.isoformat()})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if namespace.backfill_sample_rate is not None and not 0.0 <= namespace.backfill_sample_rate <= 1.0:
        print("tracejudge backfill: --sample-rate must be within 0..1", file=sys.stderr)
        return EXIT_USAGE
    settings = settings_from_args(namespace)
    configure_logging(settings.log_level, settings.log_format)
    from kafka import KafkaConsumer
    from prometheus_client import CollectorRegistry
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    from rich.table import Table

    from .app import build_judges, build_outputs
    from .emit.prometheus import ConsumerMetrics
    from .pool import JudgePool
    from .sampling import Sampler

    console = Console()
    report = BackfillReport()
    start_ms, end_ms = int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    store = SessionStore(
        idle_timeout_s=settings.session_idle_timeout, max_open=10**9, max_turns=settings.max_turns_per_conversation
    )
    consumer = KafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False, **settings.consumer_config()
    )
    try:
        last_seen = read_range(consumer, settings.topic, start_ms, end_ms, store, report)
    finally:
        consumer.close()
    # Conversations that went quiet for the idle timeout before --to are complete; the rest are still open.
    for cid, conversation in list(store.open.items()):
        if (end_ms - last_seen.get(cid, end_ms)) / 1000 >= settings.session_idle_timeout and conversation.turns:
            store.complete(cid, "idle_timeout")
        else:
            report.still_open.append(cid)
    jobs = store.take_ready()
    existing = set()
    if settings.results_topic and not namespace.rejudge:
        existing = _existing_result_ids(
            KafkaConsumer, settings.bootstrap_servers, settings.results_topic, settings.consumer_config()
        )
    sampler = Sampler(
        namespace.backfill_sample_rate if namespace.backfill_sample_rate is not None else settings.sample_rate,
        settings.agent_sample_rates,
    )
    selected: list[JudgeJob] = []
    for job in jobs:
        report.complete += 1
        indices = [t.index for t in job.turns if t.index is not None]
        if indices and min(indices) > 0:
            report.partial += 1  # it began before --from: judging part of it would mislead
            continue
        if namespace.agent and job.agent != namespace.agent:
            report.skipped_agent += 1
            continue
        if not sampler.should_judge(job):
            report.sampled_out += 1
            continue
        if existing and all(result_id(job.conversation_id, name, job.version) in existing for name in settings.metrics):
            report.skipped_existing += 1
            continue
        selected.append(job)

    outputs = build_outputs(settings, service_name="tracejudge-backfill")
    prometheus = ConsumerMetrics(CollectorRegistry(), max_agents=settings.max_agents)
    finished: list[Judgement] = []

    def done(judgement: Judgement) -> None:
        """Always counts the judgement as finished: a sink that raises must not leave the wait below hanging."""
        try:
            prometheus.record_judgement(judgement)
            for sink in outputs.sinks:
                try:
                    sink.emit(judgement)
                except Exception:
                    report.sink_errors += 1
                    logger.exception("a result sink failed for conversation %s", judgement.job.conversation_id)
        finally:
            finished.append(judgement)

    pool = JudgePool(
        build_judges(settings),
        done,
        max_concurrency=settings.max_concurrency,
        max_requests_per_minute=settings.max_requests_per_minute,
        max_cost_per_hour=settings.max_cost_per_hour,
    ).start()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("${task.fields[cost]:.4f}"),
        console=console,
    ) as progress:
        task = progress.add_task("backfill: judging", total=len(selected), cost=0.0)
        for job in selected:
            pool.submit(job)
        while len(finished) < len(selected) and pool.pending:  # pending counts down even if a callback fails
            cost = sum(r.cost_usd or 0 for j in list(finished) for r in j.results)
            progress.update(task, completed=len(finished), cost=cost)
            time.sleep(0.1)
        progress.update(task, completed=len(finished), cost=sum(r.cost_usd or 0 for j in finished for r in j.results))
    pool.stop(settings.shutdown_grace)
    outputs.close()
    for judgement in finished:
        if judgement.outcome == OUTCOME_JUDGED:
            report.judged += 1
        elif judgement.outcome == OUTCOME_SKIPPED_BUDGET:
            report.skipped_budget += 1
        else:
            report.failed += 1
        report.cost_usd += sum(r.cost_usd or 0 for r in judgement.results)
    table = Table(title=f"backfill {start.isoformat()} → {end.isoformat()}")
    table.add_column("what")
    table.add_column("count", justify="right")
    for name, value in (
        ("records read", report.records),
        ("malformed records", report.malformed),
        ("conversations complete in range", report.complete),
        ("judged", report.judged),
        ("failed", report.failed),
        ("already judged (results topic)", report.skipped_existing),
        ("sampled out", report.sampled_out),
        ("skipped for budget", report.skipped_budget),
        ("other agents", report.skipped_agent),
        ("began before --from", report.partial),
        ("still open at --to (not judged)", len(report.still_open)),
    ):
        table.add_row(name, str(value))
    console.print(table)
    console.print(f"judge cost: ${report.cost_usd:.4f}")
    if report.still_open:
        console.print("still open at --to: " + ", ".join(sorted(report.still_open)[:20]))
    if report.sink_errors:
        console.print(f"result sinks failed {report.sink_errors} times (see the log)")
    if report.unread_partitions:
        console.print(
            f"INCOMPLETE: partitions {report.unread_partitions} of {settings.topic!r} were not read to the end of the "
            f"range (no data after {MAX_IDLE_POLLS} empty polls); exit {EXIT_INCOMPLETE}"
        )
    summary_path = os.environ.get("TRACEJUDGE_BACKFILL_SUMMARY")
    if summary_path:
        with open(summary_path, "w", encoding="utf-8") as handle:
            json.dump(report.__dict__ | {"judged_ids": sorted(j.job.conversation_id for j in finished)}, handle)
    return EXIT_INCOMPLETE if report.unread_partitions else 0
