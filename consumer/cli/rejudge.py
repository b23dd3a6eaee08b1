"""`tracejudge rejudge`: judge again, once, each conversation whose final outcome was `failed` (after a fix: a wrong
judge model corrected, a key renewed).

The results topic is read to its end; the LAST record per (conversation, metric) decides (a failure judged since,
or still retrying, is not selected; `empty` is not a failure a judge can fix). Each selected transcript's job is
found in the judge queue (the record the assembler wrote, by content id) and written back there, unchanged but for a
`tracejudge.rejudge` header naming the failed result: the running `consume` replicas judge it as any job, so the new
outcome reaches the results topic and the metrics as any judgement does (nothing is judged in this process). The
worker's settled verdicts never remember a failure, so the copy is judged, not answered from memory.

"Once": every failure requested (its result id and the time it failed) is recorded in `<group>-rejudged` (compacted,
kafka/topics.py's REJUDGED) once its job is written, and a later run skips those: a second run judges nothing. A
re-judgement that fails again is a new failure (a later time): a run after a second fix judges it again, once. A job
whose record has left the judge queue (its retention) cannot be judged again here: counted and named (`tracejudge
backfill` covers it). `--dry-run` writes nothing: the counts per reason and agent and the estimated judge cost.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

EXIT_OK, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_INTERRUPTED = 0, 2, 69, 130
REJUDGE_OPTIONS = frozenset(
    {
        "bootstrap_servers",
        "group_id",
        "results_topic",
        "kafka_config",
        "judge_model",
        "metrics",
        "log_level",
        "log_format",
        "replication_factor",  # `<group>-rejudged` is created as the other internal topics are
        "internal_topic_config",
    }
)
FAILED = "failed"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reason",
        action="append",
        default=None,
        help="only failures of this reason, e.g. bad_request or auth (repeatable)",
    )
    parser.add_argument("--agent", action="append", default=None, help="only this agent's conversations (repeatable)")
    parser.add_argument("--from", dest="since", default=None, help="only failures judged at or after (ISO 8601)")
    parser.add_argument("--to", dest="until", default=None, help="only failures judged before (ISO 8601)")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="write nothing: print how many conversations would be judged again and the estimated judge cost",
    )


def _when(text: str | None, flag: str) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{flag} {text!r} is not an ISO 8601 time (e.g. 2026-12-05T13:00:00Z)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Filters:
    reasons: frozenset[str] = frozenset()
    agents: frozenset[str] = frozenset()
    since: datetime | None = None
    until: datetime | None = None

    def match(self, record: dict[str, Any]) -> bool:
        if self.reasons and reason_of(record) not in self.reasons:
            return False
        if self.agents and record.get("agent") not in self.agents:
            return False
        if self.since or self.until:
            try:
                judged = _when(record.get("judged_at"), "judged_at")
            except ValueError:
                return False
            if judged is None or (self.since and judged < self.since) or (self.until and judged >= self.until):
                return False
        return True


def failure_id(record: dict[str, Any]) -> str:
    """One failure: its result id (the same for every record of the transcript and metric) and when it failed, so a
    re-judgement that fails again is a new failure, itself judged again once by a later run (after a second fix)."""
    return f"{record.get('result_id')}@{record.get('judged_at')}"


def reason_of(record: dict[str, Any]) -> str:
    return str(record.get("error_kind") or record.get("retry_reason") or "unknown")


@dataclass
class Failed:
    """One transcript to judge again: its failed results (one per failed metric) and what they say."""

    conversation_id: str
    content_id: str
    agent: str
    reason: str
    result_ids: list[str] = field(default_factory=list)


def select_failed(records: Iterable[dict[str, Any]], filters: Filters, done: set[str]) -> list[Failed]:
    """The transcripts whose LAST outcome for some metric is `failed`, matching `filters`, none of whose failed
    results was already requested (`done`). Records come in topic order (keyed by conversation: one partition each,
    so per conversation this is the order they were written)."""
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for record in records:
        if not isinstance(record, dict) or record.get("shadow") or not record.get("conversation_id"):
            continue
        last[(str(record["conversation_id"]), str(record.get("metric")))] = record
    chosen: dict[str, Failed] = {}
    for record in last.values():
        if record.get("outcome") != FAILED or not filters.match(record) or failure_id(record) in done:
            continue
        content = str(record.get("content_id") or "")
        failed = chosen.setdefault(
            content,
            Failed(str(record["conversation_id"]), content, str(record.get("agent") or "unknown"), reason_of(record)),
        )
        failed.result_ids.append(failure_id(record))
    return [failed for failed in chosen.values() if failed.content_id]


def run_rejudge(namespace: argparse.Namespace) -> int:
    from .._errors import StartupError
    from .._logging import configure_logging
    from .options import settings_from_args

    settings = settings_from_args(namespace)
    configure_logging(settings.log_level, settings.log_format)
    try:
        filters = Filters(
            frozenset(namespace.reason or ()),
            frozenset(namespace.agent or ()),
            _when(namespace.since, "--from"),
            _when(namespace.until, "--to"),
        )
    except ValueError as exc:
        print(f"tracejudge rejudge: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from ..kafka import KafkaError

    try:
        return _rejudge(settings, filters, dry_run=namespace.dry_run)
    except StartupError as exc:
        print(f"tracejudge rejudge: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tracejudge rejudge: interrupted; a job written is recorded only once acknowledged: run it again")
        return EXIT_INTERRUPTED
    except KafkaError as exc:
        print(f"tracejudge rejudge: Kafka failed: {exc!r}; nothing unsent is recorded: run it again", file=sys.stderr)
        return EXIT_UNAVAILABLE


def _read(consumer: Any, topic: str, stall_s: float, *, required: bool) -> Iterable[Any]:
    """The topic's records to its end, as they are fetched (a big judge queue is never held whole)."""
    from .._errors import StartupError
    from ..kafka.reader import partitions_for, records_to_end, topic_partitions

    what = f"topic {topic!r}"
    known = partitions_for(consumer, topic, what=what, stall_s=stall_s)
    if not known:
        if required:
            raise StartupError(f"{what} does not exist (is --group-id or --results-topic right?)")
        return []
    return records_to_end(consumer, topic_partitions(topic, sorted(known)), what=what, stall_s=stall_s)


def _rejudge(settings: Any, filters: Filters, *, dry_run: bool) -> int:
    from ..kafka import KafkaClients
    from ..kafka.connect import reaching_kafka
    from ..kafka.reader import stall_bound_s
    from ..kafka.topics import InternalTopics, results_topic_of
    from ..streams import records as R

    results_topic = results_topic_of(settings)
    if not results_topic:
        print("tracejudge rejudge: --no-results: there is no results topic to find the failures in", file=sys.stderr)
        return EXIT_USAGE
    topics = InternalTopics(settings.group_id)
    clients = KafkaClients.from_settings(settings)
    config = clients.consumer_config()
    stall_s = stall_bound_s(config)
    with reaching_kafka(settings.bootstrap_servers, config):
        consumer = clients.consumer("tracejudge-rejudge")
    try:
        done = {
            r.key.decode("utf-8", "surrogatepass") for r in _read(consumer, topics.rejudged, stall_s, required=False)
        }
        failed = select_failed(_values(_read(consumer, results_topic, stall_s, required=True)), filters, done)
        if not failed:
            print(f"no conversation to judge again: {results_topic!r} holds no failed outcome left to rejudge")
            return EXIT_OK
        wanted = {f.content_id: f for f in failed}
        jobs: dict[str, Any] = {}
        for record in _read(consumer, topics.judge_queue, stall_s, required=True):
            if R.kind_of(record.headers) != R.JOB:
                continue
            try:
                content = R.loads(record.value).get("content_id")
            except Exception:
                continue
            if content in wanted:
                jobs[content] = record
    finally:
        consumer.close()
    missing = [f for f in failed if f.content_id not in jobs]
    found = [f for f in failed if f.content_id in jobs]
    if dry_run:
        return _dry_run(settings, found, missing, jobs)
    unsent = _write(settings, clients, topics, found, jobs)
    sent = len(found) - len(unsent)
    print(
        f"{_count(sent)} sent to be judged again by the running `tracejudge consume` replicas "
        f"(their outcomes reach {results_topic!r}); a second run judges none of them again"
    )
    _missing(missing)
    if unsent:
        ids = ", ".join(sorted(f.conversation_id for f in unsent)[:5])
        print(
            f"tracejudge rejudge: {_count(len(unsent))} could not be written to {topics.judge_queue!r} (e.g. {ids}): "
            "not recorded as sent; check the brokers and this client's Write ACL there, then run it again",
            file=sys.stderr,
        )
        return EXIT_UNAVAILABLE
    return EXIT_OK


def _values(records: Iterable[Any]) -> Iterable[dict[str, Any]]:
    for record in records:
        try:
            value = json.loads(record.value)
        except (TypeError, ValueError):
            continue
        if isinstance(value, dict):
            yield value


def _count(n: int) -> str:
    return f"{n} conversation" + ("" if n == 1 else "s")


def _missing(missing: list[Failed]) -> None:
    if missing:
        ids = ", ".join(sorted(f.conversation_id for f in missing)[:5])
        print(
            f"{_count(len(missing))} cannot be judged again here: the judge queue no longer holds their job "
            f"(retention), e.g. {ids}; `tracejudge backfill --rejudge --results-topic RESULTS` over their time "
            "range judges them (and every other conversation of that range: see its --dry-run cost)"
        )


def _write(settings: Any, clients: Any, topics: Any, found: list[Failed], jobs: dict[str, Any]) -> list[Failed]:
    """The jobs first, then the requests (`<group>-rejudged`, one per failed result) of the jobs the brokers
    acknowledged: a crash between them, or a job refused, leaves its request unrecorded, and the next run writes that
    job again (judged twice at worst, with the same result id; a worker that settled the first answers the copy from
    memory), never a failure marked done but not judged. Returns the failures whose job was not written.

    A job that went through retries carries its retry state (attempt, the horizon it had): dropped, so the copy is a
    fresh judgement with the whole horizon, as any judgement."""
    from ..kafka.topics import REJUDGED, TopicLayout, ensure
    from ..streams import records as R
    from ..streams.judge_task import REJUDGE_HEADER

    with clients.admin("tracejudge-rejudge") as admin:  # compacted, as the registry says (not auto-created)
        ensure(admin, [REJUDGED], topics.group_id, TopicLayout.from_settings(settings))
    producer = clients.producer("tracejudge-rejudge", acks="all")
    try:
        futures = []
        for failed in found:
            job = jobs[failed.content_id]
            headers = [(k, v) for k, v in (job.headers or []) if k != REJUDGE_HEADER]
            headers.append((REJUDGE_HEADER, ",".join(failed.result_ids).encode()))
            value = R.loads(job.value)
            value.pop("retry", None)
            value.pop("ripe_ms", None)
            future = producer.send(
                topics.judge_queue, key=job.key, value=R.dumps(value), headers=headers, partition=job.partition
            )
            futures.append((failed, future))
        producer.flush()
        sent = [failed for failed, future in futures if future.is_done and not future.failed()]
        now = datetime.now(tz=UTC).isoformat()
        markers = [
            producer.send(topics.rejudged, key=result.encode(), value=json.dumps({"requested_at": now}).encode())
            for failed in sent
            for result in failed.result_ids
        ]
        producer.flush()
        recorded = all(m.is_done and not m.failed() for m in markers)
        if not recorded:  # the jobs went out: a next run may send some again (at-least-once), say so
            print(
                "tracejudge rejudge: not every request could be recorded in "
                f"{topics.rejudged!r}: a next run may send some of these again",
                file=sys.stderr,
            )
        return [failed for failed, future in futures if failed not in sent]
    finally:
        producer.close()


def _dry_run(settings: Any, found: list[Failed], missing: list[Failed], jobs: dict[str, Any]) -> int:
    """Nothing written: the counts per reason and agent, and the judge cost estimated as backfill's dry run does."""
    from ..streams import records as R
    from .backfill import BackfillReport, CostEstimate

    print(f"rejudge --dry-run: {_count(len(found))} would be judged again")
    for (reason, agent), n in sorted(Counter((f.reason, f.agent) for f in found).items()):
        print(f"  reason {reason}, agent {agent}: {n}")
    report = BackfillReport(dry_run=True)
    estimate = CostEstimate(settings)
    for failed in found:
        record = jobs[failed.content_id]
        job, _sampled, _retry = R.job_record(record.value, key=f"{record.partition}:{record.offset}", partition=0)
        estimate.add(job)
    estimate.fill(report)
    if report.estimated_cost_usd is None:
        cost = f"unknown: LiteLLM has no price for {settings.judge_model!r} ({estimate.price_error})"
    else:
        cost = f"${report.estimated_cost_usd:.4f}"
    print(
        f"estimated judge cost: {cost} ({report.estimated_input_tokens} input tokens, "
        f"{report.estimated_output_tokens} output tokens; no judge was called, nothing was written)"
    )
    _missing(missing)
    return EXIT_OK
