"""Ingest and assembly: a Kafka record → spans → conversation events → complete conversations, with offset holds.

One path for the live consumer and backfill; they differ only in where records come from and in the clock passed
as `now` (wall time live, record timestamps in backfill). Nothing a record contains may stop it: a record that does
not decode, or a span that does not adapt, is counted malformed and dead-lettered. Only one thread calls it (the poll
thread, or the rebalance listener while the poll thread waits in `poll()`).
"""

from __future__ import annotations

import logging
from typing import Any

from tracejudge._shared.rate_limited_log import RateLimitedLog

from .adapters import Convention, ConversationEvent, extract, textless_model_call, trace_contexts
from .conversation.textless import TextlessSpans
from .conversations import ConversationStore, JudgeJob
from .decode import MalformedRecord, decode_record
from .emit import KafkaWriter
from .emit.prometheus import ConsumerInstruments
from .feedback import FeedbackJoiner
from .judgement import OUTCOME_FAILED, OUTCOME_JUDGED, Judgement
from .offsets import OffsetTracker

logger = logging.getLogger("tracejudge.consumer")


class Ingest:
    def __init__(
        self,
        store: ConversationStore,
        offsets: OffsetTracker,
        prometheus: ConsumerInstruments,
        *,
        max_record_bytes: int,
        dead_letter: KafkaWriter | None = None,
        feedback: FeedbackJoiner | None = None,
    ) -> None:
        self.store = store
        self.offsets = offsets
        self.prometheus = prometheus
        self.max_record_bytes = max_record_bytes
        self.dead_letter = dead_letter
        self.feedback = feedback
        self._malformed_log = RateLimitedLog(logger, interval_s=10.0)
        self.textless = TextlessSpans(prometheus.record_textless_span)

    def record(self, partition: int, record: Any, now: float) -> bool:
        """One record in; False when it was malformed. Any exception while decoding it makes it a malformed record;
        a span that fails to adapt or fold in does too, after the record's other spans went in."""
        try:
            spans = decode_record(record.value, max_bytes=self.max_record_bytes)
            traces = trace_contexts(spans)  # a span without an id goes with the conversation its trace names
        except MalformedRecord as exc:
            self._malformed(record, str(exc))
            return False
        except Exception as exc:  # RecursionError (deep nesting), OverflowError, TypeError, ...
            self._malformed(record, f"undecodable: {exc!r}"[:300])
            return False
        failure: Exception | None = None
        for span in spans:
            try:
                event = extract(span, traces)
                textless = textless_model_call(span, event)
                if textless is not None:
                    self._textless(span, textless, event)
                if event is None:
                    continue
                if event.feedback is not None:
                    self._feedback(event, now)
                hold = self.store.apply(event, partition, record.offset, now)
                if hold is not None:
                    self.offsets.hold(hold, partition, record.offset)
            except Exception as exc:  # one bad span never costs the rest of the record
                failure = failure or exc
        if failure is not None:
            self._malformed(record, f"a span could not be read: {failure!r}"[:300])
            return False
        self.prometheus.record_records("ok")
        return True

    def _textless(self, span: Any, convention: Convention, event: ConversationEvent | None) -> None:
        self.textless.seen(span, convention, event)

    def _feedback(self, event: ConversationEvent, now: float) -> None:
        assert event.feedback is not None
        store = self.store
        known = store.open.get(event.conversation_id) or store.judging.get(event.conversation_id)
        known = known or store.done.get(event.conversation_id)
        agent = event.agent or (known.agent if known is not None else None) or "unknown"
        self.prometheus.record_feedback(agent, negative=event.feedback.negative)
        if self.feedback is not None:
            self.feedback.feedback(event.conversation_id, agent, event.feedback, now)

    def _malformed(self, record: Any, reason: str) -> None:
        self.prometheus.record_records("malformed")
        self._malformed_log.warning(
            "malformed record at partition %d offset %d: %s", record.partition, record.offset, reason
        )
        if self.dead_letter is not None:
            headers = [
                ("tracejudge.error", reason.encode("utf-8", "replace")[:1000]),
                ("tracejudge.source", f"{record.topic}/{record.partition}/{record.offset}".encode()),
            ]
            self.dead_letter.write(record.key, record.value or b"", headers)

    def expire(self, now: float) -> None:
        """Complete conversations idle at `now`; empty ones are dropped and their holds released."""
        for key in self.store.expire_idle(now):
            self.offsets.release(key)

    def ready(self) -> list[JudgeJob]:
        """Snapshots of the conversations completed since the last call (unreadable ones dropped, holds released)."""
        jobs = self.store.take_ready()
        for key in self.store.take_unreadable():
            self.offsets.release(key)
        return jobs

    def finished(self, judgement: Judgement) -> None:
        """Its outputs are durable: the conversation's hold goes, so the commit can move past it."""
        job = judgement.job
        again = self.store.finished(job, judged=judgement.outcome in (OUTCOME_JUDGED, OUTCOME_FAILED))
        if again is not None and again.hold_offset is not None:  # late negative feedback: judged now, still held
            self.offsets.hold(again.key, again.partition, again.hold_offset)
        self.offsets.release(job.key)

    def revoke(self, partitions: set[int]) -> None:
        """Partitions revoked: their conversations and holds go (the new owner re-reads them)."""
        for key in self.store.drop_partitions(partitions):
            self.offsets.release(key)
        self.offsets.forget_partitions(partitions)
