"""The judge worker's parts through its public seams: the collector's outcomes reach the worker's state on the judge
thread only; a failed write is sent again (a verdict acknowledgement's failure renews the producer and commits
nothing); the retry topic's records are forwarded when due, their offsets committed only once acknowledged; a
retrying judgement handed over on the pool's thread is written by the judge thread. Kafka-free (`Judges`)."""

from __future__ import annotations

import threading
import time

from tests.consumer.test_judge_worker_duplicates import Judges, Record, job_record
from tracejudge.consumer.judging.judgement import OUTCOME_JUDGED, OUTCOME_RETRYING, Judgement, Retry
from tracejudge.consumer.judging.retries import retry_to_json
from tracejudge.consumer.kafka import KafkaError, TopicPartition
from tracejudge.consumer.streams import records as R


def test_an_acknowledgement_on_the_sender_thread_changes_the_worker_only_when_the_judge_thread_collects_it() -> None:
    judges = Judges()
    judges.read(job_record(5, "x"))
    judges.producer.deferred = True
    judges.judged(Judgement(judges.pool.submitted[0], OUTCOME_JUDGED))
    assert judges.producer.acks == [("x", "judged")] and judges.worker.offsets.held() == 1
    sender = threading.Thread(target=judges.producer.complete)  # kafka-python's sender thread answers the send
    sender.start()
    sender.join()
    assert judges.worker.offsets.held() == 1  # only queued there
    judges.worker.step()
    assert judges.worker.offsets.held() == 0
    assert judges.committed() == 6


def test_a_failed_verdict_acknowledgement_renews_the_producer_commits_nothing_and_is_sent_again() -> None:
    judges = Judges()
    judges.read(job_record(5, "x"))
    first = judges.producer
    first.deferred, first.fail = True, KafkaError("InitProducerId failed")
    judges.judged(Judgement(judges.pool.submitted[0], OUTCOME_JUDGED))
    assert judges.committed() is None  # the flush saw the acknowledgement fail: nothing committed
    assert len(judges.producers) == 2 and first.closed  # a fresh producer, the failed one closed
    errors = judges.registry.get_sample_value("tracejudge_output_errors_total", {"output": "internal_topics"})
    assert errors == 1
    judges.worker.step()  # sent again, on the fresh producer
    assert judges.producer.acks == [("x", "judged")]
    assert judges.committed() == 6


def _retry_record(offset: int, next_at: float) -> Record:
    value = R.job_to_json(
        R.job_record(job_record(offset, "r").value, key="", partition=0)[0], sampled=True, completed_ms=1
    )
    value["retry"] = retry_to_json(Retry(1, "server_error", time.time() - 60, time.time() + 3600, next_at=next_at))
    return Record(offset, R.dumps(value))


def test_a_due_retry_is_forwarded_one_not_yet_due_waits_paused_and_a_retry_offset_waits_for_its_forward() -> None:
    judges = Judges()
    retry_tp = TopicPartition(judges.worker.topics.judge_retry, 0)
    # co-partitioned with judge-queue partition 0: the short-wait topic and each step's
    steps = [judges.worker.topics.judge_retry_step(n) for n in range(1, 7)]  # the 30 s default's six
    assert judges.retry_consumer.assignment() == {retry_tp, *(TopicPartition(t, 0) for t in steps)}
    judges.retry_consumer.batches.append(
        {retry_tp: [_retry_record(0, time.time() - 1), _retry_record(1, time.time() + 3600)]}
    )
    judges.producer.fail = KafkaError("not written")
    judges.worker.step()
    assert judges.producer.topics() == [judges.worker.topics.judge_queue] * 2  # the due one, sent again at once
    assert judges.retry_consumer.paused() == {retry_tp} and judges.retry_consumer.seeks == {retry_tp: 1}
    judges.worker.commit()
    assert judges.retry_consumer.committed == {retry_tp: 0}  # its forward not acknowledged: held
    judges.producer.fail = None
    judges.worker.step()  # sent again: acknowledged
    judges.worker.commit()
    assert judges.retry_consumer.committed == {retry_tp: 1}
    assert [partition for _, _, partition in judges.producer.sent] == [0, 0, 0]


def test_a_retrying_judgement_handed_over_on_the_pools_thread_is_written_by_the_judge_thread() -> None:
    judges = Judges()
    job = R.job_record(job_record(7, "x").value, key="0:7", partition=0)[0]
    retry = Retry(1, "timeout", time.time(), time.time() + 3600, next_at=time.time() + 30)
    assert judges.delivery.reschedule is not None
    events: list[threading.Event] = []
    pool_thread = threading.Thread(
        target=lambda: events.append(judges.delivery.reschedule(Judgement(job, OUTCOME_RETRYING, retry=retry)))  # type: ignore[misc]
    )
    pool_thread.start()
    pool_thread.join()
    assert judges.producer.sent == [] and not events[0].is_set()  # queued for the judge thread
    judges.worker.step()
    # 30 s: the first step of the default 30 s backoff, ripe when due
    assert judges.producer.topics() == [judges.worker.topics.judge_retry_step(1)] and events[0].is_set()
    written = R.loads(judges.producer.sent[0][1])
    assert written["retry"] == retry_to_json(retry) and written["ripe_ms"] == int((retry.next_at or 0) * 1000)
