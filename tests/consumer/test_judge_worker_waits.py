"""A judge worker paused on outputs not yet durable waits for the oldest one, not for a poll of its paused partitions
to time out; with nothing awaited it polls as before. Kafka-free: the worker's step with a fake consumer."""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry

from tests.consumer.test_judge_worker_duplicates import Pool as DuplicatesPool
from tests.consumer.test_judge_worker_duplicates import Producer
from tracejudge.consumer.adapters import Turn
from tracejudge.consumer.conversation.job import JudgeJob
from tracejudge.consumer.emit.delivery import Delivery
from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.judging.judgement import OUTCOME_SAMPLED_OUT, Judgement
from tracejudge.consumer.settings import Settings
from tracejudge.consumer.streams.instruments import StreamsInstruments
from tracejudge.consumer.streams.judge_worker import POLL_S, JudgeWorker


class Pool(DuplicatesPool):
    pending = 0


class Consumer:
    def __init__(self) -> None:
        self.timeouts: list[int] = []

    def poll(self, *, timeout_ms: int, max_records: int) -> dict[Any, Any]:
        self.timeouts.append(timeout_ms)
        return {}

    def assignment(self) -> set[Any]:
        return set()

    def paused(self) -> set[Any]:
        return set()


class Sink:
    """An output durable once its event is set (as the results topic's acknowledgement)."""

    def __init__(self) -> None:
        self.events: list[threading.Event] = []

    def emit(self, judgement: Judgement) -> list[threading.Event]:
        self.events.append(threading.Event())
        return [self.events[-1]]


def _worker(sink: Sink) -> tuple[JudgeWorker, Consumer, Delivery]:
    registry = CollectorRegistry()
    prometheus = ConsumerInstruments(registry)
    delivery = Delivery(prometheus, [sink])
    settings = Settings.from_options(bootstrap_servers="unused:9092", topic="spans", group_id="g")
    worker = JudgeWorker(settings, Pool(), delivery, prometheus, StreamsInstruments(registry), partitions=1)  # type: ignore[arg-type]
    consumer = Consumer()
    worker.consumer, worker.producer = consumer, Producer()  # type: ignore[assignment]
    return worker, consumer, delivery


def _sampled_out(delivery: Delivery, worker: JudgeWorker) -> None:
    turn = Turn("s", "t", "", 1, 2, "q", "a")
    job = JudgeJob("0:1", "c", "a", 0, 1, (turn,), False, False, False, "ended", "content")
    worker.offsets.hold(job.key, 0, 1)
    worker.offsets.consumed(0, 2)
    delivery.not_judged(Judgement(job, OUTCOME_SAMPLED_OUT, sample_rate=0.0))
    delivery.drain(worker._finished)


def test_a_paused_worker_waits_for_its_oldest_output_then_polls_without_waiting() -> None:
    sink = Sink()
    worker, consumer, delivery = _worker(sink)
    _sampled_out(delivery, worker)
    assert delivery.awaiting == 1
    worker.paused = True
    threading.Timer(0.01, sink.events[0].set).start()  # acknowledged while the step waits
    worker.step()
    assert sink.events[0].is_set()
    assert consumer.timeouts == [0]  # it waited for the output, not in the poll
    assert delivery.awaiting == 0  # and finished it in the same step: its verdict acknowledged, committable
    assert worker.offsets.committable() == {0: 2}


def test_an_output_never_acknowledged_holds_each_step_as_long_as_a_poll_did() -> None:
    sink = Sink()
    worker, consumer, delivery = _worker(sink)
    _sampled_out(delivery, worker)
    worker.paused = True
    worker.step()  # waits POLL_S on the event (never set): no busy loop
    assert consumer.timeouts == [0]
    assert delivery.awaiting == 1  # still held: its offset is not committable
    assert worker.offsets.committable() == {0: 1}


def test_nothing_awaited_polls_as_before() -> None:
    worker, consumer, _delivery = _worker(Sink())
    worker.paused = True  # paused on judgements in the pool, say: nothing to wait for but the poll
    worker.step()
    worker.paused = False
    worker.step()
    assert consumer.timeouts == [int(POLL_S * 1000)] * 2
