"""The judge queue's records of the partitions a judge worker owns (Kafka Streams' task to its stream thread): each
job to the judge pool, or answered from a verdict already settled, or, sampled out, straight to the outputs; each
finished judgement's outcome back to its conversation's owner (the repartition topic), for negative feedback.

A job's offset is held from its read until its outputs are durable (Delivery) and that verdict acknowledgement is
itself acknowledged, so nothing is committed past a job whose outcome could still be lost. Judge-thread state: the
acknowledgements' callbacks reach it through the collector's queue.
"""

from __future__ import annotations

import logging
from typing import Any

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ..adapters import Feedback
from ..emit.delivery import Delivery
from ..emit.prometheus import ConsumerInstruments
from ..judging.feedback import FeedbackJoiner
from ..judging.judgement import OUTCOME_FAILED, OUTCOME_SAMPLED_OUT, Judgement
from ..judging.pool import JudgePool
from ..judging.retries import iso, retry_from_json
from ..kafka.topics import InternalTopics
from ..offsets import OffsetTracker
from ..settings import Settings
from . import records as R
from .instruments import StreamsInstruments
from .settled import WAITS, SettledJudgements
from .verdict_collector import Outgoing, VerdictCollector

logger = logging.getLogger("tracejudge.consumer.judges")
# On a job `tracejudge rejudge` wrote back: the failed result ids it judges again. The job is judged as any other (the
# settled verdicts never remember a failure), so its outcome reaches every output and metric as a judgement does.
REJUDGE_HEADER = "tracejudge.rejudge"


class JudgeTask:
    def __init__(
        self,
        settings: Settings,
        pool: JudgePool,
        delivery: Delivery,
        prometheus: ConsumerInstruments,
        instruments: StreamsInstruments,
        collector: VerdictCollector,
        *,
        feedback: FeedbackJoiner | None = None,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.delivery = delivery
        self.prometheus = prometheus
        self.instruments = instruments
        self.collector = collector
        self.feedback = feedback
        self.topics = InternalTopics(settings.group_id)
        self.offsets = OffsetTracker()
        self.settled = SettledJudgements()
        self._log = RateLimitedLog(logger, interval_s=10.0)
        self._failed_log = RateLimitedLog(logger, interval_s=60.0)  # a judgement failed for good: how to judge again

    def read(self, partition: int, records: list[Any]) -> None:
        """A poll's records of one judge-queue partition."""
        for record in records:
            self._record(partition, record)
        self.offsets.consumed(partition, records[-1].offset + 1)

    def _record(self, partition: int, record: Any) -> None:
        kind = R.kind_of(record.headers)
        try:
            if kind == R.JOB:
                job, sampled, retry_value = R.job_record(
                    record.value, key=f"{partition}:{record.offset}", partition=partition
                )
                retry = retry_from_json(retry_value)
            else:
                value = R.loads(record.value)
                if kind == R.FEEDBACK:
                    self._feedback(record.key.decode("utf-8", "surrogatepass"), value)
                return
        except Exception as exc:
            self._log.warning("unreadable judge-queue record at %d/%d skipped: %r", partition, record.offset, exc)
            return
        self.offsets.hold(job.key, partition, record.offset)
        rejudged = _header(record.headers, REJUDGE_HEADER)
        if rejudged is not None:
            logger.info("conversation %s: judged again (tracejudge rejudge of %s)", job.conversation_id, rejudged)
        if retry is not None:
            logger.info(
                "conversation %s: judge attempt %d (the last failed with %s; retried until %s)",
                job.conversation_id,
                retry.attempt + 1,
                retry.reason,
                iso(retry.until),
            )
        if not sampled:
            rate = self.settings.agent_sample_rates.get(job.agent, self.settings.sample_rate)
            self.delivery.not_judged(Judgement(job, OUTCOME_SAMPLED_OUT, sample_rate=rate))
            return
        admitted = self.settled.admit(job)
        if admitted is None:
            if retry is not None:
                self.delivery.retried[job.key] = retry
            self.pool.submit(job)
            return
        self.instruments.duplicate_jobs.inc()
        if admitted != WAITS:
            self.finished(Judgement(job, admitted))

    def _feedback(self, conversation_id: str, value: dict[str, Any]) -> None:
        feedback = Feedback(**value["feedback"])
        agent = value.get("agent") or "unknown"
        self.prometheus.record_feedback(agent, negative=feedback.negative)
        if self.feedback is not None:
            self.feedback.feedback(conversation_id, agent, feedback)

    def finished(self, judgement: Judgement) -> None:
        """Delivery's `drain` hands it a judgement whose outputs are durable: the conversation's owner is told the
        outcome (and so are the copies that waited for it); the job's offset is released once that acknowledgement
        is acknowledged (a failed one is sent again at the next step). A job whose owner recorded its outcome when it
        sent it (`answered`: sampled out) is told nothing: its offset goes now."""
        job = judgement.job
        # No text to judge (`empty` in the results topic) is no judge's failure: no fix to judge it again after.
        if judgement.outcome == OUTCOME_FAILED and _reason(judgement) != "empty_conversation":
            self._failed_log.warning(
                "conversation %s: judging failed for good (%s); once the judge is fixed, judge every failed "
                "conversation again with `tracejudge rejudge --group-id %s` (--dry-run first: how many, the cost)",
                job.conversation_id,
                _reason(judgement),
                self.settings.group_id,
            )
        for copy in self.settled.settle(judgement):
            self.finished(Judgement(copy, judgement.outcome))
        if job.answered and judgement.outcome == OUTCOME_SAMPLED_OUT:
            self.offsets.release(job.key)
            return
        self.collector.send(
            Outgoing(
                self.topics.repartition,
                job.conversation_id.encode("utf-8", "surrogatepass"),
                R.verdict_value(job.content_id, judgement.outcome),
                R.VERDICT,
                job.partition,
                "a verdict acknowledgement could not be written: %r (sent again; its job stays uncommitted until then)",
                acked=lambda: self.offsets.release(job.key),
                gates_commit=True,
            )
        )

    def forget(self, partitions: set[int]) -> None:
        """Partitions that moved away: their offsets, and the transcripts in flight on them."""
        self.offsets.forget_partitions(partitions)
        self.settled.forget(partitions)


def _header(headers: Any, name: str) -> str | None:
    for key, value in headers or ():
        if key == name:
            return bytes(value or b"").decode("utf-8", "replace")
    return None


def _reason(judgement: Judgement) -> str:
    """The first failed call's reason (the judges' error kind), as the results record names it."""
    for result in judgement.results:
        if result.error is not None:
            return result.error_kind or "unknown"
    return "failed before the judge call"
