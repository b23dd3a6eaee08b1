"""A replayed judge job (a crash between the job's send and the assembler's commit re-completes the conversation)
is answered with the verdict this worker gave the same transcript: one judge call, every copy's offset committable.

Kafka-free: the worker's record path with a fake pool and producer; the real processes are in
tests/reliability/test_crash.py (whose duplicate bound this keeps)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import CollectorRegistry

from tracejudge.consumer.adapters import Turn
from tracejudge.consumer.conversation.job import JudgeJob
from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.judging.judgement import OUTCOME_FAILED, OUTCOME_JUDGED, Judgement
from tracejudge.consumer.settings import Settings
from tracejudge.consumer.streams import records as R
from tracejudge.consumer.streams.instruments import StreamsInstruments
from tracejudge.consumer.streams.judge_worker import JudgeWorker


class _Future:
    def add_callback(self, fn: Any) -> _Future:
        fn(None)
        return self

    def add_errback(self, fn: Any) -> _Future:
        return self


class Producer:
    def __init__(self) -> None:
        self.acks: list[tuple[str, str]] = []  # (content id, outcome) of every verdict acknowledgement

    def send(self, topic: str, *, value: bytes, **_: Any) -> _Future:
        body = json.loads(value)
        self.acks.append((body["content_id"], body["outcome"]))
        return _Future()


class Pool:
    max_concurrency = 4

    def __init__(self) -> None:
        self.submitted: list[JudgeJob] = []

    def submit(self, job: JudgeJob) -> None:
        self.submitted.append(job)


@dataclass
class Record:
    offset: int
    value: bytes
    headers: Any = None
    key: bytes = b"c"

    def __post_init__(self) -> None:
        self.headers = R.header(R.JOB)


def job_record(offset: int, content_id: str) -> Record:
    job = JudgeJob(
        key="",
        conversation_id="c",
        agent="a",
        partition=0,
        version=1,
        exchanges=(Turn("s0", "t", "", 1, 2, "q", "a", index=0),),
        has_error=False,
        negative_feedback=False,
        truncated=False,
        completed_by="ended",
        content_id=content_id,
    )
    return Record(offset, R.dumps(R.job_to_json(job, sampled=True, completed_ms=1)))


def worker() -> tuple[JudgeWorker, Pool, Producer, StreamsInstruments]:
    registry = CollectorRegistry()
    instruments = StreamsInstruments(registry)
    pool, producer = Pool(), Producer()
    settings = Settings.from_options(topic="spans", group_id="g")
    judges = JudgeWorker(settings, pool, None, ConsumerInstruments(registry), instruments, partitions=1)  # type: ignore[arg-type]
    judges.producer = producer  # type: ignore[assignment]
    return judges, pool, producer, instruments


def test_a_copy_read_while_judging_waits_for_that_verdict_and_a_later_copy_gets_it_at_once() -> None:
    judges, pool, producer, instruments = worker()
    judges._record(0, job_record(5, "x"))
    judges._record(0, job_record(9, "x"))  # the replay's copy, while the first is in flight
    assert [job.key for job in pool.submitted] == ["0:5"]
    judges.offsets.consumed(0, 10)
    assert judges.offsets.committable() == {0: 5}
    judges._finished(Judgement(pool.submitted[0], OUTCOME_JUDGED))
    assert producer.acks == [("x", "judged"), ("x", "judged")]
    assert judges.offsets.committable() == {0: 10}  # both copies released
    judges._record(0, job_record(12, "x"))  # a copy read after the verdict
    judges.offsets.consumed(0, 13)
    assert len(pool.submitted) == 1 and producer.acks[-1] == ("x", "judged")
    assert judges.offsets.committable() == {0: 13}
    assert instruments.duplicate_jobs._value.get() == 2
    judges._record(0, job_record(13, "y"))  # another transcript is judged
    assert [job.content_id for job in pool.submitted] == ["x", "y"]


def test_a_failed_verdict_is_shared_by_its_waiting_copies_but_not_remembered() -> None:
    judges, pool, producer, _ = worker()
    judges._record(0, job_record(1, "x"))
    judges._record(0, job_record(2, "x"))
    judges._finished(Judgement(pool.submitted[0], OUTCOME_FAILED))
    assert producer.acks == [("x", "failed"), ("x", "failed")]
    judges._record(0, job_record(3, "x"))  # a failure is not a verdict: a later copy is judged
    assert [job.key for job in pool.submitted] == ["0:1", "0:3"]


def test_revoked_partitions_forget_the_transcripts_they_were_judging() -> None:
    """A primary cancelled with its partition (batch tier) never finishes: its copies must not wait for it forever
    when the partition comes back; its job is read again and judged."""
    judges, pool, _producer, _ = worker()
    judges._record(0, job_record(4, "x"))
    judges._forget({0})
    judges._record(0, job_record(4, "x"))  # the partition handed back: the job is read again
    assert [job.key for job in pool.submitted] == ["0:4", "0:4"]


def test_a_batch_tier_pool_abandons_a_revoked_partitions_judgements_and_keeps_the_others() -> None:
    """At the batch tier a judgement in flight waits for a batch; the partition's new owner waits for the same batch
    (it reads the batch records): finishing it here too would deliver the verdict twice."""
    import asyncio
    import threading
    import time

    from tracejudge.consumer.judging.pool import JudgePool
    from tracejudge.metrics import FailureRateMetric
    from tracejudge.metrics._backends import JudgeBackend
    from tracejudge.metrics._client import JudgeReply

    answer = threading.Event()

    class WaitingBatch(JudgeBackend):
        model_name = "gpt-5-mini"
        tier = "batch"

        async def complete(self, messages, *, timeout, response_format=None):  # type: ignore[no-untyped-def]
            await asyncio.to_thread(answer.wait, 30)
            return JudgeReply(text='{"verdict": "stall", "evidence": [], "reason": "r"}')

    done: list[str] = []
    pool = JudgePool([FailureRateMetric(WaitingBatch())], lambda j: done.append(j.job.key)).start()
    try:
        assert pool.batched
        for partition in (1, 2):
            record = job_record(partition, f"c{partition}")
            job, _sampled, _ms = R.job_from_json(json.loads(record.value), key=f"{partition}:0", partition=partition)
            pool.submit(job)
        deadline = time.monotonic() + 10
        while pool.in_flight < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        pool.abandon({1})
        while pool.pending > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.pending == 1 and done == []  # partition 1's judgement cancelled, not delivered
        answer.set()
        while not done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert done == ["2:0"]
    finally:
        answer.set()
        pool.stop(5.0)


class _Outputs:
    """The delivery's side the worker uses for a job not judged: its outcome goes out, then `drain` reports it."""

    def __init__(self) -> None:
        self.durable: list[Judgement] = []

    def not_judged(self, judgement: Judgement) -> None:
        self.durable.append(judgement)

    def drain(self, finished: Any) -> None:
        done, self.durable = self.durable, []
        for judgement in done:
            finished(judgement)


def _sampled_out_record(offset: int, content_id: str, *, answered: bool) -> Record:
    plain = R.loads(job_record(offset, content_id).value)
    job, _sampled, ms = R.job_from_json(plain, key="", partition=0)
    return Record(offset, R.dumps(R.job_to_json(replace(job, answered=answered), sampled=False, completed_ms=ms)))


def test_a_job_whose_owner_recorded_its_sampled_out_outcome_is_not_answered_and_an_earlier_versions_is() -> None:
    """The processor records a sampled-out outcome when it sends the job and says so (`answered`): the worker sends
    nothing back and the job's offset is committable once its outputs are durable. A job of an earlier version (no
    `answered`) is answered through the repartition topic as before, its offset committable once that is
    acknowledged."""
    judges, pool, producer, _ = worker()
    judges.delivery = _Outputs()  # type: ignore[assignment]
    judges._record(0, _sampled_out_record(3, "x", answered=True))
    judges._record(0, _sampled_out_record(4, "y", answered=False))
    judges.offsets.consumed(0, 5)
    assert judges.offsets.committable() == {0: 3}  # neither output is durable yet
    judges.delivery.drain(judges._finished)
    assert pool.submitted == []
    assert producer.acks == [("y", "sampled_out")]  # only the earlier version's job is answered
    assert judges.offsets.committable() == {0: 5}
