"""`tracejudge backfill --from TIME --to TIME`: judge a past time range of the span topic.

Reads the records in the range with manual assignment (no group, no commits) into the live consumer's own state
machine (`streams/range_assembler.py`: its conversation tables, routing and rules), with record timestamps as the
clock, and judges through its judge pool and outputs: a conversation gets the same content id, hence the same result
ids, as live. Judges those that complete inside the range, reports those still open at --to, and skips
conversations whose result id is already in the results topic unless --rejudge.

Its verdicts go only to the results topic and OTLP (its Prometheus registry is not served), so without either it
refuses to start (exit 2) instead of paying for verdicts it would throw away. `--dry-run` reads the range the same way,
calls no judge, and prints how many conversations it would judge and what that would cost, estimated from LiteLLM's
price for the judge model and the tokens of the prompts the judges would be sent.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tracejudge._shared.text import counted

from .._gc import collect_less
from ..conversation.job import JudgeJob
from ..emit.delivery import Delivery
from ..judging.judgement import OUTCOME_JUDGED, OUTCOME_SAMPLED_OUT, OUTCOME_SKIPPED_BUDGET, Judgement
from ..judging.pool import JudgePool
from ..judging.results import result_id
from .options import EXIT_USAGE, NOTIFY_OPTIONS, WATCH_OPTIONS, add_consumer_flags, field_help, settings_from_args

if TYPE_CHECKING:  # it imports kafka: loaded when a backfill runs, not by every command's parser
    from ..streams.range_assembler import RangeAssembler

logger = logging.getLogger("tracejudge.backfill")
# Timestamps within a partition are only roughly ordered (several producers): read this far past --to.
LATENESS_MS = 5 * 60_000
EXIT_INCOMPLETE = 1
# --dry-run's estimate of a verdict's length (JSON: label, evidence, reason), in output tokens per judge call.
ESTIMATED_OUTPUT_TOKENS = 200


# Consumer flags that mean nothing to backfill: no group or commits, no /metrics served (its registry is discarded),
# no backpressure (the range is read once), its own --sample-rate, no calibrated rates, and no internal topics.
BACKFILL_SKIPS = (
    "group_id",
    "replication_factor",
    "internal_topic_config",
    "start_from",
    "sample_rate",
    "calibration",
    "metrics_host",
    "metrics_port",
    "max_agents",
    "window_sessions",
    "window_seconds",
    "max_open_conversations",
    "commit_interval",
    *WATCH_OPTIONS,
    *NOTIFY_OPTIONS,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from", dest="start", required=True, metavar="TIME", help="start: ISO 8601 or Unix seconds (required)"
    )
    parser.add_argument("--to", dest="end", required=True, metavar="TIME", help="end, exclusive: as --from (required)")
    parser.add_argument("--agent", default=None, help="only this agent's conversations (default all)")
    parser.add_argument(
        "--sample-rate",
        dest="backfill_sample_rate",
        type=float,
        default=None,
        metavar="RATE",
        help=field_help("sample_rate"),
    )
    parser.add_argument(
        "--rejudge", action="store_true", help="judge again what the results topic already has (default off)"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="read the range, call no judge: print how many conversations would be judged and the estimated "
        "judge cost (default off)",
    )
    add_consumer_flags(parser, skip=BACKFILL_SKIPS)


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
    selected: int = 0  # sent to the judges (with --dry-run: that would be sent)
    dry_run: bool = False
    estimated_input_tokens: int = 0  # --dry-run: the prompts' tokens, every judge call of every selected conversation
    estimated_output_tokens: int = 0
    estimated_cost_usd: float | None = None  # --dry-run: None when LiteLLM has no price for the judge model
    # The result ids of the conversations complete in the range that are judged now or were already (the summary).
    result_ids: list[str] = field(default_factory=list)


def _existing_result_ids(settings: Any) -> set[str]:
    """The result ids already on the results topic, read to its high watermark (as `compare` reads it)."""
    from ..kafka import KafkaClients
    from ..kafka.reader import partitions_for, records_to_end, stall_bound_s, topic_partitions

    clients = KafkaClients.from_settings(settings)
    topic = settings.results_topic
    consumer = clients.consumer("tracejudge-backfill-results")
    ids: set[str] = set()
    what = f"the results topic {topic!r}"
    stall_s = stall_bound_s(clients.consumer_config())
    try:
        assigned = topic_partitions(topic, partitions_for(consumer, topic, what=what, stall_s=stall_s))
        if not assigned:
            return ids
        for record in records_to_end(consumer, assigned, what=what, stall_s=stall_s):
            try:
                ids.add(json.loads(record.value)["result_id"])
            except (ValueError, KeyError, TypeError):
                continue
    finally:
        consumer.close()
    return ids


class MalformedRecords:
    """A record that does not read: counted (tracejudge_records_total), said (rate-limited) and dead-lettered when
    there is a dead-letter topic; the rest of the range goes on."""

    def __init__(self, prometheus: Any, dead_letter: Any = None) -> None:
        from tracejudge._shared.rate_limited_log import RateLimitedLog

        self.prometheus = prometheus
        self.dead_letter = dead_letter
        self.log = RateLimitedLog(logger, interval_s=10.0)

    def __call__(self, record: Any, reason: str) -> None:
        self.prometheus.record_records("malformed")
        self.log.warning("malformed record at partition %d offset %d: %s", record.partition, record.offset, reason)
        if self.dead_letter is not None:
            headers = [
                ("tracejudge.error", reason.encode("utf-8", "replace")[:1000]),
                ("tracejudge.source", f"{record.topic}/{record.partition}/{record.offset}".encode()),
            ]
            self.dead_letter.write(record.key, record.value or b"", headers)


class Judging:
    """Completed conversations from the tables to the judges (or out as not selected, counted by reason in `select`),
    and each outcome back to its table once its outputs are durable, as the live judge worker acknowledges it."""

    def __init__(
        self,
        assembler: RangeAssembler,
        select: Callable[[JudgeJob], bool],
        delivery: Delivery,
        pool: JudgePool | None = None,
        on_finished: Callable[[Judgement], None] | None = None,
    ) -> None:
        self.assembler = assembler
        self.select = select
        self.delivery = delivery
        self.pool = pool
        self.on_finished = on_finished

    def dispatch(self) -> int:
        """Send what completed since the last call; how many conversations that was."""
        dispatches = self.assembler.take_dispatches()
        for dispatch in dispatches:
            job = dispatch.job
            if self.select(job) and self.pool is not None:
                self.pool.submit(job)
            else:
                self.delivery.not_judged(Judgement(job, OUTCOME_SAMPLED_OUT))
        return len(dispatches)

    def drain(self) -> None:
        self.delivery.drain(self._finished)

    def _finished(self, judgement: Judgement) -> None:
        self.assembler.verdict(judgement.job, judgement.outcome)
        if self.on_finished is not None:
            self.on_finished(judgement)


def topic_partitions_of(consumer: Any, topic: str) -> list[int]:
    return sorted(consumer.partitions_for_topic(topic) or set())


def read_range(
    consumer: Any,
    topic: str,
    start_ms: int,
    end_ms: int,
    judging: Judging,
    report: BackfillReport,
    malformed: Callable[[Any, str], None] | None = None,
) -> None:
    """Fold every record with a timestamp in [start, end) into the tables, its timestamp as the clock.

    Conversations idle by record time are completed and judged while reading; at the end every partition's clock
    stands at `end_ms`. Partitions that could not be read to the end of the range (no progress for the reader's
    stall bound: `kafka.reader`) are listed in `report.unread_partitions`.
    """
    from ..kafka.reader import ReadStalled, TopicReader, stall_bound_s, topic_partitions

    assembler = judging.assembler
    assigned = topic_partitions(topic, topic_partitions_of(consumer, topic))
    start: dict[Any, int] = {}
    empty: list[Any] = []
    try:
        starts = consumer.offsets_for_times({tp: start_ms for tp in assigned})
    except Exception:  # brokers without time index support: scan from the beginning and filter by timestamp
        starts = None
    for tp in assigned:
        found = starts.get(tp) if starts is not None else None
        if found is not None and found.timestamp is not None and found.timestamp < 0:
            found = None  # "no such record" as some brokers say it (an offset without a timestamp)
        if found is not None:
            start[tp] = found.offset
        elif starts is not None:  # no record at or after --from: nothing to read in this partition
            empty.append(tp)
    stall_s = stall_bound_s(getattr(consumer, "config", {}) or {})
    reader = TopicReader(consumer, assigned, what=f"{topic!r} from --from to --to", start=start, stall_s=stall_s)
    for tp in empty:
        reader.finish(tp)
    try:
        for tp, records in reader:
            for record in records:
                report.scanned += 1
                if record.timestamp >= end_ms + LATENESS_MS:
                    reader.finish(tp)
                    break
                if not start_ms <= record.timestamp < end_ms:
                    continue
                report.records += 1
                failure = assembler.record(tp.partition, record.key, record.value, record.timestamp)
                if failure is not None:
                    report.malformed += 1
                    if malformed is not None:
                        malformed(record, failure)
            done = {p.partition for p in reader.partitions if reader.caught_up(p)}
            assembler.advance(done, end_ms)
            judging.dispatch()
            judging.drain()
    except ReadStalled as stalled:
        report.unread_partitions = stalled.unread
        logger.warning(
            "no progress for %g s: partitions %s were not read to the end of the range", stall_s, stalled.unread
        )
    # Conversations that went quiet for the idle timeout before --to are complete; the rest are still open.
    assembler.advance({tp.partition for tp in assigned}, end_ms)
    judging.dispatch()
    report.still_open = assembler.still_open()


def _selector(namespace: argparse.Namespace, settings: Any, existing: set[str], report: BackfillReport) -> Any:
    """Which complete conversations backfill judges; the others go out as sampled out (counted by reason)."""
    from tracejudge.metrics.judges import result_keys

    from ..judging.sampling import Sampler

    rate = namespace.backfill_sample_rate if namespace.backfill_sample_rate is not None else settings.sample_rate
    sampler = Sampler(rate, settings.agent_sample_rates)
    keys = result_keys(settings.judge_files, settings.metrics)  # a rubric file's version names its results

    def select(job: JudgeJob) -> bool:
        report.complete += 1
        indices = [t.index for t in job.exchanges if t.index is not None]
        if indices and min(indices) > 0 and not job.truncated:
            report.partial += 1  # it began before --from (not cut by a bound, as live cuts): judging part would mislead
        elif namespace.agent and job.agent != namespace.agent:
            report.skipped_agent += 1
        elif not sampler.should_judge(job):
            report.sampled_out += 1
        else:
            ids = [result_id(job.conversation_id, keys[metric], job.content_id) for metric in settings.metrics]
            report.result_ids.extend(ids)
            if existing and all(i in existing for i in ids):
                report.skipped_existing += 1
                return False
            report.selected += 1
            return True
        return False

    return select


def _refuse_without_output(namespace: argparse.Namespace, settings: Any) -> bool:
    """Backfill's verdicts go to the results topic and OTLP only: without either, judging would spend for nothing."""
    if namespace.dry_run or settings.results_topic or settings.otlp_endpoint:
        return False
    print(
        "tracejudge backfill: no output for the verdicts: give --results-topic or --otlp-endpoint (backfill's "
        "Prometheus metrics are not served), or --dry-run to count the conversations and estimate the judge cost",
        file=sys.stderr,
    )
    return True


def run_backfill(namespace: argparse.Namespace) -> int:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from .._errors import StartupError
    from .._logging import configure_logging

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
    if _refuse_without_output(namespace, settings):
        return EXIT_USAGE
    configure_logging(settings.log_level, settings.log_format)
    collect_less()  # it reads a range of the topic as `consume` does
    if not getattr(namespace, "dry_run", False):  # a dry run judges nothing: no judge check
        from ..app import tier_problem
        from .judge_check import refuse_judge

        # Configuration first (exit 2 before connecting to anything): a tier the provider lacks, then the judge (3).
        problem = tier_problem(settings.model_copy(update={"shadow_judge_model": None}))  # no shadow in backfill
        if problem is not None:
            print(f"tracejudge backfill: {problem}", file=sys.stderr)
            return EXIT_USAGE
        refused = refuse_judge(settings)
        if refused is not None:
            return refused
    try:
        return _backfill(namespace, settings, start, end)
    except StartupError as exc:
        print(f"tracejudge backfill: {exc}", file=sys.stderr)
        return exc.exit_code


def _connect(settings: Any) -> Any:
    """The reading consumer (no group, no commits); KafkaUnreachable when the brokers do not answer."""
    from ..kafka import KafkaClients
    from ..kafka.connect import reaching_kafka

    clients = KafkaClients.from_settings(settings)
    with reaching_kafka(settings.bootstrap_servers, clients.consumer_config()):
        return clients.consumer("tracejudge-backfill")


def _backfill(namespace: argparse.Namespace, settings: Any, start: datetime, end: datetime) -> int:

    consumer = _connect(settings)  # first: a broker that is down is one line before anything else is set up
    try:
        if namespace.dry_run:
            return _dry_run(namespace, settings, consumer, start, end)
        return _judge_range(namespace, settings, consumer, start, end)
    finally:
        consumer.close()


def _existing(namespace: argparse.Namespace, settings: Any) -> set[str]:
    if not settings.results_topic or namespace.rejudge:
        return set()
    return _existing_result_ids(settings)


def _dry_run(namespace: argparse.Namespace, settings: Any, consumer: Any, start: datetime, end: datetime) -> int:
    """Read the range as a backfill would, judge nothing; count what would be judged and estimate its cost."""
    from prometheus_client import CollectorRegistry
    from rich.console import Console

    from ..emit.prometheus import ConsumerInstruments

    report = BackfillReport(dry_run=True)
    start_ms, end_ms = int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    select = _selector(namespace, settings, _existing(namespace, settings), report)
    estimate = CostEstimate(settings)

    def would_judge(job: JudgeJob) -> bool:
        if select(job):
            estimate.add(job)
        return False  # never to the judges: out as sampled out, to no sink

    from ..streams.range_assembler import RangeAssembler

    # No judges, no sinks, no dead-letter topic: a dry run writes nothing anywhere.
    assembler = RangeAssembler(settings, len(topic_partitions_of(consumer, settings.topic)) or 1, start_ms)
    judging = Judging(assembler, would_judge, Delivery(ConsumerInstruments(CollectorRegistry()), []))
    read_range(consumer, settings.topic, start_ms, end_ms, judging, report)
    judging.drain()
    estimate.fill(report)
    console = Console()
    console.print(_table(f"backfill --dry-run {start.isoformat()} → {end.isoformat()}", report, dry_run=True))
    calls = report.selected * len(settings.metrics)
    if report.estimated_cost_usd is None:
        cost = f"unknown: LiteLLM has no price for {settings.judge_model!r} ({estimate.price_error})"
    else:
        cost = f"${report.estimated_cost_usd:.4f}"
    console.print(
        f"dry run: would judge {counted(report.selected, 'conversation')} "
        f"({calls} judge calls with {settings.judge_model}); "
        f"estimated judge cost: {cost}"
    )
    console.print(
        f"(an estimate: LiteLLM's price for {settings.judge_model} × the {report.estimated_input_tokens} tokens of the "
        f"prompts the judges would be sent, counted by LiteLLM, plus ~{ESTIMATED_OUTPUT_TOKENS} output tokens a call; "
        "retries and prompt caching are not counted. No judge was called.)"
    )
    return _finish(report, settings, [])


class CostEstimate:
    """Tokens of the prompts the judges would be sent for each selected conversation, priced with LiteLLM's list.

    The prompts are built by the metrics' own `build_messages` (rubric, transcript within its token budget, redaction
    as configured); nothing here calls a judge."""

    def __init__(self, settings: Any) -> None:
        from tracejudge._shared.redact import redact_pii
        from tracejudge.metrics.judges import judge_classes

        self.model = settings.judge_model
        redactor = redact_pii if settings.redact else None
        classes = judge_classes(settings.judge_files)
        self.prompts = [classes[name](self.model, redactor=redactor) for name in settings.metrics]
        self.input_tokens = 0
        self.calls = 0
        self.price_error = ""

    def add(self, job: JudgeJob) -> None:
        import litellm

        from tracejudge.metrics import ConversationalEvalTestCase, EvalTestCase

        case = ConversationalEvalTestCase(
            name=job.conversation_id,
            turns=[EvalTestCase(input=t.input or "", actual_output=t.output or "") for t in job.judgeable_exchanges],
        )
        for prompt in self.prompts:
            self.input_tokens += litellm.token_counter(model=self.model, messages=prompt.build_messages(case))
            self.calls += 1

    def fill(self, report: BackfillReport) -> None:
        import litellm

        report.estimated_input_tokens = self.input_tokens
        report.estimated_output_tokens = self.calls * ESTIMATED_OUTPUT_TOKENS
        litellm.suppress_debug_info = True  # an unknown model would print LiteLLM's provider list
        try:
            prompt_usd, output_usd = litellm.cost_per_token(
                model=self.model,
                prompt_tokens=report.estimated_input_tokens,
                completion_tokens=report.estimated_output_tokens,
            )
        except Exception as exc:
            self.price_error = str(exc).splitlines()[0][:200]
            report.estimated_cost_usd = None
            return
        report.estimated_cost_usd = float(prompt_usd + output_usd)


def _table(title: str, report: BackfillReport, *, dry_run: bool = False) -> Any:
    from rich.table import Table

    table = Table(title=title)
    table.add_column("what")
    table.add_column("count", justify="right")
    judged: tuple[tuple[str, int], ...] = (
        (("would be judged", report.selected),) if dry_run else (("judged", report.judged), ("failed", report.failed))
    )
    for name, value in (
        ("records read", report.records),
        ("malformed records", report.malformed),
        ("conversations complete in range", report.complete),
        *judged,
        ("already judged (results topic)", report.skipped_existing),
        ("sampled out", report.sampled_out),
        *(() if dry_run else (("skipped for budget", report.skipped_budget),)),
        ("other agents", report.skipped_agent),
        ("began before --from", report.partial),
        ("still open at --to (not judged)", len(report.still_open)),
    ):
        table.add_row(name, str(value))
    return table


def _finish(report: BackfillReport, settings: Any, judgements: list[Judgement]) -> int:
    """The lines every run ends with, the summary file (TRACEJUDGE_BACKFILL_SUMMARY) and the exit code."""
    from rich.console import Console

    console = Console()
    if report.still_open:
        console.print("still open at --to: " + ", ".join(sorted(report.still_open)[:20]))
    if report.sink_errors:
        console.print(f"result sinks failed {report.sink_errors} times (see the log)")
    if report.unread_partitions:
        console.print(
            f"INCOMPLETE: partitions {report.unread_partitions} of {settings.topic!r} were not read to the end of the "
            f"range (Kafka made no progress on them for the stall bound); exit {EXIT_INCOMPLETE}"
        )
    summary_path = os.environ.get("TRACEJUDGE_BACKFILL_SUMMARY")
    if summary_path:
        with open(summary_path, "w", encoding="utf-8") as handle:
            json.dump(report.__dict__ | {"judged_ids": sorted(j.job.conversation_id for j in judgements)}, handle)
    return EXIT_INCOMPLETE if report.unread_partitions else 0


def _judge_range(namespace: argparse.Namespace, settings: Any, consumer: Any, start: datetime, end: datetime) -> int:
    from prometheus_client import CollectorRegistry
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from ..app import build_judges, build_outputs
    from ..conversation.textless import TextlessSpans
    from ..emit import KafkaWriter
    from ..emit.prometheus import ConsumerInstruments
    from ..kafka.connect import reaching_kafka
    from ..streams.range_assembler import RangeAssembler

    console = Console()
    report = BackfillReport()
    start_ms, end_ms = int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    existing = _existing(namespace, settings)
    prometheus = ConsumerInstruments(CollectorRegistry(), max_agents=settings.max_agents)
    outputs = build_outputs(
        settings, service_name="tracejudge-backfill", on_output_error=prometheus.record_output_error
    )
    dead_letter = None
    if settings.dead_letter_topic:
        producer_config = settings.producer_config()
        with reaching_kafka(settings.bootstrap_servers, producer_config):
            dead_letter = KafkaWriter(
                settings.bootstrap_servers,
                settings.dead_letter_topic,
                on_error=lambda: prometheus.record_output_error("dead_letter"),
                **producer_config,
            ).start()
    # Feedback agreement is not joined: its retention runs on wall time, and backfill's registry is thrown away.
    judges = build_judges(settings)
    delivery = Delivery(prometheus, outputs.sinks)
    pool = JudgePool(
        judges,
        delivery.judged,
        max_concurrency=settings.judge_concurrency(len(judges)),
        max_requests_per_minute=settings.max_requests_per_minute,
        max_cost_per_hour=settings.max_cost_per_hour,
    )
    textless = TextlessSpans(prometheus.record_textless_span)
    partitions = len(topic_partitions_of(consumer, settings.topic)) or 1
    assembler = RangeAssembler(settings, partitions, start_ms, textless=textless)
    finished: list[Judgement] = []
    judging = Judging(
        assembler,
        _selector(namespace, settings, existing, report),
        delivery,
        pool,
        on_finished=lambda judgement: finished.append(judgement) if judgement.outcome != OUTCOME_SAMPLED_OUT else None,
    )
    pool.start()
    read_range(consumer, settings.topic, start_ms, end_ms, judging, report, MalformedRecords(prometheus, dead_letter))
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("${task.fields[cost]:.4f}"),
        console=console,
    ) as progress:
        task = progress.add_task("backfill: judging", total=report.selected, cost=0.0)
        writes_end: float | None = None  # results still being written get the grace period once judging is over
        while True:
            judging.drain()  # may re-complete a conversation not judged that got negative feedback meanwhile
            dispatched = judging.dispatch()
            cost = sum(r.cost_usd or 0 for j in finished for r in j.results)
            progress.update(task, total=report.selected, completed=len(finished), cost=cost)
            if dispatched or pool.pending:  # pending counts down even if a sink fails
                time.sleep(0.1)
                continue
            if not delivery.awaiting:
                break
            writes_end = writes_end or time.monotonic() + settings.shutdown_grace
            if time.monotonic() >= writes_end:
                break
            time.sleep(0.05)
    pool.stop(settings.shutdown_grace)
    outputs.close()
    if dead_letter is not None:
        dead_letter.close()
    judging.drain()
    report.sink_errors = delivery.sink_errors
    judgements = finished + [j for j in delivery.undelivered() if j.outcome != OUTCOME_SAMPLED_OUT]
    for judgement in judgements:
        if judgement.outcome == OUTCOME_JUDGED:
            report.judged += 1
        elif judgement.outcome == OUTCOME_SKIPPED_BUDGET:
            report.skipped_budget += 1
        else:
            report.failed += 1
        report.cost_usd += sum(r.cost_usd or 0 for r in judgement.results)
    console.print(_table(f"backfill {start.isoformat()} → {end.isoformat()}", report))
    console.print(f"judge cost: ${report.cost_usd:.4f}")
    return _finish(report, settings, judgements)
