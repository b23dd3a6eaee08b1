"""Retries at their own times (issue 43): the backoff ladder and its step topics (consumer/judging/retries.py), and the
retry scheduler reading them (consumer/streams/retry_scheduler.py): each wait goes to the step topic whose records all
wait alike, so a topic's records ripen in the order they were written, and none is held behind another's longer
backoff; a wait that is no step's own (the last, cut at the horizon) moves down the steps and ends held in memory.
Kafka-free (the fake clients of test_judge_worker_duplicates)."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from tests.consumer.test_judge_worker_duplicates import Judges, Record, job_record
from tracejudge.consumer.judging import retries
from tracejudge.consumer.judging.judgement import Retry
from tracejudge.consumer.judging.retries import (
    FORWARD,
    HOLD,
    Placement,
    RetryPolicy,
    on_ripe,
    place,
    retry_to_json,
    step_delays,
)
from tracejudge.consumer.kafka import TopicPartition, topics
from tracejudge.consumer.streams import records as R
from tracejudge.consumer.streams import retry_scheduler

NOW = 1_800_000_000.0


def test_the_ladder_doubles_the_backoff_to_ten_minutes_and_the_registry_counts_its_steps_alike() -> None:
    assert step_delays(30) == (30, 60, 120, 240, 480, 600)
    assert step_delays(1) == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600)
    assert step_delays(300) == (300, 600) and step_delays(900) == (900,)
    assert retries.MAX_BACKOFF_S == topics._LONGEST_RETRY_WAIT_S and retries.MAX_RETRY_STEPS == topics.RETRY_STEPS
    for backoff in (1, 1.5, 2, 5, 9.4, 18.75, 30, 37.5, 100, 599, 600, 601, 3600):
        assert len(step_delays(backoff)) == topics.retry_step_count(backoff), backoff
    policy = RetryPolicy(horizon_s=86_400, backoff_s=30)
    assert [policy.wait(attempt) for attempt in range(1, 9)] == [30, 60, 120, 240, 480, 600, 600, 600]


def test_a_backoffs_wait_goes_to_its_own_step_ripe_when_due() -> None:
    steps = step_delays(30)
    assert place(NOW + 30, NOW, steps, exact=True) == Placement(1, NOW + 30)
    # decided a moment before it is written: still its own step, still ripe when due
    assert place(NOW + 120, NOW + 0.3, steps, exact=True) == Placement(3, NOW + 120)
    assert place(NOW + 600, NOW, steps, exact=True) == Placement(6, NOW + 600)


def test_a_wait_cut_at_the_horizon_goes_to_the_longest_step_under_it_and_moves_down() -> None:
    steps = step_delays(30)
    due = NOW + 200  # the horizon: 200 s away, no step's own wait
    first = place(due, NOW, steps, exact=False)
    assert first == Placement(3, NOW + 120)  # 120 s: the longest step under 200 s; never ripe after it is due
    assert on_ripe(due, first.ripe_at, steps) == Placement(2, NOW + 180)  # 80 s left: 60 s more
    assert on_ripe(due, NOW + 180, steps) == HOLD  # 20 s left, under the first step: held in memory
    assert on_ripe(due, due, steps) == FORWARD
    assert place(NOW + 10, NOW, steps, exact=False) == Placement(0, NOW)  # shorter than a step: read at once


def test_within_a_step_topic_records_ripen_in_write_order_and_none_waits_for_another() -> None:
    """Many judgements failing at random times with random attempts and horizons, written as the policy decides
    them. Each topic lets out its records in write order, a paused partition waiting for its first one (as the
    scheduler): every record still leaves its topic at its own ripe time, and ends forwarded exactly when due."""
    rng = random.Random(43)
    steps = step_delays(5)
    policy = RetryPolicy(horizon_s=900, backoff_s=5)
    topics_: dict[int, list[tuple[float, float]]] = {}  # step → (ripe, due) in write order
    now = NOW
    for _ in range(2000):
        now += rng.uniform(0, 3)
        attempt = rng.randint(1, 9)
        first_failed = now - rng.uniform(0, 900)
        retry = Retry(attempt - 1, "server_error", first_failed, first_failed + 900) if attempt > 1 else None
        judgement = policy.review(_failed(retry), now=now)
        if judgement.retry is None or judgement.retry.next_at is None:
            continue  # past the horizon
        due = judgement.retry.next_at
        where = place(due, now + rng.uniform(0, 0.2), steps, exact=due < judgement.retry.until)
        assert where.ripe_at <= due
        topics_.setdefault(where.step, []).append((where.ripe_at, due))
    assert set(topics_) >= {0, 1, 2, 3, 4, 5, 6, 7, 8}
    for step, written in topics_.items():
        let_out = 0.0
        for ripe, due in written:
            let_out = max(let_out, ripe)  # a FIFO paused on its first record not yet ripe
            assert let_out <= ripe + 0.2, (step, ripe, let_out)  # never held behind another (but the write moments)
            at, action = ripe, on_ripe(due, ripe, steps)
            while isinstance(action, Placement):  # it moves down the steps, each ripe no later than due
                assert action.step < step or (step == 0 and action.ripe_at <= due)
                at, action = action.ripe_at, on_ripe(due, action.ripe_at, steps)
            assert action in (FORWARD, HOLD) and (action == FORWARD or due - at < steps[0])


def _failed(retry: Retry | None) -> Any:
    from tests.consumer.test_retry_policy import failed

    judgement = failed("server_error")
    judgement.retry = retry
    return judgement


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


def _record(offset: int, due: float, ripe: float | None) -> Record:
    value = R.job_to_json(
        R.job_record(job_record(offset, f"c{offset}").value, key="", partition=0)[0], sampled=True, completed_ms=1
    )
    value["retry"] = retry_to_json(Retry(1, "server_error", due - 100, due + 3600, next_at=due))
    if ripe is not None:
        value["ripe_ms"] = int(ripe * 1000)
    return Record(offset, R.dumps(value))


def test_a_long_backoff_holds_back_no_record_of_another_step_and_the_last_stretch_is_held_in_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The issue's case: a record waiting 10 minutes (step 6) and records waiting 30 s and 60 s (steps 1, 2): each is
    forwarded when due, the 10-minute one's partition paused on it meanwhile. One cut at the horizon, let out of its
    step 20 s before due, is held in memory (its offset uncommitted until forwarded) and forwarded when due."""
    clock = Clock()
    monkeypatch.setattr(retry_scheduler, "time", clock)
    judges = Judges()
    worker, consumer = judges.worker, judges.retry_consumer
    t0 = clock.now
    step = {n: TopicPartition(worker.topics.judge_retry_step(n), 0) for n in (1, 2, 6)}
    log = {
        step[6]: [_record(0, t0 + 600, t0 + 600)],
        step[1]: [_record(0, t0 + 30, t0 + 30), _record(1, t0 + 50, t0 + 30)],  # the second: cut at the horizon
        step[2]: [_record(0, t0 + 60, t0 + 60)],
    }
    consumer.batches.append(dict(log))
    worker.step()
    assert consumer.paused() == set(step.values()) and judges.producer.topics() == []
    forwarded: list[float] = []
    held_at_40 = None
    while clock.now < t0 + 70:
        clock.now += 0.05
        before = len(judges.producer.sent)
        worker.step()
        forwarded += [clock.now for topic, _, _ in judges.producer.sent[before:] if topic == worker.topics.judge_queue]
        for tp in [tp for tp in consumer.seeks if tp not in consumer.paused()]:  # resumed: read from where it paused
            consumer.batches.append({tp: log[tp][consumer.seeks.pop(tp) :]})
        if held_at_40 is None and clock.now >= t0 + 40:
            worker.commit()
            held_at_40 = consumer.committed.get(step[1])
    assert len(forwarded) == 3, forwarded  # 30 s, 50 s (held in memory from 30 s), 60 s: none waits for 600 s
    assert forwarded[0] == pytest.approx(t0 + 30, abs=0.15)
    assert forwarded[1] == pytest.approx(t0 + 50, abs=0.15)
    assert forwarded[2] == pytest.approx(t0 + 60, abs=0.15)
    assert held_at_40 == 1  # the held record's offset: not committed before its forward
    assert step[6] in consumer.paused()  # still waiting for its own time
    worker.commit()
    assert consumer.committed.get(step[1]) == 2 and consumer.committed.get(step[2]) == 1
    assert step[6] not in consumer.committed
