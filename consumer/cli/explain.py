"""`tracejudge explain CONVERSATION_ID`: one conversation's story, told from what Kafka holds.

The changelog (`<group>-conversations-changelog`, the conversation's state partition) while the conversation is
retained: every state record is a moment of its life (its turns as they were seen, its completion and why, the
snapshots sent to the judges and the outcome each got back). The results topic after, and for the judgements (the
consumer's default `<group>-results`, found from --group-id alone, or --results-topic): each
metric's record per attempt (retrying until T, then judged, failed with its reason, empty, sampled out with the rate
and sample point, skipped for budget), with the verdict, reason, evidence, model, rubric version, result id and delay.

Both are read whole from the beginning (no group, no commit): a scan, meant for a question about one conversation,
not for a dashboard. Exit 0 with the story, 1 for an id Kafka knows nothing of, 2 for a usage error, 69 when the
brokers do not answer.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

EXIT_OK, EXIT_UNKNOWN, EXIT_USAGE = 0, 1, 2
EXPLAIN_OPTIONS = frozenset(
    {"bootstrap_servers", "group_id", "results_topic", "kafka_config", "log_level", "log_format"}
)
_COMPLETIONS = {
    "end_marker": "the application ended it (an end marker)",
    "idle_timeout": "no turn for --session-idle-timeout",
    "turn_cap": "it reached --max-turns-per-conversation (the rest goes on in a window of its own)",
    "memory": "the memory bound (--max-open-conversations / --max-state-bytes) completed it early",
    "negative_feedback": "negative feedback asked for it to be judged (again)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("conversation_id", metavar="CONVERSATION_ID", help="the conversation (session) id")
    parser.add_argument("--json", action="store_true", help="the story as one JSON object, for scripts")


def _iso_ms(ms: int | float | None) -> str | None:
    if not ms:
        return None
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC).isoformat(timespec="milliseconds")


def _iso_ns(ns: int | None) -> str | None:
    return _iso_ms(ns / 1e6) if isinstance(ns, int) and ns > 0 else None


def read_topic(consumer: Any, topic: str, partitions: list[int] | None, key: bytes, stall_s: float) -> list[Any]:
    """The records of `topic` (those `partitions`, or all) keyed `key`, up to each partition's high watermark."""
    from ..kafka.reader import partitions_for, records_to_end, topic_partitions

    what = f"topic {topic!r}"
    known = partitions_for(consumer, topic, what=what, stall_s=stall_s)
    if not known:
        return []
    assigned = topic_partitions(topic, [p for p in known if partitions is None or p in partitions])
    return [r for r in records_to_end(consumer, assigned, what=what, stall_s=stall_s) if r.key == key]


def read_story(settings: Any, conversation_id: str) -> tuple[list[Any], list[dict[str, Any]]]:
    """The conversation's changelog records and its results-topic records (KafkaUnreachable: StartupError)."""
    from ..kafka import KafkaClients
    from ..kafka.connect import reaching_kafka
    from ..kafka.partitioner import state_partition
    from ..kafka.reader import stall_bound_s
    from ..kafka.topics import InternalTopics

    clients = KafkaClients.from_settings(settings)
    config = clients.consumer_config()
    stall_s = stall_bound_s(config)
    with reaching_kafka(settings.bootstrap_servers, config):
        consumer = clients.consumer("tracejudge-explain")
    key = conversation_id.encode("utf-8", "surrogatepass")
    try:
        changelog = InternalTopics(settings.group_id).changelog
        count = len(consumer.partitions_for_topic(changelog) or ())
        states = (
            read_topic(consumer, changelog, [state_partition(conversation_id, count)], key, stall_s) if count else []
        )
        results: list[dict[str, Any]] = []
        results_topic = settings.results_topic_name()
        if results_topic:
            for record in read_topic(consumer, results_topic, None, key, stall_s):
                try:
                    value = json.loads(record.value)
                except (TypeError, ValueError):
                    continue
                if isinstance(value, dict) and not value.get("shadow"):
                    results.append(value)
    finally:
        consumer.close()
    return states, results


def build_story(conversation_id: str, states: list[Any], results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The story as a dict; None when Kafka holds nothing of the conversation."""
    from ..judging.sampling import sample_point
    from ..streams import records as R

    if not states and not results:
        return None
    turns_seen: dict[str, dict[str, Any]] = {}
    history: list[dict[str, Any]] = []
    latest: dict[str, Any] | None = None
    forgotten_at: str | None = None
    last_status: tuple[Any, ...] | None = None
    for record in states:
        if record.value is None:
            forgotten_at = _iso_ms(record.timestamp)
            continue
        try:  # MessagePack or JSON, as the assembler wrote it (`records.encode_state`), read as the JSON shape
            state = R.decode_state(R.kind_of(record.headers), record.value).to_json()
        except Exception:  # an unreadable record costs that record, never the story
            continue
        latest = state
        for turn in state.get("turns") or []:
            span = str(turn.get("span_id"))
            if span not in turns_seen:
                turns_seen[span] = {
                    "span_id": span,
                    "trace_id": turn.get("trace_id"),
                    "started_at": _iso_ns(turn.get("start_ns")),
                    "ended_at": _iso_ns(turn.get("end_ns")),
                    "seen_at": _iso_ms(record.timestamp),
                    "input": (turn.get("input") or "")[:120],
                    "_order": (turn.get("start_ns") or 0, turn.get("index") or 0),
                }
        status = (state.get("status"), state.get("completed_by"), tuple(state.get("dispatched") or {}))
        if status != last_status:
            history.append(
                {
                    "at": _iso_ms(record.timestamp),
                    "status": state.get("status"),
                    "completed_by": state.get("completed_by"),
                    "completed_at": _iso_ms(state.get("completed_ms")),
                    "snapshots": dict(state.get("dispatched") or {}),
                }
            )
            last_status = status
    first = results[0] if results else {}
    snapshots: dict[str, dict[str, Any]] = {}  # content id → its judgement records, in the order written
    for record in results:
        entry = snapshots.setdefault(
            str(record.get("content_id")),
            {
                "content_id": record.get("content_id"),
                "version": record.get("version"),
                "completed_by": record.get("completed_by"),
                "completed_at": record.get("completed_at"),
                "metrics": {},
            },
        )
        entry["metrics"].setdefault(str(record.get("metric")), []).append(_attempt(record))
    for content, outcome in ((latest or {}).get("dispatched") or {}).items():
        entry = snapshots.setdefault(
            content, {"content_id": content, "version": None, "completed_by": None, "completed_at": None}
        )
        entry.setdefault("metrics", {})
        entry["owner_outcome"] = outcome
    judgements = list(snapshots.values())
    for entry in judgements:
        entry["final"] = {metric: attempts[-1]["outcome"] for metric, attempts in entry["metrics"].items()}
        entry["why_none"] = None if entry["metrics"] else _why_none(entry.get("owner_outcome"))
    point = sample_point(conversation_id)
    sampled = next((r for r in results if r.get("outcome") == "sampled_out"), None)
    story = {
        "conversation_id": conversation_id,
        "agent": (latest or {}).get("agent") or first.get("agent"),
        "source": "changelog" if latest is not None else "results topic",
        "status": (latest or {}).get("status") or ("forgotten" if forgotten_at else "completed"),
        "forgotten_at": forgotten_at,
        "turns": [
            {k: v for k, v in turn.items() if k != "_order"}
            for turn in sorted(turns_seen.values(), key=lambda t: t["_order"])
        ],
        "trace_ids": sorted(
            {t["trace_id"] for t in turns_seen.values() if t["trace_id"]} | set(first.get("trace_ids") or [])
        ),
        "completed_by": (latest or {}).get("completed_by") or first.get("completed_by"),
        "completed_at": _iso_ms((latest or {}).get("completed_ms")) or first.get("completed_at"),
        "history": history,
        "sampling": {
            "sample_point": round(point, 6),
            "sampled_in": sampled is None,
            "rate": None if sampled is None else sampled.get("sample_rate"),
        },
        "judgements": judgements,
        "continued": len(judgements) > 1,
    }
    return story


def _attempt(record: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "outcome",
        "verdict",
        "failure_mode",
        "score",
        "passed",
        "reason",
        "evidence",
        "model",
        "rubric_version",
        "result_id",
        "delay_s",
        "judged_at",
        "error_kind",
        "error",
        "attempt",
        "retry_reason",
        "retry_until",
        "next_attempt_at",
        "sample_rate",
        "sample_point",
        "trace_id",
    )
    return {key: record.get(key) for key in keys if record.get(key) not in (None, [], "")}


def _why_none(outcome: str | None) -> str:
    if outcome is None:
        return "sent to the judges; no outcome yet (waiting in the judge queue or being judged)"
    if outcome == "retrying":
        return "its judgement failed for a reason that can pass: waiting in the retry topic for its next attempt"
    if outcome == "sampled_out":  # recorded by the owner as it sent the job: the worker may not have read it yet
        return (
            "sampled out when it completed, and the results topic holds no record of it yet: the judge worker has not "
            "read its job (see tracejudge_judge_queue_lag), or the consumer ran with --no-results, another "
            "--results-topic than this one, or --no-results-unjudged"
        )
    return (
        f"its owner recorded {outcome!r} but the results topic holds no record of it (the consumer ran with "
        "--no-results or another --results-topic than this one)"
    )


def print_story(story: dict[str, Any], out: Any) -> None:
    w = out.write
    w(f"conversation {story['conversation_id']}  agent {story['agent'] or '(not recorded)'}  ")
    w(f"({story['status']}; from the {story['source']})\n")
    if story["trace_ids"]:
        w(f"traces: {', '.join(story['trace_ids'])}\n")
    if story["turns"]:
        w(f"turns seen: {len(story['turns'])}\n")
        for turn in story["turns"]:
            times = "  ".join(
                part for part in (turn["started_at"], f"seen {turn['seen_at']}" if turn["seen_at"] else None) if part
            )
            trace = f"  trace {turn['trace_id']}" if turn["trace_id"] else ""
            w(f"  {times}{trace}  {turn['input']!r}\n")
    else:
        w("turns: no longer in the changelog (past retention); the results below remain\n")
    if story["completed_by"]:
        why = _COMPLETIONS.get(story["completed_by"], story["completed_by"])
        at = f" at {story['completed_at']}" if story["completed_at"] else ""
        w(f"completed{at}: {story['completed_by']} ({why})\n")
    elif story["status"] == "open":
        w("not complete yet: it waits for an end marker, --session-idle-timeout of silence or the turn cap\n")
    sampling = story["sampling"]
    if sampling["sampled_in"]:
        w(f"sampling: sampled in (sample point {sampling['sample_point']})\n")
    else:
        rate = f" >= rate {sampling['rate']}" if sampling["rate"] is not None else ", its rate not recorded"
        w(f"sampling: sampled out (sample point {sampling['sample_point']}{rate})\n")
    for i, entry in enumerate(story["judgements"]):
        label = "continuation" if i else "snapshot"
        w(f"{label} {i + 1}{_known(('version', entry.get('version')), ('content', entry.get('content_id')))}\n")
        if entry["why_none"]:
            w(f"  no judgement: {entry['why_none']}\n")
        for metric, attempts in entry["metrics"].items():
            for attempt in attempts:
                w(f"  {metric}: {_line(attempt)}\n")
                if attempt.get("outcome") == "judged":  # the why, not only the verdict: reason and evidence
                    w(f"    reason: {attempt.get('reason') or '(the judge gave none)'}\n")
                    evidence = attempt.get("evidence") or []
                    w(f"    evidence: {'; '.join(repr(str(e)) for e in evidence) if evidence else '(none quoted)'}\n")
    if story["forgotten_at"]:
        w(f"forgotten by its owner at {story['forgotten_at']} (retention)\n")


def _known(*fields: tuple[str, Any]) -> str:
    """`: version 2, content ab12` with the fields that are known; nothing for those that are not (never `None`)."""
    known = [f"{name} {value}" for name, value in fields if value not in (None, "")]
    return f": {', '.join(known)}" if known else ""


def _line(attempt: dict[str, Any]) -> str:
    outcome = attempt.get("outcome")
    if outcome == "retrying":
        return (
            f"attempt {attempt.get('attempt')} failed ({attempt.get('retry_reason')}), retrying: next attempt at "
            f"{attempt.get('next_attempt_at')}, until {attempt.get('retry_until')}"
        )
    if outcome == "judged":
        score = f" (score {attempt['score']})" if attempt.get("score") is not None else ""
        judge = " ".join(str(attempt[k]) for k in ("model", "rubric_version") if attempt.get(k))
        delay = f", {attempt['delay_s']}s after completion" if attempt.get("delay_s") is not None else ""
        result = f"; result {attempt['result_id']}" if attempt.get("result_id") else ""
        about = f" about {attempt['failure_mode']}" if attempt.get("failure_mode") else ""  # its failure mode
        return f"judged {attempt.get('verdict')}{about}{score}{' by ' + judge if judge else ''}{delay}{result}"
    if outcome == "sampled_out":
        return (
            f"sampled out{_known(('rate', attempt.get('sample_rate')), ('sample point', attempt.get('sample_point')))}"
        )
    if outcome == "skipped_budget":
        return "skipped: --max-cost-per-hour was spent"
    tries = f" after {attempt['attempt']} attempts" if attempt.get("attempt") else ""
    kind = f" ({attempt['error_kind']})" if attempt.get("error_kind") else ""
    return f"{outcome}{kind}{tries}: {attempt.get('error') or 'no reason recorded'}"


def run_explain(namespace: argparse.Namespace) -> int:
    from .._errors import StartupError
    from .._logging import configure_logging
    from .options import settings_from_args

    settings = settings_from_args(namespace)
    configure_logging(settings.log_level, settings.log_format)
    conversation_id = namespace.conversation_id
    try:
        states, results = read_story(settings, conversation_id)
    except StartupError as exc:
        print(f"tracejudge explain: {exc}", file=sys.stderr)
        return exc.exit_code
    story = build_story(conversation_id, states, results)
    if story is None:
        where = f"the changelog of group {settings.group_id!r}"
        results_topic = settings.results_topic_name()
        if results_topic:
            where += f" or the results topic {results_topic!r}"
        else:
            where += " (TRACEJUDGE_NO_RESULTS: no results topic read)"
        print(f"tracejudge explain: no conversation {conversation_id!r} in {where}", file=sys.stderr)
        return EXIT_UNKNOWN
    if namespace.json:
        print(json.dumps(story, ensure_ascii=False, indent=2))
    else:
        print_story(story, sys.stdout)
    return EXIT_OK
