"""kill -9 the consumer five times while 2,000 conversations flow: every conversation is judged at least once,
duplicates stay within what was uncommitted at each kill, and duplicates carry the same deterministic result id."""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
import uuid
from collections import defaultdict
from importlib.util import find_spec
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from tests.consumer.test_pipeline import scripted_judge
from tests.support.judge_server import JudgeServer, conversation_text
from tests.support.pipeline import consumer_process, play, read_all, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker

# kill -9 at moments drawn while 2,000 conversations flow: runs alone (tests/run_suite.py's serial phase)
pytestmark = pytest.mark.serial

CONVERSATIONS = 2_000
KILLS = 5


def committed_offsets(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        return {p: consumer.committed(TopicPartition(topic, p)) or 0 for p in partitions}
    finally:
        consumer.close()


def ends(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's end offset, from what a fetch returns (Tansu answers ListOffsets wrongly)."""
    last: dict[int, int] = {}
    for record in read_all(bootstrap, topic):
        last[record.partition] = max(last.get(record.partition, 0), record.offset + 1)
    return last


def at_ends(committed: dict[int, int], end: dict[int, int]) -> bool:
    return bool(committed) and all(offset == end.get(p, 0) for p, offset in committed.items())


# The stream thread's writes (changelog, judge queue) through either producer library (--producer-client).
@pytest.mark.parametrize(
    "producer_client",
    [
        "kafka-python",
        pytest.param(
            "librdkafka",
            marks=pytest.mark.skipif(find_spec("confluent_kafka") is None, reason="the librdkafka extra is missing"),
        ),
    ],
)
def test_five_kill_9s_lose_nothing(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, producer_client: str, tmp_path: Path
) -> None:
    log = tmp_path / "consumer.log"
    judge_server.responder = scripted_judge
    results, group = f"{topic}-results", f"crash-{uuid.uuid4().hex[:6]}"
    queue, judges = f"{group}-judge-queue", f"{group}-judges"  # the judge worker's topic and group
    broker.create_topic(results, 1)
    provider = traced_app(broker.bootstrap_servers, topic)
    ids = [f"crash-{i}" for i in range(CONVERSATIONS)]

    def judged() -> set[str]:
        texts = [conversation_text(r) for r in list(judge_server.requests)]
        return {text.split("crash ", 1)[1].split(" ", 1)[0] for text in texts if "crash " in text}

    def produce() -> None:
        for start in range(0, CONVERSATIONS, 100):
            play(
                provider,
                {cid: [(f"crash {cid.split('-')[1]} q", "a"), ("and?", "b")] for cid in ids[start : start + 100]},
            )
            time.sleep(0.2)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    rng = random.Random(20261130)
    thresholds = sorted(rng.sample(range(100, CONVERSATIONS - 200), KILLS))
    kills: list[tuple[float, dict[int, int], dict[int, int]]] = []

    def start() -> subprocess.Popen:
        return consumer_process(
            broker,
            topic,
            group,
            results,
            TRACEJUDGE_MAX_CONCURRENCY="16",
            TRACEJUDGE_PRODUCER_CLIENT=producer_client,
            log=log,
        )

    process = start()
    try:
        for threshold in thresholds:
            wait_for(lambda t=threshold: len(judged()) >= t, timeout=180, what=f"{threshold} conversations judged")
            time.sleep(rng.uniform(0, 0.5))
            process.kill()
            process.wait(10)
            kills.append(
                (
                    time.time(),
                    committed_offsets(broker.bootstrap_servers, topic, group),
                    committed_offsets(broker.bootstrap_servers, queue, judges),
                )
            )
            process = start()
        producer.join(120)
        wait_for(lambda: len(judged()) == CONVERSATIONS, timeout=300, what="every conversation judged")
        # Conversations judged before a kill whose results were not yet durable are judged again. Barrier: every
        # input record committed (its state and jobs durable), then every judge-queue job committed (its results
        # delivered): nothing is left to judge again.
        input_ends = ends(broker.bootstrap_servers, topic)
        wait_for(
            lambda: at_ends(committed_offsets(broker.bootstrap_servers, topic, group), input_ends),
            timeout=180,
            what="every input record committed",
        )
        queue_ends = ends(broker.bootstrap_servers, queue)
        wait_for(
            lambda: at_ends(committed_offsets(broker.bootstrap_servers, queue, judges), queue_ends),
            timeout=180,
            what="every judge-queue job committed",
        )
    finally:
        process.terminate()
        process.wait(60)
    # each of the six processes wrote its internal topics with the library asked for
    written_by_librdkafka = log.read_text().count("the internal topics are written by librdkafka")
    assert written_by_librdkafka == (KILLS + 1 if producer_client == "librdkafka" else 0)
    records = [json.loads(r.value) for r in read_all(broker.bootstrap_servers, results)]
    by_conversation: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_conversation[record["conversation_id"]].append(record)
    assert set(by_conversation) == set(ids)  # every conversation judged at least once
    for cid, copies in by_conversation.items():
        assert len({r["result_id"] for r in copies}) == 1, cid  # duplicates share the deterministic id
    duplicates = sum(len(copies) - 1 for copies in by_conversation.values())
    # What may be judged again after a kill: conversations with a record at or after the committed offset then.
    spans = read_all(broker.bootstrap_servers, topic)
    positions: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for record in spans:
        positions[record.key.decode()].append((record.partition, record.offset, record.timestamp))
    jobs: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for record in read_all(broker.bootstrap_servers, queue):
        jobs[record.key.decode()].append((record.partition, record.offset))
    first_judged: dict[str, float] = {}
    for body, at in zip(list(judge_server.requests), list(judge_server.request_times), strict=True):
        text = conversation_text(body)
        if "crash " in text:
            first_judged.setdefault("crash-" + text.split("crash ", 1)[1].split(" ", 1)[0], at)
    # Judged before a kill, but with a span record at or after the input offset committed then (replayed into the
    # state as of that commit) or a job at or after the judge-queue offset committed then (read again).
    exposed = 0
    for killed_at, committed, committed_jobs in kills:
        exposed += sum(
            1
            for cid, places in positions.items()
            if first_judged.get(cid, float("inf")) <= killed_at
            and (
                any(offset >= committed.get(p, 0) for p, offset, _stamp in places)
                or any(offset >= committed_jobs.get(p, 0) for p, offset in jobs.get(cid, ()))
            )
        )
    assert duplicates <= exposed
    print(
        f"\ncrash: {KILLS} kills, {CONVERSATIONS} conversations, {duplicates} duplicate results, "
        f"bound (judged but not yet committed at the kills) {exposed}"
    )
    provider.shutdown()
