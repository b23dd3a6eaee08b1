"""`tracejudge compare`: two judges' verdicts on the same conversations, read back from the results topic.

Before switching the judge model (or a rubric), run the candidate as a shadow (`--shadow-judge-model`) for a while,
then compare: agreement, Cohen's kappa, the confusion matrix, the conversations that flipped (with their trace ids)
and each side's hallucination rate with its interval. Pairs are the same conversation, transcript (content id) and
metric on both sides, so a continuation is never compared with an older version of itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tracejudge.metrics.calibration import cohen_kappa, confusion_matrix, proportion_interval

from ..judging.gold import KAPPA_WEIGHTING, LABELS, judge_name, labels_with

EXIT_OK, EXIT_BELOW, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports it
SIDES = ("shadow", "model", "rubric_version")
# The consumer options that mean something here: where the results topic is and how to log.
# --group-id finds the consumer's default results topic (`<group>-results`); --results-topic names another.
COMPARE_OPTIONS = frozenset(
    {"bootstrap_servers", "group_id", "results_topic", "kafka_config", "log_level", "log_format", "judge_files"}
)


class CompareError(ValueError):
    """A usage error: one line on stderr, exit 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from",
        dest="start",
        required=True,
        metavar="TIME",
        help="judged at or after: ISO 8601 or Unix seconds (required)",
    )
    parser.add_argument("--to", dest="end", required=True, metavar="TIME", help="judged before: as --from (required)")
    parser.add_argument(
        "--by",
        choices=SIDES,
        default="shadow",
        help="what tells the two sides apart: shadow (primary vs shadow results), model or rubric_version (give "
        "--a and --b) (default shadow)",
    )
    parser.add_argument("--a", default=None, metavar="VALUE", help="side a's model or rubric version (default none)")
    parser.add_argument("--b", default=None, metavar="VALUE", help="side b's model or rubric version (default none)")
    parser.add_argument(
        "--metric",
        action="append",
        default=None,
        type=judge_name,
        help="only this judge: a built-in or a --judge-file judge (default all)",
    )
    parser.add_argument("--agent", default=None, help="only this agent's conversations (default all)")
    parser.add_argument(
        "--min-agreement", type=float, default=None, metavar="X", help="exit 1 below this agreement (default no gate)"
    )
    parser.add_argument(
        "--output", default=None, metavar="compare.json", help="write the comparison as JSON (default not written)"
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    conversation_id: str
    content_id: str
    metric: str
    verdict: str
    model: str
    rubric_version: str
    trace_id: str | None
    agent: str


def side_of(record: dict[str, Any], by: str, a: str | None, b: str | None) -> str | None:
    """ "a", "b" or None (neither side) for one results-topic record."""
    if by == "shadow":
        return "b" if record.get("shadow") else "a"
    value = record.get(by)
    if value == a:
        return "a"
    if value == b:
        return "b"
    return None


def pair_up(
    records: list[dict[str, Any]],
    *,
    by: str = "shadow",
    a: str | None = None,
    b: str | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    agent: str | None = None,
    metrics: list[str] | None = None,
    labels: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, list[tuple[Verdict, Verdict]]]:
    """Per metric, (a, b) verdict pairs on the same conversation, content id and metric; a replayed result (the
    same id written twice) counts once, a failed judgement (no verdict) never."""
    labels = LABELS if labels is None else labels
    sides: dict[str, dict[tuple[str, str, str], Verdict]] = {"a": {}, "b": {}}
    for record in records:
        if record.get("error") is not None or record.get("verdict") is None:
            continue
        metric = record.get("metric")
        if metric not in labels or (metrics and metric not in metrics) or record["verdict"] not in labels[metric]:
            continue
        if agent is not None and record.get("agent") != agent:
            continue
        if start is not None or end is not None:
            try:
                judged = datetime.fromisoformat(str(record.get("judged_at")))
            except ValueError:
                continue
            if (start is not None and judged < start) or (end is not None and judged >= end):
                continue
        side = side_of(record, by, a, b)
        if side is None:
            continue
        verdict = Verdict(
            str(record.get("conversation_id")),
            str(record.get("content_id")),
            metric,
            record["verdict"],
            str(record.get("model")),
            str(record.get("rubric_version")),
            record.get("trace_id"),
            str(record.get("agent")),
        )
        sides[side][(verdict.conversation_id, verdict.content_id, metric)] = verdict
    pairs: dict[str, list[tuple[Verdict, Verdict]]] = {}
    for key in sorted(sides["a"].keys() & sides["b"].keys()):
        pairs.setdefault(key[2], []).append((sides["a"][key], sides["b"][key]))
    return pairs


def _rate(verdicts: list[Verdict]) -> dict[str, Any]:
    n = len(verdicts)
    hits = sum(v.verdict == "hallucination" for v in verdicts)
    interval = proportion_interval(hits, n)
    return {"hallucinations": hits, "n": n, "rate": interval.estimate, "lower": interval.lower, "upper": interval.upper}


def compare_metric(
    metric: str, pairs: list[tuple[Verdict, Verdict]], labels: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """`labels`: the judge's (default a built-in's); a rubric file's judge's kappa is unweighted."""
    labels = LABELS[metric] if labels is None else labels
    matrix = confusion_matrix(((x.verdict, y.verdict) for x, y in pairs), labels)
    flipped = [
        {
            "conversation_id": x.conversation_id,
            "trace_id": x.trace_id,
            "content_id": x.content_id,
            "agent": x.agent,
            "a": x.verdict,
            "b": y.verdict,
        }
        for x, y in pairs
        if x.verdict != y.verdict
    ]
    report: dict[str, Any] = {
        "pairs": len(pairs),
        "agreement": (len(pairs) - len(flipped)) / len(pairs),
        "kappa": cohen_kappa(matrix, KAPPA_WEIGHTING.get(metric, "unweighted")),
        "kappa_weighting": KAPPA_WEIGHTING.get(metric, "unweighted"),
        "a": {
            "models": sorted({x.model for x, _ in pairs}),
            "rubric_versions": sorted({x.rubric_version for x, _ in pairs}),
        },
        "b": {
            "models": sorted({y.model for _, y in pairs}),
            "rubric_versions": sorted({y.rubric_version for _, y in pairs}),
        },
        "labels": list(labels),
        "confusion_matrix": matrix,
        "flipped": flipped,
    }
    if metric == "failure_rate":
        report["hallucination_rate"] = {"a": _rate([x for x, _ in pairs]), "b": _rate([y for _, y in pairs])}
    return report


NO_RESULTS_TOPIC = (
    "TRACEJUDGE_NO_RESULTS is set: no results topic to read; unset it for this command (the consumer wrote "
    "`<group>-results`, or its --results-topic, unless it ran with --no-results)"
)


def missing_results_topic(settings: Any, topic: str) -> str:
    """Why a results topic is not there, for the readers (compare, export): one line, what to give instead."""
    if settings.results_topic:
        return f"--results-topic: topic {topic!r} does not exist"
    return (
        f"results topic {topic!r} (the default of --group-id {settings.group_id!r}) does not exist: give the "
        "consumer's --group-id, or its --results-topic if it named one (a consumer with --no-results writes none)"
    )


def read_results(settings: Any) -> list[dict[str, Any]]:
    """Every record of the results topic up to its high watermark (no group, no commits); KafkaUnreachable when the
    brokers do not answer, at the start or once a read makes no progress for the stall bound (kafka.reader). An
    unreadable record is skipped (counted in the report). kafka-python's connection lines are dropped meanwhile:
    what follows is one line, the answer or why there is none."""
    from .._logging import quiet_kafka_connections
    from ..kafka import KafkaClients
    from ..kafka.connect import reaching_kafka
    from ..kafka.reader import partitions_for, records_to_end, stall_bound_s, topic_partitions

    clients = KafkaClients.from_settings(settings)
    config = clients.consumer_config()
    stall_s = stall_bound_s(config)
    topic = settings.results_topic_name()
    if not topic:
        raise CompareError(NO_RESULTS_TOPIC)
    with reaching_kafka(settings.bootstrap_servers, config):
        consumer = clients.consumer("tracejudge-compare")
    records: list[dict[str, Any]] = []
    with quiet_kafka_connections():
        try:
            partitions = partitions_for(consumer, topic, what=f"results topic {topic!r}", stall_s=stall_s)
            if not partitions:
                raise CompareError(missing_results_topic(settings, topic))
            assigned = topic_partitions(topic, partitions)
            for record in records_to_end(consumer, assigned, what=f"results topic {topic!r}", stall_s=stall_s):
                try:
                    value = json.loads(record.value)
                except (TypeError, ValueError):
                    continue
                if isinstance(value, dict):
                    records.append(value)
        finally:
            _close(consumer)
    return records


def results_or_exit(settings: Any, command: str) -> list[dict[str, Any]] | int:
    """read_results for a command that reads the results topic: its records, or the exit code once the one line
    saying why was printed (2 usage, 69 Kafka unreachable, 130 Ctrl-C)."""
    from .._errors import StartupError

    try:
        return read_results(settings)
    except CompareError as exc:
        print(f"tracejudge {command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StartupError as exc:
        print(f"tracejudge {command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"tracejudge {command}: interrupted (Ctrl-C): nothing written", file=sys.stderr)
        return EXIT_INTERRUPTED


def _close(consumer: Any) -> None:
    """Close without waiting on a broker that is gone (kafka-python's close may block on a frozen one)."""
    closing = threading.Thread(target=consumer.close, name="tracejudge-close", daemon=True)
    closing.start()
    closing.join(2.0)


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def print_comparison(report: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    for metric, m in report["metrics"].items():
        console.print(
            f"\n[bold]{metric}[/bold]  pairs={m['pairs']}  agreement={_fmt(m['agreement'])}  "
            f"kappa={_fmt(m['kappa'])} ({m['kappa_weighting']})  a={','.join(m['a']['models'])}  "
            f"b={','.join(m['b']['models'])}"
        )
        table = Table(title=f"{metric}: a (rows) × b (columns)", title_justify="left")
        table.add_column("a \\ b")
        for label in m["labels"]:
            table.add_column(label, justify="right")
        for i, (label, row) in enumerate(zip(m["labels"], m["confusion_matrix"], strict=True)):
            table.add_row(label, *(f"[bold]{c}[/bold]" if i == j else str(c) for j, c in enumerate(row)))
        console.print(table)
        for side, rate in m.get("hallucination_rate", {}).items():
            console.print(
                f"hallucination rate {side}: {rate['rate']:.3f} (95% {rate['lower']:.3f}–{rate['upper']:.3f}, "
                f"{rate['hallucinations']}/{rate['n']})"
            )
        console.print(f"flipped: {len(m['flipped'])}")
        for flip in m["flipped"][:50]:
            console.print(f"  {flip['conversation_id']}  trace {flip['trace_id']}  {flip['a']} → {flip['b']}")
        if len(m["flipped"]) > 50:
            console.print(f"  … {len(m['flipped']) - 50} more (all in --output)")


def _usage(message: str) -> int:
    print(f"tracejudge compare: {message}", file=sys.stderr)
    return EXIT_USAGE


def run_compare(namespace: argparse.Namespace) -> int:
    """0; 1 when an agreement is below --min-agreement; 2 for a usage error; 69 when Kafka does not answer; 130 on
    Ctrl-C."""
    from rich.console import Console

    from .._logging import configure_logging
    from .backfill import parse_time
    from .options import settings_from_args

    settings = settings_from_args(namespace)
    try:
        start, end = parse_time(namespace.start), parse_time(namespace.end)
    except ValueError as exc:
        return _usage(f"invalid time: {exc}")
    if start >= end:
        return _usage(f"--from ({start.isoformat()}) must be before --to ({end.isoformat()})")
    if not settings.results_topic_name():
        return _usage(NO_RESULTS_TOPIC)
    if namespace.by != "shadow" and (not namespace.a or not namespace.b or namespace.a == namespace.b):
        return _usage(f"--by {namespace.by} needs two different values, --a and --b")
    if namespace.min_agreement is not None and not 0.0 <= namespace.min_agreement <= 1.0:
        return _usage(f"--min-agreement must be within 0..1, got {namespace.min_agreement:g}")
    if namespace.output is not None and not Path(namespace.output).resolve().parent.is_dir():
        return _usage(f"--output: directory {Path(namespace.output).resolve().parent} does not exist")
    configure_logging(settings.log_level, settings.log_format)
    records = results_or_exit(settings, "compare")
    if isinstance(records, int):
        return records
    known = labels_with(settings.judge_files)  # the built-ins' and each --judge-file judge's labels
    pairs = pair_up(
        records,
        by=namespace.by,
        a=namespace.a,
        b=namespace.b,
        start=start,
        end=end,
        agent=namespace.agent,
        metrics=namespace.metric,
        labels=known,
    )
    if not pairs:
        sides = "primary and shadow" if namespace.by == "shadow" else f"{namespace.by} {namespace.a} and {namespace.b}"
        return _usage(
            f"no conversation judged by both {sides} between {start.isoformat()} and {end.isoformat()} in "
            f"{settings.results_topic_name()!r} ({len(records)} records read)"
        )
    report = {
        "results_topic": settings.results_topic_name(),
        "from": start.isoformat(),
        "to": end.isoformat(),
        "by": namespace.by,
        "a": namespace.a or ("primary" if namespace.by == "shadow" else None),
        "b": namespace.b or ("shadow" if namespace.by == "shadow" else None),
        "records": len(records),
        "metrics": {
            metric: compare_metric(metric, metric_pairs, known[metric]) for metric, metric_pairs in pairs.items()
        },
    }
    missed = [
        f"{metric} agreement {m['agreement']:.3f} < {namespace.min_agreement:g}"
        for metric, m in report["metrics"].items()
        if namespace.min_agreement is not None and m["agreement"] < namespace.min_agreement
    ]
    report["gate"] = {"min_agreement": namespace.min_agreement, "missed": missed}
    console = Console()
    print_comparison(report, console)
    if namespace.output is not None:
        try:
            Path(namespace.output).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        except OSError as exc:
            return _usage(f"--output: cannot write {namespace.output}: {exc.strerror or exc}")
        console.print(f"comparison written to {namespace.output}")
    if missed:
        console.print(f"[red]below --min-agreement: {'; '.join(missed)}[/red]")
        return EXIT_BELOW
    return EXIT_OK
