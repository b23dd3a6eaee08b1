"""A replayed judge job (a crash between the job's send and the assembler's commit re-completes the conversation)
is answered with the verdict this worker gave the same transcript: one judge call, every copy's offset committed.

Kafka-free: a JudgeWorker opened on fake clients (`Judges`): records go in through its consumer's poll, judgements
through the delivery as the pool hands them over, and what comes out is what it sends and commits. The real processes
are in tests/reliability/test_crash.py (whose duplicate bound this keeps)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import CollectorRegistry

from tracejudge.consumer.adapters import Turn
from tracejudge.consumer.conversation.job import JudgeJob
from tracejudge.consumer.emit.delivery import Delivery
from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.judging.judgement import OUTCOME_FAILED, OUTCOME_JUDGED, OUTCOME_RETRYING, Judgement, Retry
from tracejudge.consumer.kafka import KafkaClients, TopicPartition
from tracejudge.consumer.settings import Settings
from tracejudge.consumer.streams import records as R
from tracejudge.consumer.streams.instruments import StreamsInstruments
from tracejudge.consumer.streams.judge_worker import JudgeWorker


class Future:
    """A send's future: acknowledged (or failed, while its producer's `fail` is set) as it is made, a callback then
    registered running at once; a deferred producer's when it is completed (as kafka-python's sender thread would)."""

    def __init__(self, producer: Producer) -> None:
        self.done = not producer.deferred
        self.error = producer.fail if self.done else None
        self.callbacks: list[Any] = []
        self.errbacks: list[Any] = []

    def add_callback(self, fn: Any) -> Future:
        if not self.done:
            self.callbacks.append(fn)
        elif self.error is None:
            fn(None)
        return self

    def add_errback(self, fn: Any) -> Future:
        if not self.done:
            self.errbacks.append(fn)
        elif self.error is not None:
            fn(self.error)
        return self

    def complete(self, error: BaseException | None) -> None:
        self.done, self.error = True, error
        for fn in self.callbacks if error is None else self.errbacks:
            fn(None if error is None else error)


class Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, int | None]] = []  # (topic, value, partition) of every record sent
        self.fail: BaseException | None = None  # the error every send gets while set
        self.deferred = False  # sends are answered at `complete` or `flush`, not as they are made
        self.pending: list[Future] = []
        self.closed = False

    def send(self, topic: str, *, value: bytes, partition: int | None = None, **_: Any) -> Future:
        self.sent.append((topic, value, partition))
        future = Future(self)
        if not future.done:
            self.pending.append(future)
        return future

    def complete(self) -> None:
        pending, self.pending = self.pending, []
        for future in pending:
            future.complete(self.fail)

    def flush(self, timeout: float | None = None) -> None:
        self.complete()

    def close(self, timeout: float | None = None) -> None:
        self.closed = True

    def topics(self) -> list[str]:
        return [topic for topic, _, _ in self.sent]

    @property
    def acks(self) -> list[tuple[str, str]]:
        """(content id, outcome) of every verdict acknowledgement sent."""
        verdicts = [json.loads(value) for topic, value, _ in self.sent if topic.endswith("-repartition")]
        return [(body["content_id"], body["outcome"]) for body in verdicts]


class Consumer:
    """The judge-queue member's or the retry topic's consumer: `batches` are what its polls return, in turn."""

    def __init__(self, **config: Any) -> None:
        self.config = config
        self.batches: list[dict[TopicPartition, list[Any]]] = []
        self.timeouts: list[int] = []
        self.committed: dict[TopicPartition, int] = {}
        self.assigned: set[TopicPartition] = set()
        self.paused_: set[TopicPartition] = set()
        self.seeks: dict[TopicPartition, int] = {}

    def subscribe(self, topics: list[str], listener: Any = None) -> None:
        pass

    def poll(self, *, timeout_ms: int, max_records: int | None = None) -> dict[TopicPartition, list[Any]]:
        self.timeouts.append(timeout_ms)
        return self.batches.pop(0) if self.batches else {}

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned = set(tps)

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def paused(self) -> set[TopicPartition]:
        return set(self.paused_)

    def pause(self, *tps: TopicPartition) -> None:
        self.paused_ |= set(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused_ -= set(tps)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks[tp] = offset

    def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        self.committed.update({tp: meta.offset for tp, meta in offsets.items()})

    async def commit_async(self, offsets: dict[TopicPartition, Any]) -> None:
        self.commit(offsets)

    def close(self, autocommit: bool = True) -> None:
        pass


class Pool:
    max_concurrency = 4
    pending = 0
    in_flight = 0
    batched = False

    def __init__(self) -> None:
        self.submitted: list[JudgeJob] = []

    def submit(self, job: JudgeJob) -> None:
        self.submitted.append(job)

    def abandon(self, partitions: set[int]) -> None:
        pass

    def stop(self, grace_s: float) -> bool:
        return True


class Sink:
    """An output durable once its event is set (as the results topic's acknowledgement)."""

    def __init__(self) -> None:
        self.events: list[threading.Event] = []

    def emit(self, judgement: Judgement) -> list[threading.Event]:
        self.events.append(threading.Event())
        return [self.events[-1]]


class Judges:
    """A JudgeWorker opened on fake clients with a real Delivery, judge-queue partition 0 assigned."""

    def __init__(self, sinks: Sequence[Any] = ()) -> None:
        self.registry = CollectorRegistry()
        prometheus = ConsumerInstruments(self.registry)
        self.pool = Pool()
        self.producers: list[Producer] = []  # every producer built, the current one last
        self.delivery = Delivery(prometheus, list(sinks))
        self.consumers: dict[str, Consumer] = {}
        settings = Settings.from_options(bootstrap_servers="unused:9092", topic="spans", group_id="g")
        clients = KafkaClients.from_settings(settings, consumer_factory=self._consumer, producer_factory=self._producer)
        self.worker = JudgeWorker(
            settings,
            self.pool,  # type: ignore[arg-type]
            self.delivery,
            prometheus,
            StreamsInstruments(self.registry),
            partitions=1,
            clients=clients,
        )
        self.worker.open()
        self.queue = self.consumers["tracejudge-judges"]
        self.retry_consumer = self.consumers["tracejudge-judge-retries"]
        self.tp = TopicPartition(self.worker.topics.judge_queue, 0)
        self.assign()

    def _consumer(self, **config: Any) -> Consumer:
        consumer = self.consumers[config["client_id"]] = Consumer(**config)
        return consumer

    def _producer(self, **config: Any) -> Producer:
        self.producers.append(Producer())
        return self.producers[-1]

    @property
    def producer(self) -> Producer:
        return self.producers[-1]

    def assign(self) -> None:
        """The group hands judge-queue partition 0 to this worker."""
        self.queue.assigned.add(self.tp)
        asyncio.run(self.worker.on_partitions_assigned([self.tp]))

    def revoke(self) -> None:
        asyncio.run(self.worker.on_partitions_revoked([self.tp]))
        self.queue.assigned.discard(self.tp)

    def read(self, *records: Any) -> None:
        """A step whose poll returns these records of partition 0."""
        self.queue.batches.append({self.tp: list(records)})
        self.worker.step()

    def judged(self, judgement: Judgement) -> None:
        """The pool hands the judgement over (on its thread, as `on_done`); the worker's next step finishes it."""
        self.delivery.judged(judgement)
        self.worker.step()

    def committed(self) -> int | None:
        """A commit; the judge-queue offset of partition 0 committed so far."""
        self.worker.commit()
        return self.queue.committed.get(self.tp)

    def duplicates(self) -> float | None:
        return self.registry.get_sample_value("tracejudge_duplicate_jobs_total")


@dataclass
class Record:
    offset: int
    value: bytes
    headers: Any = None
    key: bytes = b"c"
    partition: int = 0

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


def sampled_out_record(offset: int, content_id: str, *, answered: bool) -> Record:
    plain = R.loads(job_record(offset, content_id).value)
    job, _sampled, ms = R.job_from_json(plain, key="", partition=0)
    return Record(offset, R.dumps(R.job_to_json(replace(job, answered=answered), sampled=False, completed_ms=ms)))


def test_a_copy_read_while_judging_waits_for_that_verdict_and_a_later_copy_gets_it_at_once() -> None:
    judges = Judges()
    judges.read(job_record(5, "x"), job_record(9, "x"))  # the replay's copy, while the first is in flight
    assert [job.key for job in judges.pool.submitted] == ["0:5"]
    assert judges.committed() == 5
    judges.judged(Judgement(judges.pool.submitted[0], OUTCOME_JUDGED))
    assert judges.producer.acks == [("x", "judged"), ("x", "judged")]
    assert judges.committed() == 10  # both copies released
    judges.read(job_record(12, "x"))  # a copy read after the verdict
    assert len(judges.pool.submitted) == 1 and judges.producer.acks[-1] == ("x", "judged")
    assert judges.committed() == 13
    assert judges.duplicates() == 2
    judges.read(job_record(13, "y"))  # another transcript is judged
    assert [job.content_id for job in judges.pool.submitted] == ["x", "y"]


def test_a_failed_verdict_is_shared_by_its_waiting_copies_but_not_remembered() -> None:
    judges = Judges()
    judges.read(job_record(1, "x"), job_record(2, "x"))
    judges.judged(Judgement(judges.pool.submitted[0], OUTCOME_FAILED))
    assert judges.producer.acks == [("x", "failed"), ("x", "failed")]
    judges.read(job_record(3, "x"))  # a failure is not a verdict: a later copy is judged
    assert [job.key for job in judges.pool.submitted] == ["0:1", "0:3"]


def test_revoked_partitions_forget_the_transcripts_they_were_judging() -> None:
    """A primary cancelled with its partition (batch tier) never finishes: its copies must not wait for it forever
    when the partition comes back; its job is read again and judged."""
    judges = Judges()
    judges.read(job_record(4, "x"))
    judges.revoke()
    assert judges.queue.committed == {judges.tp: 4}  # committed on revocation up to the job in flight
    judges.assign()
    judges.read(job_record(4, "x"))  # the partition handed back: the job is read again
    assert [job.key for job in judges.pool.submitted] == ["0:4", "0:4"]


def test_a_batch_tier_pool_abandons_a_revoked_partitions_judgements_and_keeps_the_others() -> None:
    """At the batch tier a judgement in flight waits for a batch; the partition's new owner waits for the same batch
    (it reads the batch records): finishing it here too would deliver the verdict twice."""
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


def test_a_job_whose_owner_recorded_its_sampled_out_outcome_is_not_answered_and_an_earlier_versions_is() -> None:
    """The processor records a sampled-out outcome when it sends the job and says so (`answered`): the worker sends
    nothing back and the job's offset is committed once its outputs are durable. A job of an earlier version (no
    `answered`) is answered through the repartition topic as before, its offset committed once that is
    acknowledged."""
    sink = Sink()
    judges = Judges([sink])
    judges.read(sampled_out_record(3, "x", answered=True), sampled_out_record(4, "y", answered=False))
    assert judges.committed() == 3  # neither output is durable yet
    for event in sink.events:
        event.set()
    judges.worker.step()
    assert judges.pool.submitted == []
    assert judges.producer.acks == [("y", "sampled_out")]  # only the earlier version's job is answered
    assert judges.committed() == 5


class _AlwaysRetrying:
    """A retry policy that turns every judgement into a retry due in 30 s."""

    def review(self, judgement: Judgement) -> Judgement:
        now = time.time()
        judgement.outcome = OUTCOME_RETRYING
        judgement.retry = Retry(1, "timeout", now, now + 3600, next_at=now + 30)
        return judgement


def test_a_retry_queued_before_a_revocation_is_written_and_its_job_committed_past_it() -> None:
    """The pool hands a retry to the judge thread; the partition is revoked before the thread's next step. The
    retry record is written and acknowledged within the revocation, so the job's offset is committed past it: the
    new owner neither re-reads the job nor runs a second retry chain beside the record's."""
    judges = Judges()
    judges.delivery.retries = _AlwaysRetrying()  # type: ignore[assignment]
    judges.read(job_record(5, "x"))
    job = judges.pool.submitted[0]
    judges.delivery.judged(Judgement(job, "failed"))  # the pool's thread: a reason that can pass
    judges.revoke()
    retry_topic = judges.worker.topics.judge_retry_step(1)  # a 30 s wait: the default backoff's first step
    assert [(t, p) for t, _, p in judges.producer.sent if t == retry_topic] == [(retry_topic, 0)]
    assert judges.committed() == 6  # past the job: the retry record carries it on
    judges.worker.step()
    assert len([t for t, _, _ in judges.producer.sent if t == retry_topic]) == 1  # never written twice
