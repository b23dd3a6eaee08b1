"""A result that never reached Kafka is never committed past; the writer retries, counts, and closes on time.

Windows for a result record (the offsets state machine's output side), each tested:
- written at once: acknowledged, the event set, the hold released (every pipeline test);
- the send fails and keeps failing (a record over the producer's max_request_size): counted in
  `tracejudge_output_errors_total{output="results_topic"}`, retried with backoff, the hold kept; the consumer stops
  and a restart judges the conversation again and writes its result (it stayed uncommitted); the stop itself ends
  within `--shutdown-grace` (the drain does not wait for a write that keeps failing);
- the send fails while the broker is down, then succeeds after it is back (the retry delivers);
- the writer closes with a full queue and a send stuck on a stopped broker: close returns within its timeout.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer, Reply
from tests.support.pipeline import (
    KAFKA_SESSION,
    RunningConsumer,
    consumer_settings,
    play,
    result_records,
    traced_app,
    wait_for,
)
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit._kafka_writer import KafkaWriter


def wordy_judge(request: dict) -> Reply:
    """The scripted verdict with the longest reason and evidence a judge may give (4,000 characters each)."""
    reply = scripted_judge(request)
    body = json.loads(reply.content or "{}")
    body["reason"] = "r" * 4_000
    body["evidence" if "evidence" in body else "key_issues"] = ["e" * 4_000] * 3
    reply.content = json.dumps(body)
    return reply


# timing-sensitive: asserts how long it took, so it runs alone (tests/run_suite.py's serial phase)
@pytest.mark.serial
def test_a_failed_result_write_keeps_its_offset_across_a_restart(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    judge_server.responder = wordy_judge
    results = f"{topic}-results"
    broker.create_topic(results, 1)
    provider = traced_app(broker.bootstrap_servers, topic)
    play(provider, {f"unwritten-{i}": [(f"unwritten q{i}", "a")] for i in range(2)})
    provider.shutdown()
    group = f"out-{uuid.uuid4().hex[:6]}"
    common = {"group_id": group, "metrics": "failure_rate", "results_topic": results}
    # Every result record (a wordy verdict: about 16 KB) is over the producers' limit: each send fails, nothing
    # reaches the results topic; the internal topics' records (about 1 KB: one short turn) pass.
    failing = consumer_settings(
        broker.bootstrap_servers,
        topic,
        **common,
        kafka_config={**KAFKA_SESSION, "max_request_size": 8192},
        shutdown_grace=2.0,
    )
    with RunningConsumer(failing) as first:
        wait_for(lambda: first.sessions("judged") == 2, what="both judged")
        wait_for(
            lambda: first.value("tracejudge_output_errors_total", output="results_topic") >= 4,
            what="each failed write retried",
        )
        worker = first.app.service.judge_worker
        assert worker is not None
        held = worker.offsets.held()
        errors = first.value("tracejudge_output_errors_total", output="results_topic")
        assert held == 2  # both judge-queue jobs still hold their offsets
        # SIGTERM's drain does not wait for results that can never be written: it ends within the grace period.
        stopping = time.monotonic()
        first.stop()
        stop_took = time.monotonic() - stopping
        assert stop_took < failing.shutdown_grace + 3.0, f"stopping took {stop_took:.1f} s"
    calls_first = len(judge_server.requests)
    # A restart with a working producer: the conversations were not committed past, so they are judged again.
    with RunningConsumer(consumer_settings(broker.bootstrap_servers, topic, **common)) as second:
        wait_for(lambda: second.sessions("judged") == 2, what="both judged again after the restart")
        written = result_records(broker, results, 2)
        assert second.value("tracejudge_output_errors_total", output="results_topic") == 0
    assert sorted(r["conversation_id"] for r in written) == ["unwritten-0", "unwritten-1"]
    assert calls_first == 2 and len(judge_server.requests) == 4
    print(
        f"\nresults-topic failure: {errors:.0f} failed writes, {held} holds kept, stopped in {stop_took:.1f} s; "
        f"after a restart 2 conversations judged again and 2 results written"
    )


def test_the_writer_retries_until_the_broker_is_back() -> None:
    outage = EmbeddedBroker().start()
    errors: list[int] = []
    try:
        outage.create_topic("results", 1)
        writer = KafkaWriter(
            outage.bootstrap_servers,
            "results",
            durable=True,
            on_error=lambda: errors.append(1),
            base_backoff_s=0.2,
            request_timeout_ms=1000,
            delivery_timeout_ms=2000,
            max_block_ms=2000,
            enable_idempotence=False,  # a restarted Tansu has no producer state to resume
        ).start()
        assert writer.write(b"k", b"before").wait(15)
        outage.stop()
        during = writer.write(b"k", b"during the outage")
        wait_for(lambda: len(errors) >= 1, timeout=20, what="the failed send counted")
        assert not during.is_set()
        outage.start()
        assert during.wait(30), "the retry after the broker came back did not deliver"
        writer.close(5)
        assert writer.sent == 2 and writer.failed == len(errors) >= 1 and writer.dropped == 0
    finally:
        outage.stop()
    print(f"\nwriter outage: {len(errors)} failed sends counted and retried, then delivered")


# timing-sensitive: asserts how long it took, so it runs alone (tests/run_suite.py's serial phase)
@pytest.mark.serial
def test_close_never_blocks_on_a_full_queue_and_counts_exactly() -> None:
    stopped = EmbeddedBroker().start()
    try:
        writer = KafkaWriter(stopped.bootstrap_servers, "never-seen", max_queue=5, max_block_ms=5000).start()
        stopped.stop()  # the topic's metadata can never come: each send blocks for max_block_ms
        threads = [threading.Thread(target=lambda: [writer.write(None, b"x") for _ in range(500)]) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        started = time.monotonic()
        writer.close(timeout_s=1.0)
        took = time.monotonic() - started
    finally:
        stopped.stop()
    assert took < 2.5, f"close took {took:.1f} s"
    # 4,000 writes from 8 threads: each is counted once (at most one still inside the stuck send).
    assert 4_000 - 1 <= writer.dropped + writer.sent <= 4_000
    print(f"\nwriter close: {took:.2f} s with a full queue and a stuck send; {writer.dropped} of 4000 counted dropped")
