"""The broker stops for 30 s while an application traces: no exception and no stall in the application, bounded
memory, drops counted; the consumer reconnects and continues without a restart."""

from __future__ import annotations

import threading
import time

import pytest

from tests.consumer.test_pipeline import Collect, scripted_judge
from tests.support.judge_server import JudgeServer
from tests.support.pipeline import RunningConsumer, consumer_settings, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.tracer import end_conversation, setup_tracing, traced_agent
from tracejudge.tracer._batch import BoundedBatchSpanProcessor
from tracejudge.tracer.setup import exporter_stats

# a 30 s outage the application must not stall through: runs alone (tests/run_suite.py's serial phase)
pytestmark = pytest.mark.serial

OUTAGE_S = 30.0
QUEUE = 512


def test_broker_outage(judge_server: JudgeServer) -> None:
    judge_server.responder = scripted_judge
    broker = EmbeddedBroker().start()
    topic = "outage_spans"
    broker.create_topic(topic, 1)
    provider = setup_tracing(
        "outage-app",
        kafka_bootstrap_servers=broker.bootstrap_servers,
        topic=topic,
        set_global=False,
        schedule_delay_millis=100,
        max_queue_size=QUEUE,
    )
    stats = exporter_stats(provider)
    assert stats is not None

    @traced_agent("outage-bot", tracer_provider=provider)
    def answer(question: str, session_id: str) -> str:
        return f"answer to {question}"

    phase = {"name": "before"}
    worst: dict[str, float] = {"before": 0.0, "outage": 0.0, "after": 0.0}
    errors: list[BaseException] = []
    queue_peak = [0]
    stop = threading.Event()
    processor = next(
        p for p in provider._active_span_processor._span_processors if isinstance(p, BoundedBatchSpanProcessor)
    )

    def application() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            started = time.perf_counter()
            try:
                answer(f"q{n}", session_id=f"{phase['name']}-{n // 3}")
                if n % 3 == 2:
                    end_conversation(f"{phase['name']}-{n // 3}", tracer_provider=provider)
            except BaseException as exc:  # the application must never see one
                errors.append(exc)
            worst[phase["name"]] = max(worst[phase["name"]], time.perf_counter() - started)
            queue_peak[0] = max(queue_peak[0], processor.queued)
            time.sleep(0.002)

    collect = Collect()
    # The embedded broker restarts empty (a real cluster keeps its topics): no results topic to lose meanwhile.
    settings = consumer_settings(
        broker.bootstrap_servers, topic, metrics="failure_rate", max_concurrency=16, no_results=True
    )
    app_thread = threading.Thread(target=application, daemon=True)
    try:
        with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
            app_thread.start()
            wait_for(lambda: consumer.sessions("judged") >= 5, timeout=60, what="judging before the outage")
            phase["name"] = "outage"
            broker.stop()
            time.sleep(OUTAGE_S)
            dropped_during = stats.spans_dropped
            broker.start()
            broker.create_topic(topic, 1)  # Tansu keeps topics in memory: a restarted broker starts empty
            phase["name"] = "after"
            wait_for(
                lambda: any(j.job.conversation_id.startswith("after-") for j in list(collect.judgements)),
                timeout=90,
                what="the same consumer judging again after the broker came back",
            )
    finally:
        stop.set()
        app_thread.join(10)
        broker.stop()
    assert not errors
    assert max(worst.values()) < 1.0, worst  # no stall: nothing in the caller's thread waits on the network
    assert queue_peak[0] <= QUEUE  # bounded memory
    assert dropped_during > 0 and stats.queue_full_drops + stats.export_failures > 0
    print(
        f"\noutage: worst call {max(worst.values()) * 1e3:.1f} ms by phase "
        f"{ {k: round(v * 1e3, 1) for k, v in worst.items()} }, spans dropped {stats.spans_dropped} "
        f"(queue full {stats.queue_full_drops}), queue peak {queue_peak[0]}/{QUEUE}"
    )
    provider.shutdown()
