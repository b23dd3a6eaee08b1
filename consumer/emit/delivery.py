"""The output fan-out: every finished judgement to Prometheus and each result sink, then tracked until durable.

A sink that raises is counted (`tracejudge_output_errors_total{output="sink"}`) and said in a rate-limited line, never
fatal: an exception is the sink's own bug, not an outage, and holding its offset would stop the group forever. A
sink may return events set once its output is durable (the results topic: acknowledged by the broker); a judgement
is handed to `drain()`'s `finish` only when all are set, so its conversation's offset hold stays until then (a failed
output keeps its hold, across a restart too).
`judged`/`not_judged` run on the pool's or the poll thread; `drain` on the poll thread (or the rebalance listener
while the poll thread waits in `poll()`).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ..judging.feedback import FeedbackJoiner
from ..judging.judgement import OUTCOME_RETRYING, Judgement, Retry
from ..judging.retries import RetryPolicy
from .prometheus import ConsumerInstruments

logger = logging.getLogger("tracejudge.consumer")


class JudgementSink(Protocol):
    """Receives every finished judgement; may return events that are set once the output is durable."""

    def emit(self, judgement: Judgement) -> Any: ...


class Delivery:
    def __init__(
        self,
        prometheus: ConsumerInstruments,
        sinks: Sequence[JudgementSink],
        *,
        feedback: FeedbackJoiner | None = None,
        retries: RetryPolicy | None = None,
    ) -> None:
        self.prometheus = prometheus
        self.sinks = list(sinks)
        self.feedback = feedback
        self.retries = retries
        # Writes a retrying judgement's job to the retry topic; its event is set once the broker has it (the judge
        # worker's, set when it opens). Without it (no Kafka runtime) nothing is retried.
        self.reschedule: Callable[[Judgement], threading.Event] | None = None
        self.retried: dict[str, Retry] = {}  # job key → its retries so far (a job forwarded from the retry topic)
        self.judgements = 0  # judged (not sampled out) in this run
        self.outcomes: Counter[str] = Counter()  # every outcome in this run, as tracejudge_sessions_total counts them
        self.sink_errors = 0
        self._errors_lock = threading.Lock()  # sinks run on the pool thread and (sampled out) the poll thread
        self._done: queue.SimpleQueue[tuple[Judgement, list[threading.Event]]] = queue.SimpleQueue()
        self._awaiting: list[tuple[Judgement, list[threading.Event]]] = []
        self._sink_log = RateLimitedLog(logger, interval_s=10.0)

    @property
    def awaiting(self) -> int:
        """Judgements whose outputs are not yet known durable (as of the last `drain()`)."""
        return len(self._awaiting)

    def judged(self, judgement: Judgement) -> None:
        """The pool's `on_done`: a judgement (judged, failed or skipped for budget) is out; a failure that can pass
        (within the retry horizon) goes out as `retrying`, its job written to the retry topic."""
        judgement.retry = self.retried.pop(judgement.job.key, judgement.retry)
        if self.retries is not None and self.reschedule is not None:
            try:
                judgement = self.retries.review(judgement)
            except Exception:
                logger.exception("deciding a retry failed for conversation %s", judgement.job.conversation_id)
        self.judgements += 1
        if self.feedback is not None and judgement.outcome != OUTCOME_RETRYING:  # joined at its final outcome
            try:  # whatever happens here, the judgement is queued: one never queued would hold its offset forever
                self.feedback.verdicts(judgement)
            except Exception:
                logger.exception("joining feedback failed for conversation %s", judgement.job.conversation_id)
        deliveries = self._emit(judgement)
        if judgement.outcome == OUTCOME_RETRYING:
            assert self.reschedule is not None
            try:
                deliveries.append(self.reschedule(judgement))  # its offset waits until the retry record is durable
            except Exception:  # a retry that cannot be written must not hold the partition's commits for good
                logger.exception("scheduling a retry failed for conversation %s", judgement.job.conversation_id)
        self._done.put((judgement, deliveries))

    def not_judged(self, judgement: Judgement) -> None:
        """A conversation that was not sent to the judges (sampled out): its outcome goes out all the same."""
        self.retried.pop(judgement.job.key, None)
        self._done.put((judgement, self._emit(judgement)))

    def _emit(self, judgement: Judgement) -> list[threading.Event]:
        with self._errors_lock:
            if judgement.outcome != OUTCOME_RETRYING:
                self.outcomes[judgement.outcome] += 1
        try:
            self.prometheus.record_judgement(judgement)
        except Exception:
            logger.exception("recording the judgement failed for conversation %s", judgement.job.conversation_id)
        deliveries: list[threading.Event] = []
        for sink in self.sinks:
            try:
                acknowledged = sink.emit(judgement)
            except Exception as exc:
                with self._errors_lock:
                    self.sink_errors += 1
                self.prometheus.record_output_error("sink")
                self._sink_log.warning(
                    "result sink %s raised for conversation %s: %r (its result is lost to that sink; fix the sink)",
                    type(sink).__name__,
                    judgement.job.conversation_id,
                    exc,
                )
                continue
            if isinstance(acknowledged, list):
                deliveries.extend(acknowledged)
        return deliveries

    def wait_for_outputs(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the oldest output not yet durable of the judgements awaited (as of the last
        `drain()`, on the same thread); False at once when none is awaited: there is nothing to wait for."""
        for _judgement, deliveries in self._awaiting:
            for delivered in deliveries:
                if not delivered.is_set():
                    delivered.wait(timeout_s)
                    return True
        return bool(self._awaiting)

    def drain(self, finish: Callable[[Judgement], None]) -> None:
        """`finish` every judgement whose outputs are durable; the others keep waiting."""
        while True:
            try:
                self._awaiting.append(self._done.get_nowait())
            except queue.Empty:
                break
        waiting = []
        for judgement, deliveries in self._awaiting:
            if not deliveries or all(delivered.is_set() for delivered in deliveries):  # without a generator when none
                try:
                    self.prometheus.record_verdict_delay(judgement)
                except Exception:
                    logger.exception("recording the verdict delay failed for %s", judgement.job.conversation_id)
                finish(judgement)
            else:
                waiting.append((judgement, deliveries))
        self._awaiting = waiting

    def undelivered(self) -> list[Judgement]:
        """Judgements still waiting for their outputs (at shutdown: left uncommitted)."""
        return [judgement for judgement, _ in self._awaiting]
