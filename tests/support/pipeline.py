"""Helpers to run the real pipeline in tests: a traced app producing to Tansu, and the consumer in a thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from tracejudge.consumer.app import App, build_app
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit.prometheus import family_total
from tracejudge.consumer.settings import Settings
from tracejudge.tracer import end_conversation, setup_tracing, traced_agent

ROOT = Path(__file__).resolve().parents[2]
# The group session the tests' consumers use where the group join is not what a test tests. The embedded broker holds a
# forming group's JoinGroup for about half the session timeout (never under ~1 s): 2 s sessions join in ~1.1 s, the
# 6 s that tests used before took ~3.1 s a join, twice per consumer (input and judge queue). Heartbeats every 0.5 s
# keep a member alive through 1.5 s of a busy machine.
SESSION_MS, HEARTBEAT_MS = 2000, 500
KAFKA_SESSION = {"session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": HEARTBEAT_MS}


def consumer_settings(bootstrap: str, topic: str, **overrides: Any) -> Settings:
    options: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "topic": topic,
        "group_id": f"tj-{uuid.uuid4().hex[:8]}",
        "start_from": "earliest",
        "judge_model": "gpt-4o-mini",
        "session_idle_timeout": 30.0,
        "metrics_host": "127.0.0.1",
        "metrics_port": 0,
        "judge_timeout": 10.0,
        "commit_interval": 0.5,
        "kafka_config": dict(KAFKA_SESSION),
        "shutdown_grace": 10.0,
        # A failure that can pass fails at once here, as before the durable retries (issue 33), so these tests see
        # the outcome they count; tests/reliability/test_judge_retries.py proves the retries with real processes.
        "judge_retry_horizon": 0.0,
    }
    options.update(overrides)
    return Settings.from_options(**options)


class RunningConsumer:
    """build_app + a thread; `stop()` asks it to drain and waits."""

    def __init__(self, settings: Settings, **app_kwargs: Any) -> None:
        self.app: App = build_app(settings, registry=CollectorRegistry(), **app_kwargs)
        for judge in self.app.service.pool.judges:
            judge.retry_policy.base_delay_s = 0.01
        self.thread = threading.Thread(target=self.app.run, name="consumer-under-test", daemon=True)

    def __enter__(self) -> RunningConsumer:
        self.thread.start()
        assert self.app.service.ready.wait(30), "consumer did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout: float = 60) -> None:
        self.app.service.request_stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "consumer did not stop"

    def value(self, name: str, **labels: str) -> float:
        return self.app.registry.get_sample_value(name, labels) or 0.0

    def sessions(self, outcome: str | None = None) -> float:
        labels = {} if outcome is None else {"outcome": outcome}
        return family_total(self.app.registry, "tracejudge_sessions", **labels)


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# Every traced app a test made, shut down after the test by conftest's `_traced_apps_shut_down` (a provider's batch
# processor and Kafka exporter each hold a thread until then).
TRACED_APPS: list[TracerProvider] = []


def traced_app(bootstrap: str, topic: str) -> TracerProvider:
    provider = setup_tracing(
        "test-app", kafka_bootstrap_servers=bootstrap, topic=topic, set_global=False, schedule_delay_millis=50
    )
    TRACED_APPS.append(provider)
    return provider


def play(
    provider: TracerProvider,
    conversations: dict[str, list[tuple[str, str]]],
    *,
    agent: str = "support",
    end: bool = True,
) -> None:
    """Play scripted conversations through @traced_agent: {conversation id: [(question, answer), ...]}."""
    answers: dict[str, str] = {}

    @traced_agent(agent, tracer_provider=provider)
    def respond(question: str, session_id: str) -> str:
        return answers[question]

    for conversation_id, turns in conversations.items():
        for question, answer in turns:
            answers[question] = answer
            respond(question, session_id=conversation_id)
        if end:
            end_conversation(conversation_id, agent=agent, tracer_provider=provider)
    provider.force_flush()


def scrape_logged(log: Path) -> str | None:
    """The /metrics text of the `tracejudge consume` process writing `log` (its address is in a log line): None until
    it says where, or while it does not answer."""
    import re
    import urllib.request

    found = re.search(r"metrics at (http://\S+/metrics)", log.read_text())
    if found is None:
        return None
    try:
        with urllib.request.urlopen(found.group(1), timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return None


def consumer_process(
    broker: EmbeddedBroker, topic: str, group: str, results: str, *, log: Path | None = None, **env: str
) -> subprocess.Popen:
    """A real `tracejudge consume` process; its output goes to `log` (appended) or a pipe the caller reads."""
    environment = {
        **os.environ,
        "TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "TRACEJUDGE_TOPIC": topic,
        "TRACEJUDGE_GROUP_ID": group,
        "TRACEJUDGE_START_FROM": "earliest",
        "TRACEJUDGE_RESULTS_TOPIC": results,
        "TRACEJUDGE_METRICS": "failure_rate",
        "TRACEJUDGE_METRICS_HOST": "127.0.0.1",
        "TRACEJUDGE_METRICS_PORT": "0",
        "TRACEJUDGE_COMMIT_INTERVAL": "0.3",
        "TRACEJUDGE_JUDGE_TIMEOUT": "20",
        # 6 s, not SESSION_MS: several replicas of these processes (each importing LiteLLM) share two cores with the
        # other tests; a 2 s session evicted a member mid-test under that load
        "TRACEJUDGE_KAFKA_CONFIG": "session_timeout_ms=6000,heartbeat_interval_ms=1000",
        "PYTHONPATH": str(ROOT),
        **env,
    }
    output: Any = subprocess.PIPE if log is None else log.open("a")
    return subprocess.Popen(
        [sys.executable, "-m", "tracejudge.consumer"],
        env=environment,
        stdout=output,
        stderr=subprocess.STDOUT,
        text=True,
    )


def result_records(broker: EmbeddedBroker, results: str, expected: int, timeout_s: float = 30) -> list[dict]:
    return [json.loads(r.value) for r in read_records(broker.bootstrap_servers, results, expected, timeout_s)]


def read_records(bootstrap: str, topic: str, expected: int, timeout_s: float = 20.0, **config: Any) -> list:
    """The topic's first `expected` records (fewer if the deadline passes first), read from the beginning by manual
    assignment: no group, so no join to wait for; a topic not created yet is looked for again until it is."""
    from kafka import TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **config)
    records: list = []
    deadline = time.monotonic() + timeout_s
    try:
        while not consumer.assignment() and time.monotonic() < deadline:
            partitions = consumer.partitions_for_topic(topic)
            if partitions:
                assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
                consumer.assign(assigned)
                consumer.seek_to_beginning(*assigned)
            else:
                time.sleep(0.1)  # polled: each partitions_for_topic of a missing topic asks the broker again
        while len(records) < expected and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
    finally:
        consumer.close()
    return records


def spans_of(record) -> list:
    request = ExportTraceServiceRequest()
    request.ParseFromString(record.value)
    return [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]


def read_all(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list:
    """Every record of the topic up to the fetch high watermark (manual assignment: no group, no join delay)."""
    from kafka import TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    records: list = []
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=300).values():
                records.extend(batch)
            if all(
                consumer.highwater(tp) is not None and consumer.position(tp) >= consumer.highwater(tp)
                for tp in partitions
            ):
                break
    finally:
        consumer.close()
    return records


def last_outcome(service: Any, conversation_id: str) -> str | None:
    """The outcome the conversation's owner recorded for its latest snapshot (judged, sampled_out, ...), or None
    while it is open or its verdict has not come back (read from the stream thread's table: retried on a race)."""
    for _ in range(3):
        try:
            state = service.conversation(conversation_id)
            if state is None or not state.dispatched:
                return None
            return state.dispatched[state.last_content_id]
        except (RuntimeError, KeyError):  # the stream thread changed the dict while we read it
            continue
    return None


def owns_partitions(consumer: RunningConsumer) -> bool:
    """Both stages of the consumer own partitions: input (assembler) and judge queue (judge worker)."""
    service = consumer.app.service
    assembler, worker = service.assembler, service.judge_worker
    return bool(
        assembler is not None
        and assembler.group is not None
        and assembler.group.assignment()
        and worker is not None
        and worker.consumer is not None
        and worker.consumer.assignment()
    )


def settled(consumers: list[RunningConsumer], conversation_ids: list[str]) -> bool:
    """Nothing open anywhere and every conversation's snapshots have their outcome back at the owner: a conversation
    judged twice or split would show as a second content id (see `snapshots`) or an open remainder."""
    services = [c.app.service for c in consumers]
    if any(service.open_conversations() for service in services):
        return False
    for cid in conversation_ids:
        if last_outcome_any(services, cid) is None:
            return False
    return True


def last_outcome_any(services: list[Any], conversation_id: str) -> str | None:
    for service in services:
        outcome = last_outcome(service, conversation_id)
        if outcome is not None:
            return outcome
    return None


def snapshots(consumers: list[RunningConsumer], conversation_id: str) -> int:
    """How many snapshots (content ids) of the conversation its owner dispatched."""
    for consumer in consumers:
        state = consumer.app.service.conversation(conversation_id)
        if state is not None:
            return len(state.dispatched)
    return 0
