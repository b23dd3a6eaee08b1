"""A judge worker paused on outputs not yet durable waits for the oldest one, not for a poll of its paused partitions
to time out; with nothing awaited it polls as before. Kafka-free: the worker's step with a fake consumer."""

from __future__ import annotations

import threading

from tests.consumer.test_judge_worker_duplicates import Judges, Sink, sampled_out_record
from tracejudge.consumer.streams.judge_worker import POLL_S


def _paused_on_a_sampled_out_job(sink: Sink) -> Judges:
    """The judges full (backpressure) when a sampled-out job is read at offset 1: its output is not yet durable, and
    the step ends with the judge queue paused."""
    judges = Judges([sink])
    judges.pool.pending = judges.worker.max_pending
    judges.read(sampled_out_record(1, "content", answered=False))
    assert judges.worker.paused and judges.delivery.awaiting == 1
    judges.queue.timeouts.clear()
    return judges


def test_a_paused_worker_waits_for_its_oldest_output_then_polls_without_waiting() -> None:
    sink = Sink()
    judges = _paused_on_a_sampled_out_job(sink)
    threading.Timer(0.01, sink.events[0].set).start()  # acknowledged while the step waits
    judges.worker.step()
    assert sink.events[0].is_set()
    assert judges.queue.timeouts == [0]  # it waited for the output, not in the poll
    assert judges.delivery.awaiting == 0  # and finished it in the same step: its verdict acknowledged, committable
    assert judges.committed() == 2


def test_an_output_never_acknowledged_holds_each_step_as_long_as_a_poll_did() -> None:
    judges = _paused_on_a_sampled_out_job(Sink())
    judges.worker.step()  # waits POLL_S on the event (never set): no busy loop
    assert judges.queue.timeouts == [0]
    assert judges.delivery.awaiting == 1  # still held: its offset is not committable
    assert judges.committed() == 1


def test_nothing_awaited_polls_as_before() -> None:
    judges = Judges([Sink()])
    judges.pool.pending = judges.worker.max_pending  # full of judgements in the pool: nothing to wait for but the poll
    judges.worker.step()
    assert judges.worker.paused
    judges.worker.step()
    judges.pool.pending = 0
    judges.worker.step()
    assert not judges.worker.paused
    assert judges.queue.timeouts == [int(POLL_S * 1000)] * 3
