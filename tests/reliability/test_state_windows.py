"""Durable conversation state, window by window, through real `tracejudge consume` processes on Tansu.

Each test drives the moments an operator meets: a graceful restart with conversations open (with and without turn
indices), a continuation after a restart and after its partition moved, spans keyed by trace id as the OTel
Collector writes them with three replicas and a restart, a slow judge with a full backlog past the open-conversation
bound, a kill -9 while the OTLP endpoint is down, three replicas sharing one budget. The judge server records every
call's transcript: each assertion is about whole transcripts, result ids and nothing lost.
"""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from prometheus_client.parser import text_string_to_metric_families

from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer, Reply, conversation_text
from tests.support.otlp_receiver import OtlpReceiver, attributes
from tests.support.pipeline import consumer_process, read_all, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.tracer import conversation, end_conversation, traced_agent

# three replicas joining, restarting and dying while conversations flow: alone (tests/run_suite.py)
pytestmark = pytest.mark.serial

_QUESTION = re.compile(r"win (\S+) q(\d+)")
_METRICS_AT = re.compile(r"metrics at (http://\S+/metrics)")


class Replica:
    """One `tracejudge consume` process with its log; `metric()` scrapes its /metrics."""

    def __init__(self, broker: EmbeddedBroker, topic: str, group: str, results: str, log: Path, **env: str) -> None:
        self.log = log
        self.process = consumer_process(broker, topic, group, results, log=log, **env)
        self._url: str | None = None

    def url(self) -> str:
        if self._url is None:
            wait_for(lambda: _METRICS_AT.search(self.log.read_text()) is not None, 60, "the metrics endpoint")
            found = _METRICS_AT.search(self.log.read_text())
            assert found is not None
            self._url = found.group(1)
        return self._url

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels` (0 when the process is gone)."""
        try:
            text = urllib.request.urlopen(self.url(), timeout=5).read().decode()
        except OSError:
            return 0.0
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total

    def stop(self, how: str = "term") -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)
        self.process.wait(90)

    def ready(self) -> None:
        wait_for(lambda: "ready: consuming partitions" in self.log.read_text(), 90, "the replica ready")


def calls_by_conversation(server: JudgeServer) -> dict[str, list[list[int]]]:
    """For each conversation, the turn numbers (in transcript order) each judge call saw."""
    seen: dict[str, list[list[int]]] = defaultdict(list)
    for request in list(server.requests):
        turns: dict[str, list[int]] = defaultdict(list)
        for cid, number in _QUESTION.findall(conversation_text(request)):
            if int(number) not in turns[cid]:  # the answer repeats the question: one turn each
                turns[cid].append(int(number))
        for cid, numbers in turns.items():
            seen[cid].append(numbers)
    return seen


def results_by_conversation(broker: EmbeddedBroker, results: str) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = defaultdict(list)
    for record in read_all(broker.bootstrap_servers, results):
        value = json.loads(record.value)
        found[value["conversation_id"]].append(value)
    return found


def settle(server: JudgeServer, quiet_s: float = 4.0) -> None:
    """Wait until the judge server has had no call for `quiet_s` (nothing more is coming)."""
    state = {"count": -1, "since": time.monotonic()}

    def quiet() -> bool:
        count = len(server.requests)
        if count != state["count"]:
            state.update(count=count, since=time.monotonic())
        return time.monotonic() - state["since"] > quiet_s

    wait_for(quiet, 120, "no more judge calls")


class Turns:
    """Plays numbered turns of conversations through @traced_agent, optionally with turn indices."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.provider = traced_app(bootstrap, topic)

        @traced_agent("support", tracer_provider=self.provider)
        def respond(question: str, session_id: str) -> str:
            return "answer to " + question

        self.respond = respond

    def turn(self, cid: str, k: int, *, indexed: bool) -> None:
        if indexed:
            with conversation(cid, agent="support", turn_index=k - 1, tracer_provider=self.provider):
                self.respond(f"win {cid} q{k}", session_id=cid)
        else:
            self.respond(f"win {cid} q{k}", session_id=cid)

    def end(self, cid: str) -> None:
        end_conversation(cid, agent="support", tracer_provider=self.provider)

    def flush(self) -> None:
        self.provider.force_flush()


def _setup(broker: EmbeddedBroker, partitions: int = 3) -> tuple[str, str, str]:
    topic = f"win-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, partitions)
    results = f"{topic}-results"
    broker.create_topic(results, 1)
    return topic, results, f"win-{uuid.uuid4().hex[:6]}"


def test_graceful_restart_then_continuation_after_the_partition_moved(
    broker: EmbeddedBroker, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = scripted_judge
    topic, results, group = _setup(broker)
    ids = [f"g{i}" for i in range(20)]
    indexed = {cid: i % 2 == 0 for i, cid in enumerate(ids)}  # half with turn indices, half without
    turns = Turns(broker.bootstrap_servers, topic)
    first = Replica(broker, topic, group, results, tmp_path / "a.log")
    first.ready()
    for cid in ids:
        turns.turn(cid, 1, indexed=indexed[cid])
    turns.flush()
    wait_for(lambda: first.metric("tracejudge_records_total", outcome="ok") >= len(ids), 60, "turn 1 read")
    first.stop("term")  # graceful: its state goes to the changelog, its offsets are committed
    for cid in ids:
        turns.turn(cid, 2, indexed=indexed[cid])
    turns.flush()
    second = Replica(broker, topic, group, results, tmp_path / "b.log")
    second.ready()
    for cid in ids:
        turns.turn(cid, 3, indexed=indexed[cid])
        turns.end(cid)
    turns.flush()
    wait_for(lambda: set(calls_by_conversation(judge_server)) >= set(ids), 90, "every conversation judged")
    settle(judge_server)
    calls = calls_by_conversation(judge_server)
    assert all(calls[cid] == [[1, 2, 3]] for cid in ids), {c: v for c, v in calls.items() if v != [[1, 2, 3]]}
    # The conversations continue a while later, after another restart in which their partitions move.
    second.stop("term")
    third = Replica(broker, topic, group, results, tmp_path / "c.log")
    fourth = Replica(broker, topic, group, results, tmp_path / "d.log")
    third.ready()
    fourth.ready()
    for cid in ids:
        turns.turn(cid, 4, indexed=indexed[cid])
        turns.end(cid)
    turns.flush()
    wait_for(lambda: all(len(calls_by_conversation(judge_server)[c]) >= 2 for c in ids), 120, "continuations judged")
    settle(judge_server)
    for replica in (third, fourth):
        replica.stop("term")
    calls = calls_by_conversation(judge_server)
    assert all(calls[cid] == [[1, 2, 3], [1, 2, 3, 4]] for cid in ids), {
        c: v for c, v in calls.items() if v != [[1, 2, 3], [1, 2, 3, 4]]
    }
    by_conversation = results_by_conversation(broker, results)
    for cid in ids:
        versions = by_conversation[cid]
        assert len(versions) == 2 and len({r["result_id"] for r in versions}) == 2, versions  # two transcripts
        assert sorted(r["turn_count"] for r in versions) == [3, 4]
    turns.provider.shutdown()


class TraceKeyed(SpanExporter):
    """What the OTel Collector's Kafka exporter writes with `partition_traces_by_id`: one record per trace, keyed by
    the trace id (so one conversation's turns land on different partitions)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = KafkaProducer(bootstrap_servers=bootstrap)
        self.topic = topic

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        by_trace: dict[int, list[ReadableSpan]] = defaultdict(list)
        for span in spans:
            by_trace[span.context.trace_id].append(span)
        for trace_id, members in by_trace.items():
            self.producer.send(
                self.topic, key=f"{trace_id:032x}".encode(), value=encode_spans(members).SerializeToString()
            )
        self.producer.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.producer.close()


def test_trace_keyed_spans_with_three_replicas_and_a_restart(
    broker: EmbeddedBroker, judge_server: JudgeServer, tmp_path: Path
) -> None:
    """Turn 3 and the end markers are written while partitions move to the replica joining: a moved task reads its
    repartition partition (events routed from elsewhere, stamped later) before its input backlog (turn 3 of
    conversations owned elsewhere). Its clock must not claim that backlog read (tests/consumer/
    test_trace_keyed_windows.py): an end marker read elsewhere then completed its conversation without turn 3. The
    end grace is short here so the burst outlasts it (each record is flushed before the next: nothing here is late,
    so a correct clock needs no grace at all)."""
    judge_server.responder = scripted_judge
    topic, results, group = _setup(broker)
    provider = TracerProvider(resource=Resource.create({"service.name": "collector-route"}))
    provider.add_span_processor(SimpleSpanProcessor(TraceKeyed(broker.bootstrap_servers, topic)))

    @traced_agent("support", tracer_provider=provider)
    def respond(question: str, session_id: str) -> str:
        return "answer to " + question

    env = {"TRACEJUDGE_END_GRACE": "0.3"}
    replicas = [Replica(broker, topic, group, results, tmp_path / f"r{i}.log", **env) for i in range(3)]
    for replica in replicas:
        replica.ready()
    ids = [f"t{i}" for i in range(30)]
    for k in (1, 2):
        for cid in ids:
            respond(f"win {cid} q{k}", session_id=cid)  # one trace per turn
    wait_for(lambda: sum(r.metric("tracejudge_span_events_total", route="repartition") for r in replicas) > 0, 60)
    replicas[1].stop("term")
    replicas[1] = Replica(broker, topic, group, results, tmp_path / "r1b.log", **env)
    wait_for(lambda: "consuming 'win-" in replicas[1].log.read_text(), 90, "the new replica joining")
    for cid in ids:
        respond(f"win {cid} q3", session_id=cid)
        end_conversation(cid, agent="support", tracer_provider=provider)
    try:
        wait_for(lambda: set(calls_by_conversation(judge_server)) >= set(ids), 120, "every conversation judged")
    except AssertionError as timed_out:  # say where the missing ones are: completed? open? on which replica?
        state = [
            {
                name: r.metric(name)
                for name in ("tracejudge_conversations_completed_total", "tracejudge_state_conversations")
            }
            for r in replicas
        ]
        missing = sorted(set(ids) - set(calls_by_conversation(judge_server)))
        raise AssertionError(f"{timed_out}: never judged {missing}; per replica {state}") from None
    settle(judge_server)
    routed = {
        route: sum(r.metric("tracejudge_span_events_total", route=route) for r in replicas)
        for route in ("local", "repartition")
    }
    for replica in replicas:
        replica.stop("term")
    calls = calls_by_conversation(judge_server)
    assert all(calls[cid] == [[1, 2, 3]] for cid in ids), {c: v for c, v in calls.items() if v != [[1, 2, 3]]}
    by_conversation = results_by_conversation(broker, results)
    assert all(len({r["result_id"] for r in by_conversation[cid]}) == 1 for cid in ids)
    print(f"\ntrace-keyed: {len(ids)} conversations whole through 3 replicas and a restart; routed {routed}")
    provider.shutdown()


def test_slow_judge_full_backlog_and_the_open_bound(
    broker: EmbeddedBroker, judge_server: JudgeServer, tmp_path: Path
) -> None:
    """600 complete conversations wait in Kafka; the judge is slow and --max-open-conversations is 50: each is judged
    once, whole (no idle clock runs while it waits), and the wait shows as judge-queue lag, not memory."""

    def slow(request: dict[str, Any]) -> Reply:
        reply = scripted_judge(request)
        reply.delay_s = 0.05
        return reply

    judge_server.responder = slow
    topic, results, group = _setup(broker)
    turns = Turns(broker.bootstrap_servers, topic)
    ids = [f"s{i}" for i in range(600)]
    for cid in ids:
        turns.turn(cid, 1, indexed=False)
        turns.turn(cid, 2, indexed=False)
        turns.end(cid)
    turns.flush()
    replica = Replica(
        broker,
        topic,
        group,
        results,
        tmp_path / "slow.log",
        TRACEJUDGE_MAX_OPEN_CONVERSATIONS="50",
        TRACEJUDGE_MAX_CONCURRENCY="4",
        TRACEJUDGE_SESSION_IDLE_TIMEOUT="2",
    )
    replica.ready()
    lags: list[float] = []

    def progressed() -> bool:
        lags.append(replica.metric("tracejudge_judge_queue_lag"))
        return len(calls_by_conversation(judge_server)) >= len(ids)

    wait_for(progressed, 240, "every conversation judged")
    settle(judge_server, 3.0)
    wait_for(lambda: replica.metric("tracejudge_judge_queue_lag") == 0, 30, "the judge queue drained")
    replica.stop("term")
    calls = calls_by_conversation(judge_server)
    assert all(calls[cid] == [[1, 2]] for cid in ids), {c: v for c, v in list(calls.items()) if v != [[1, 2]]}
    assert max(lags) > 50, max(lags)  # the backlog waited in Kafka, reported while the judge worker was paused
    print(f"\nslow judge: {len(ids)} judged once and whole; judge-queue lag peaked at {max(lags):.0f}")
    turns.provider.shutdown()


def test_kill_9_with_the_otlp_endpoint_down_loses_no_evaluation(
    broker: EmbeddedBroker, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = scripted_judge
    topic, results, group = _setup(broker)
    ids = [f"o{i}" for i in range(5)]
    with OtlpReceiver() as receiver:
        receiver.status = 503
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        first = Replica(broker, topic, group, results, tmp_path / "otlp-a.log", **env)
        first.ready()
        turns = Turns(broker.bootstrap_servers, topic)
        for cid in ids:
            turns.turn(cid, 1, indexed=False)
            turns.end(cid)
        turns.flush()
        wait_for(lambda: set(calls_by_conversation(judge_server)) >= set(ids), 60, "all five judged")
        wait_for(lambda: first.metric("tracejudge_output_errors_total", output="otlp") >= 2, 60, "failed exports")
        first.stop("kill")
        assert not receiver.spans
        receiver.status = 200
        second = Replica(broker, topic, group, results, tmp_path / "otlp-b.log", **env)
        wait_for(
            lambda: {attributes(s).get("gen_ai.conversation.id") for s in receiver.spans} >= set(ids),
            90,
            "every evaluation span delivered after the restart",
        )
        second.stop("term")
    delivered = {attributes(s)["gen_ai.conversation.id"] for s in receiver.spans}
    assert delivered == set(ids)
    turns.provider.shutdown()


def test_three_replicas_share_one_budget(broker: EmbeddedBroker, judge_server: JudgeServer, tmp_path: Path) -> None:
    """A budget worth 6 calls for the whole group: three replicas together stay within it (each owns its share of the
    judge queue's partitions), where three separate budgets made 18."""
    judge_server.responder = lambda request: Reply(
        content=json.dumps({"verdict": "honest_fallback", "evidence": [], "reason": "fixed"}), prompt_tokens=2000
    )
    topic, results, group = _setup(broker, partitions=6)
    per_call = 2000 * 1.5e-07  # LiteLLM's gpt-4o-mini input price: what one fixed-usage call costs
    budget = 6 * per_call + per_call / 2
    env = {"TRACEJUDGE_MAX_COST_PER_HOUR": repr(budget), "TRACEJUDGE_MAX_CONCURRENCY": "1"}
    replicas = [Replica(broker, topic, group, results, tmp_path / f"b{i}.log", **env) for i in range(3)]
    for replica in replicas:
        replica.ready()
    wait_for(
        lambda: all(replica.metric("tracejudge_judge_queue_lag") is not None for replica in replicas), 30, "joined"
    )
    turns = Turns(broker.bootstrap_servers, topic)
    ids = [f"b{i}" for i in range(60)]
    for cid in ids:
        turns.turn(cid, 1, indexed=False)
        turns.end(cid)
    turns.flush()
    wait_for(lambda: sum(r.metric("tracejudge_sessions_total") for r in replicas) >= len(ids), 120, "every outcome out")
    calls = len(judge_server.requests)
    skipped = sum(r.metric("tracejudge_sessions_total", outcome="skipped_budget") for r in replicas)
    for replica in replicas:
        replica.stop("term")
    # Each replica's first call is admitted before any cost is known (as with one replica): at most one over each.
    assert 1 <= calls <= 6 + len(replicas), calls
    assert skipped == len(ids) - calls
    turns.provider.shutdown()


def test_a_replica_stopped_while_another_joins_leaves_the_group_working(
    broker: EmbeddedBroker, judge_server: JudgeServer, tmp_path: Path
) -> None:
    """SIGTERM to the group's leader while a new replica's join holds the group forming. Its LeaveGroup (Tansu
    removes the member, not its leadership) leaves the group without a leader: without `membership`'s guard the new
    replica never got a partition. With it, the new replica rejoins under the departed leader's id, takes every
    partition and judges what arrives."""
    judge_server.responder = scripted_judge
    topic, results, group = _setup(broker)
    first = Replica(broker, topic, group, results, tmp_path / "first.log")
    first.ready()
    second = Replica(broker, topic, group, results, tmp_path / "second.log")
    wait_for(lambda: "consuming 'win-" in second.log.read_text(), 90, "the second replica joining")
    first.stop("term")
    second.ready()
    turns = Turns(broker.bootstrap_servers, topic)
    ids = [f"j{i}" for i in range(12)]
    for cid in ids:
        turns.turn(cid, 1, indexed=False)
        turns.end(cid)
    turns.flush()
    wait_for(lambda: set(calls_by_conversation(judge_server)) >= set(ids), 90, "every conversation judged")
    assert "partitions assigned: [0, 1, 2]" in second.log.read_text()
    second.stop("term")
