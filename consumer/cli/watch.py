"""`tracejudge watch`: the verdicts as they reach the results topic, live in a terminal (or once, for scripts).

What a newcomer looks for after `ready`: the latest verdicts with their reasons, and counts per agent, judge and
verdict. Read from the results topic from its beginning, with no group and no commit (a reader, never a member:
watching changes no offset of anyone), then tailed. A result id read twice counts once, its newest record standing
(a conversation retrying, then judged, is the verdict); shadow records, sampled-out, skipped and retrying outcomes
are no verdicts (the footer counts the last three). On a terminal the view is redrawn in place; piped, it is printed
once and each new verdict appended as a line. `--once` prints what the topic holds and exits 0. Ctrl-C exits 0.
Exit 1 when the results topic does not exist (`--once`), 2 for a usage error, 69 when the brokers do not answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..judging.gold import LABELS, judge_name, unknown_verdicts

EXIT_OK, EXIT_NO_TOPIC, EXIT_USAGE = 0, 1, 2
WATCH_OPTIONS = frozenset({"bootstrap_servers", "group_id", "results_topic", "kafka_config", "log_level", "log_format"})
FAILED = "failed"  # the verdict column of a judgement that failed (its reason: the error)
REASON_CHARS = 100
LIVE_LATEST = 20  # the live view's latest verdicts (a screen's worth)
POLL_MS = 500
LOOK_FOR_TOPIC_S = 2.0  # live: how often a results topic not created yet is looked for
NOT_VERDICTS = ("sampled_out", "skipped_budget", "retrying")


class WatchError(ValueError):
    """A usage error: one line on stderr, exit 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--verdict",
        action="append",
        default=None,
        metavar="LABEL[,LABEL]",
        help="only these verdicts, e.g. hallucination,failed (repeatable; default every verdict)",
    )
    parser.add_argument(
        "--metric",
        action="append",
        default=None,
        type=judge_name,
        help="only this judge: a built-in or a rubric file's (repeatable; default all)",
    )
    parser.add_argument("--agent", default=None, help="only this agent's conversations (default all)")
    parser.add_argument(
        "--latest",
        type=int,
        default=None,
        metavar="N",
        help=f"the latest N verdicts shown (default {LIVE_LATEST}; with --once every verdict)",
    )
    parser.add_argument(
        "--once", action="store_true", help="print what the results topic holds now and exit 0 (for scripts)"
    )


@dataclass(frozen=True)
class Filters:
    verdicts: frozenset[str] | None = None
    metrics: frozenset[str] | None = None
    agent: str | None = None

    def match(self, row: Row) -> bool:
        return (
            (self.verdicts is None or row.verdict in self.verdicts)
            and (self.metrics is None or row.metric in self.metrics)
            and (self.agent is None or row.agent == self.agent)
        )

    def describe(self) -> str:
        parts = []
        if self.verdicts is not None:
            parts.append(f"--verdict {','.join(sorted(self.verdicts))}")
        if self.metrics is not None:
            parts.append(f"--metric {','.join(sorted(self.metrics))}")
        if self.agent is not None:
            parts.append(f"--agent {self.agent}")
        return " ".join(parts)


def filters_from(namespace: argparse.Namespace) -> Filters:
    """WatchError for a verdict no judge gives, or --latest below 1."""
    verdicts = None
    if namespace.verdict:
        verdicts = frozenset(v.strip() for item in namespace.verdict for v in item.split(",") if v.strip())
        unknown, known = unknown_verdicts(verdicts - {FAILED}, namespace.metric, LABELS)
        known |= {FAILED}
        if unknown:
            raise WatchError(f"--verdict: unknown {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    if namespace.latest is not None and namespace.latest < 1:
        raise WatchError(f"--latest must be at least 1, got {namespace.latest}")
    metrics = frozenset(namespace.metric) if namespace.metric else None
    return Filters(verdicts, metrics, namespace.agent)


@dataclass(frozen=True)
class Row:
    judged_at: str
    conversation_id: str
    agent: str
    metric: str
    verdict: str
    reason: str

    def line(self) -> str:
        reason = " ".join(self.reason.split())
        if len(reason) > REASON_CHARS:
            reason = reason[: REASON_CHARS - 1].rstrip() + "…"
        return f"{self.judged_at}  {self.conversation_id}  {self.agent}  {self.metric}  {self.verdict}  {reason}"


def row_of(record: dict[str, Any]) -> Row | None:
    """A verdict's row (a judge's verdict, or a failure); None for a record that is no production verdict."""
    outcome = record.get("outcome")
    if record.get("shadow") or outcome in NOT_VERDICTS:
        return None
    if record.get("verdict") is not None and record.get("error") is None:
        verdict, reason = str(record["verdict"]), str(record.get("reason") or "")
    elif outcome in (FAILED, "empty") or record.get("error") is not None:
        verdict, reason = FAILED, f"{record.get('error_kind') or outcome}: {record.get('error') or 'no verdict'}"
    else:
        return None
    judged_at = str(record.get("judged_at") or "")[:19].replace("T", " ")
    return Row(
        judged_at,
        str(record.get("conversation_id")),
        str(record.get("agent")),
        str(record.get("metric")),
        verdict,
        reason,
    )


MAX_ROWS = 100_000  # verdicts held (and counted) at most: the latest ones


@dataclass
class View:
    """The verdicts read so far, newest record per result id; what the screen shows is made from it."""

    topic: str
    filters: Filters = field(default_factory=Filters)
    latest: int | None = LIVE_LATEST  # None: every verdict
    records: int = 0
    rows: dict[str, Row] = field(default_factory=dict)  # result id → its newest verdict, in the order last written
    others: dict[str, str] = field(default_factory=dict)  # result id → an outcome that is no verdict (yet)
    forgotten: int = 0  # verdicts dropped from `rows` past MAX_ROWS (a week of a busy topic is not held whole)

    def add(self, value: bytes | None) -> Row | None:
        """One results-topic record; its row when it is a verdict the filters show (to append to a piped view)."""
        self.records += 1
        try:
            record = json.loads(value) if value is not None else None
        except (TypeError, ValueError):
            return None
        if not isinstance(record, dict) or record.get("shadow"):
            return None
        key = str(record.get("result_id") or f"{record.get('conversation_id')}/{record.get('metric')}")
        row = row_of(record)
        if row is None:  # no verdict: a verdict given before stands (a replay that was sampled out overrides none)
            if record.get("outcome") in NOT_VERDICTS and key not in self.rows:
                self.others[key] = str(record.get("outcome"))
            else:
                self.others.pop(key, None)
            return None
        self.others.pop(key, None)
        self.rows.pop(key, None)  # re-inserted: the newest copy, at the end
        self.rows[key] = row
        while len(self.rows) > MAX_ROWS:  # bounded memory and render time: the oldest go
            del self.rows[next(iter(self.rows))]
            self.forgotten += 1
        while len(self.others) > MAX_ROWS:
            del self.others[next(iter(self.others))]
        return row if self.filters.match(row) else None

    def shown(self) -> list[Row]:
        return [row for row in self.rows.values() if self.filters.match(row)]

    def render(self) -> str:
        rows = self.shown()
        lines = [f"tracejudge watch: results topic {self.topic!r}, {self.records} records read"]
        if self.filters.describe():
            lines[0] += f"; only {self.filters.describe()}"
        if self.forgotten:
            lines[0] += f"; counting the latest {MAX_ROWS} verdicts ({self.forgotten} older ones not held)"
        if not rows:
            if self.rows:
                lines.append(f"no verdict matches {self.filters.describe()} ({len(self.rows)} verdicts on the topic)")
            else:
                lines.append("no verdicts yet: the consumer writes one record per judge as it judges a conversation")
        else:
            latest = rows if self.latest is None else rows[-self.latest :]
            some = f"; the latest {len(latest)}" if len(latest) < len(rows) else ""
            lines.append(f"{len(rows)} verdicts{some}, newest last:")
            lines += [f"  {row.line()}" for row in latest]
            lines.append("counts:")
            for title, of in (("agent", "agent"), ("judge", "metric"), ("verdict", "verdict")):
                counts = Counter(getattr(row, of) for row in rows)
                lines.append(f"  by {title}: " + ", ".join(f"{name} {n}" for name, n in sorted_counts(counts)))
        waiting = Counter(self.others.values())
        if waiting:
            lines.append("not verdicts: " + ", ".join(f"{name} {n}" for name, n in sorted_counts(waiting)))
        return "\n".join(lines) + "\n"


def sorted_counts(counts: Counter[str]) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def _close(consumer: Any) -> None:
    """Close without waiting on a broker that is gone (kafka-python's close may block on a frozen one)."""
    closing = threading.Thread(target=consumer.close, name="tracejudge-close", daemon=True)
    closing.start()
    closing.join(2.0)


class Screen:
    """Live on a terminal, the whole view redrawn in place; piped (or `--once`), the view once, then each new verdict
    appended."""

    def __init__(self, out: TextIO, *, live: bool) -> None:
        self.out = out
        self.tty = live and out.isatty()
        self.drawn = False

    def show(self, view: View, new: Iterable[Row]) -> None:
        if self.tty:
            self.out.write("\x1b[H\x1b[2J" + view.render())
        elif not self.drawn:
            self.out.write(view.render())
        else:
            self.out.writelines(f"  {row.line()}\n" for row in new)
        self.drawn = True
        self.out.flush()


def run_watch(namespace: argparse.Namespace) -> int:
    from .._errors import StartupError
    from .._logging import configure_logging
    from ..kafka.topics import results_topic_of
    from .options import settings_from_args

    settings = settings_from_args(namespace)
    try:
        filters = filters_from(namespace)
    except WatchError as exc:
        print(f"tracejudge watch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    topic = results_topic_of(settings)
    if not topic:
        print(
            "tracejudge watch: results are off (--no-results / TRACEJUDGE_NO_RESULTS): there are no verdicts to watch",
            file=sys.stderr,
        )
        return EXIT_USAGE
    configure_logging(settings.log_level, settings.log_format)
    latest = namespace.latest or (None if namespace.once else LIVE_LATEST)
    view = View(topic, filters, latest)
    try:
        return watch(settings, view, once=namespace.once, out=sys.stdout)
    except StartupError as exc:
        print(f"tracejudge watch: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C: what was shown stays; nothing to undo
        if sys.stdout.isatty():
            sys.stdout.write("\n")
        return EXIT_OK
    except BrokenPipeError:  # `tracejudge watch | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error as Python flushes at exit
        return EXIT_OK


def watch(settings: Any, view: View, *, once: bool, out: TextIO) -> int:
    """Read the results topic to its end and print the view; live, go on reading new records until interrupted."""
    from .._logging import quiet_kafka_connections
    from ..kafka import KafkaClients
    from ..kafka.connect import reaching_kafka
    from ..kafka.reader import partitions_for, stall_bound_s, topic_partitions

    clients = KafkaClients.from_settings(settings)
    config = clients.consumer_config()
    stall_s = stall_bound_s(config)
    what = f"results topic {view.topic!r}"
    with reaching_kafka(settings.bootstrap_servers, config):
        consumer = clients.consumer("tracejudge-watch")  # no group: nothing joined, nothing committed
    screen = Screen(out, live=not once)
    try:
        with quiet_kafka_connections():
            partitions = partitions_for(consumer, view.topic, what=what, stall_s=stall_s)
        if not partitions and once:
            print(
                f"tracejudge watch: {what} does not exist: no consumer of group {settings.group_id!r} has written "
                "verdicts yet, or they go to another topic (--group-id, --results-topic)",
                file=sys.stderr,
            )
            return EXIT_NO_TOPIC
        said = False
        while not partitions:  # live: wait for the consumer to create it
            if not said:
                out.write(f"tracejudge watch: waiting for {what} to be created (a consumer's first start)\n")
                out.flush()
                said = True
            time.sleep(LOOK_FOR_TOPIC_S)  # nothing to wake on: the broker tells no one a topic appeared
            partitions = partitions_for(consumer, view.topic, what=what, stall_s=stall_s)
        assigned = topic_partitions(view.topic, partitions)
        read_to_end(consumer, assigned, view, what, stall_s)
        screen.show(view, ())
        if once:
            return EXIT_OK
        while True:  # live: every new record, redrawn (or appended) as it comes
            new = []
            for batch in consumer.poll(timeout_ms=POLL_MS).values():
                new += [row for record in batch if (row := view.add(record.value)) is not None]
            if new:
                screen.show(view, new)
    finally:
        _close(consumer)


def read_to_end(consumer: Any, partitions: list[Any], view: View, what: str, stall_s: float) -> None:
    """The topic from its beginning to its high watermarks (kafka.reader's one stopping rule); the consumer stays
    assigned and positioned after them, for the live view."""
    from .._logging import quiet_kafka_connections
    from ..kafka.reader import records_to_end

    with quiet_kafka_connections():
        for record in records_to_end(consumer, partitions, what=what, stall_s=stall_s):
            view.add(record.value)
