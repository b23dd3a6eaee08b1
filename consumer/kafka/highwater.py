"""High watermarks of partitions a consumer does not fetch (paused ones), and kafka-python's remembered one.

`HighwaterProbe` asks a consumer of its own. On a cluster that answers ListOffsets it asks for the end offsets (one
round trip). Tansu (the embedded broker) answers ListOffsets wrongly (1 for a partition holding 50 records), so
there (`quirks.is_tansu`) the probe fetches one small batch from each partition at the caller's positions and reads
the high watermark the fetch answered, waiting up to `timeout_ms` for it.

`FetchAnswers` works around kafka-python (any broker): it keeps the high watermark of the last fetch with no way to
tell whether a fetch answered since; the stream clock needs to know which fetch said "nothing more", and when it was
sent."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kafka import TopicPartition
from kafka.errors import KafkaTimeoutError

from tracejudge._shared.rate_limited_log import RateLimitedLog

from .clients import KafkaClients
from .quirks import is_tansu

logger = logging.getLogger("tracejudge.consumer.kafka")


class HighwaterProbe:
    def __init__(self, clients: KafkaClients) -> None:
        self._clients = clients
        self._consumer: Any = None
        self._fetching = False  # Tansu: read from a fetch, not ListOffsets
        self._log = RateLimitedLog(logger, interval_s=60.0)

    def highwaters(
        self, positions: Mapping[TopicPartition, int], *, timeout_ms: int = 200
    ) -> dict[TopicPartition, int]:
        """Never raises: a lag gauge is not worth a worker. The brokers unreachable (an outage: creating the probe's
        consumer cannot bootstrap) answers nothing, said once a minute, and the next call tries again."""
        if not positions:
            return {}
        try:
            return self._highwaters(positions, timeout_ms)
        except Exception as exc:
            self._log.warning("judge-queue lag not measured: %r (the brokers unreachable? measured again later)", exc)
            if self._consumer is not None:
                try:
                    self._consumer.close(autocommit=False)
                except Exception:
                    pass
                self._consumer = None
            return {}

    def _highwaters(self, positions: Mapping[TopicPartition, int], timeout_ms: int) -> dict[TopicPartition, int]:
        if self._consumer is None:
            self._consumer = self._clients.consumer(
                "tracejudge-lag-probe", fetch_max_bytes=4096, max_partition_fetch_bytes=4096
            )
            self._fetching = is_tansu(self._consumer)
        consumer = self._consumer
        if not self._fetching:
            try:  # bounded as the fetch path is: it runs on the judge thread
                ends = consumer.end_offsets(list(positions), timeout_ms=timeout_ms)
            except KafkaTimeoutError:
                return {}  # not answered in time (a leader moving): measured again next round, the consumer kept
            return {tp: end for tp, end in ends.items() if end is not None}
        consumer.assign(list(positions))
        for tp, position in positions.items():
            consumer.seek(tp, max(0, position))
        consumer.poll(timeout_ms=timeout_ms, max_records=1)
        return {tp: end for tp in positions if (end := consumer.highwater(tp)) is not None}

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close(autocommit=False)
            self._consumer = None


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    """The high watermark a fetch answered for a partition, and the wall time at which that fetch was sent: by then
    the partition held at most `highwater` records."""

    highwater: int
    sent_ms: int


@dataclass(frozen=True, slots=True)
class _Kept:
    highwater: int
    sent: float  # kafka-python's monotonic send time: answers are ordered by it, never by a wall clock that steps
    node: Any
    session: int


class FetchAnswers:
    """What the latest fetch of a consumer answered for each partition it fetched, kept as each answer arrives (on
    kafka-python's IO thread). Installed over the fetcher's response handler (kafka-python, any broker): its own
    `highwater()` keeps the last value with no way to tell whether a fetch answered since, so a consumer that stops
    fetching (a rebalance: kafka-python fetches nothing until the join completes) still reports the old value as if
    it were current.

    An incremental fetch session (KIP-227, Apache Kafka) leaves a partition out of an answer only when its high
    watermark is the one the session last sent (no records, no error): the value kept from that session's last answer
    stands, as of this fetch. That holds only if every answer of the session was kept: one that could not be read
    forgets its partitions and makes the next fetch a full one. Tansu answers full fetches (every partition, every
    time). A failed or throttled fetch, or a partition's error, says nothing about the partitions it left out."""

    def __init__(self, fetcher: Any = None, on_unreadable: Callable[[], None] | None = None) -> None:
        self._fetcher = fetcher
        self._on_unreadable = on_unreadable  # counts each answer that could not be read (a metric)
        self._kept: dict[Any, _Kept] = {}
        self._floor: dict[Any, float] = {}  # answers to fetches sent before this (monotonic) belong to an earlier owner
        self._lock = threading.Lock()  # answers come on the IO thread; a seek's `forget` on the stream thread
        self._log = RateLimitedLog(logger, interval_s=60.0)

    @classmethod
    def install(cls, consumer: Any, on_unreadable: Callable[[], None] | None = None) -> FetchAnswers | None:
        """Watch `consumer`'s fetch answers; None when this kafka-python keeps its fetcher elsewhere."""
        fetcher = getattr(consumer, "_fetcher", None)
        handle = getattr(fetcher, "_handle_fetch_response", None)
        if fetcher is None or handle is None:
            return None
        answers = cls(fetcher, on_unreadable)

        def handle_fetch_response(node_id: Any, fetch_offsets: Any, send_time: float, response: Any) -> Any:
            try:
                result = handle(node_id, fetch_offsets, send_time, response)
            except BaseException as exc:  # its session may have taken the answer: what it left out is unknown
                answers.unreadable(node_id, fetch_offsets, exc)
                raise
            try:
                answers.answered(node_id, fetch_offsets, send_time, response)
            except Exception as exc:  # never into kafka-python's IO loop
                answers.unreadable(node_id, fetch_offsets, exc)
            return result

        fetcher._handle_fetch_response = handle_fetch_response  # looked up per fetch sent: the instance's wins
        return answers

    def answered(self, node: Any, asked: Any, send_time: float, response: Any) -> None:
        """A fetch to `node` of `asked` (the partitions of the fetch, sent at monotonic `send_time`) answered."""
        with self._lock:
            self._answered(node, asked, send_time, response)

    def _answered(self, node: Any, asked: Any, send_time: float, response: Any) -> None:
        if getattr(response, "error_code", 0):
            return
        session = getattr(response, "session_id", 0)
        included: set[Any] = set()
        for topic_data in response.responses:
            for partition_data in topic_data.partitions:
                tp = TopicPartition(topic_data.topic, partition_data.partition_index)
                included.add(tp)
                if partition_data.error_code == 0 and partition_data.high_watermark >= 0:
                    self._keep(tp, _Kept(partition_data.high_watermark, send_time, node, session))
                else:
                    self._kept.pop(tp, None)  # the session answers it again once the error is gone
        # A throttled fetch is answered empty (session -1, or none): what it left out was not looked at.
        throttled = getattr(response, "throttle_time_ms", 0) > 0
        if throttled or session <= 0 or not included <= set(asked):  # no session: all were answered; or not valid
            return
        for tp in asked:
            last = self._kept.get(tp)
            if tp not in included and last is not None and last.node == node and last.session == session:
                self._keep(tp, _Kept(last.highwater, send_time, node, session))  # left out: unchanged

    def unreadable(self, node: Any, asked: Any, exc: BaseException) -> None:
        """An answer that could not be read: its partitions are forgotten (no claim from them) until the next fetch,
        a full one, answers them again."""
        self.forget(asked)
        if self._on_unreadable is not None:
            try:
                self._on_unreadable()
            except Exception:  # a counter never breaks kafka-python's IO loop
                pass
        self._log.warning(
            "a fetch answer could not be read (%r): its partitions wait for the next full fetch (their conversations"
            " complete later, nothing is lost); counted in tracejudge_kafka_fetch_answers_unreadable_total: if it keeps"
            " rising, install the kafka-python tracejudge requires (>=3.0,<3.1), and if that is the one installed,"
            " report it with this error",
            exc,
        )

    def _full_fetches(self) -> None:
        """Every session's next fetch a full one (kafka-python's own step after a session error): a forgotten
        partition left out as unchanged would never be answered again while nothing is written to it."""
        try:
            for handler in self._fetcher._session_handlers.values():
                handler.next_metadata = handler.next_metadata.next_close_existing()
        except Exception:  # a kafka-python without sessions answers in full anyway
            pass

    def _keep(self, tp: Any, answer: _Kept) -> None:
        last = self._kept.get(tp)
        if answer.sent < self._floor.get(tp, float("-inf")):
            return
        if last is None or answer.sent >= last.sent:  # a fetch sent earlier, answered later (another broker), says less
            self._kept[tp] = answer

    def forget(self, partitions: Any) -> None:
        """The partitions were (re)assigned or sought: answers to fetches sent before now are not about this reading."""
        with self._lock:
            now = time.monotonic()
            for tp in partitions:
                self._floor[tp] = now
                self._kept.pop(tp, None)
            self._full_fetches()

    def latest(self, tp: Any) -> FetchAnswer | None:
        kept = self._kept.get(tp)
        if kept is None:
            return None
        return FetchAnswer(kept.highwater, int((time.time() - (time.monotonic() - kept.sent)) * 1000))
