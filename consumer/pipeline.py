"""The judging pipeline: ingest → assemble → select → judge (async) → deliver → finish, without Kafka's lifecycle.

The live consumer (`service.py`) and backfill both run records through one Pipeline; they differ only in the source
of records (a subscription, an assigned offset range), the clock passed as `now` (wall time, record timestamps) and
which complete conversations `select` sends to the judges (the others go out as sampled out). So a conversation
gets the same versions, hence the same result ids, from both, as long as the live consumer kept up with the topic:
live idleness is wall time at reading, so a backlog read in one burst (after a restart or lag) has its idle gaps
collapsed, where backfill still sees them in the record timestamps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tracejudge.metrics import HolisticJudgeMetric

from .conversations import ConversationStore, JudgeJob
from .delivery import Delivery, JudgementSink
from .emit import KafkaWriter
from .emit.prometheus import ConsumerInstruments
from .feedback import FeedbackJoiner
from .ingest import Ingest
from .judgement import OUTCOME_SAMPLED_OUT, Judgement
from .offsets import OffsetTracker
from .pool import JudgePool
from .settings import Settings


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        judges: Sequence[HolisticJudgeMetric],
        prometheus: ConsumerInstruments,
        select: Callable[[JudgeJob], bool],
        *,
        sinks: Sequence[JudgementSink] = (),
        feedback: FeedbackJoiner | None = None,
        dead_letter: KafkaWriter | None = None,
        max_open: int | None = None,
    ) -> None:
        self.store = ConversationStore(
            idle_timeout_s=settings.session_idle_timeout,
            max_open=settings.max_open_conversations if max_open is None else max_open,
            max_turns=settings.max_turns_per_conversation,
        )
        self.offsets = OffsetTracker()
        self.ingest = Ingest(
            self.store,
            self.offsets,
            prometheus,
            max_record_bytes=settings.max_record_bytes,
            dead_letter=dead_letter,
            feedback=feedback,
        )
        self.delivery = Delivery(prometheus, sinks, feedback=feedback)
        self.pool = JudgePool(
            judges,
            self.delivery.judged,
            max_concurrency=settings.judge_concurrency(len(judges)),
            max_requests_per_minute=settings.max_requests_per_minute,
            max_cost_per_hour=settings.max_cost_per_hour,
        )
        self.select = select
        self.on_finished: Callable[[Judgement], None] | None = None  # e.g. backfill's report

    @property
    def pending(self) -> int:
        """Judgements queued, being judged, or waiting for their outputs (what backpressure counts)."""
        return self.pool.pending + self.delivery.awaiting

    def record(self, partition: int, record: Any, now: float) -> bool:
        return self.ingest.record(partition, record, now)

    def dispatch(self) -> list[JudgeJob]:
        """Complete conversations to the judges (or out as sampled out); returns them."""
        jobs = self.ingest.ready()
        for job in jobs:
            if self.select(job):
                self.pool.submit(job)
            else:
                self.delivery.not_judged(Judgement(job, OUTCOME_SAMPLED_OUT))
        return jobs

    def drain(self) -> None:
        """Finish the judgements whose outputs are durable (their offset holds go)."""
        self.delivery.drain(self._finished)

    def _finished(self, judgement: Judgement) -> None:
        self.ingest.finished(judgement)
        if self.on_finished is not None:
            self.on_finished(judgement)
