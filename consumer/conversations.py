"""Conversation assembly: turn spans by conversation id, de-duplicated, completed by end marker, idle timeout or cap.

Only the poll thread (or backfill's reading thread) changes a ConversationStore, and the rebalance listener while the
poll thread waits in `poll()`; the judge pool gets immutable JudgeJob snapshots.

A conversation's lifecycle: open → completing (in `ready`, not yet dispatched) → judging (dispatched: being judged,
sampled out or skipped for budget, its outputs not yet durable) → done (kept in a bounded LRU of `max_done`, with its
spans). Negative feedback for a conversation that was not judged leads to exactly one judgement in every state:
open and completing (the snapshot is taken at dispatch, so it carries the feedback), judging (`finished()` re-completes
a conversation that was not judged), done and not judged (`apply()` re-completes it). A judged conversation is not
judged again for feedback. Past the LRU (the oldest `max_done` completed conversations), late feedback finds nothing.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from tracejudge._shared.text import clip

from .adapters import ConversationEvent, Feedback, Turn
from .conversation.identity import content_id
from .conversation.job import MAX_FIELD_CHARS, JudgeJob, version_of
from .exchanges import exchanges

logger = logging.getLogger("tracejudge.consumer.conversations")
MAX_SPANS_PER_TURN = 4  # turn spans kept per turn of the cap (nested spans of one exchange) before it cuts
_generation = itertools.count(1)


@dataclass(slots=True)
class Conversation:
    id: str
    partition: int
    agent: str | None
    last_seen: float
    hold_offset: int | None
    key: str
    spans: dict[str, Turn] = field(default_factory=dict)  # turn spans by span id: nested ones and all (not exchanges)
    ended: bool = False
    truncated: bool = False
    negative_feedback: bool = False
    judged: bool = False
    feedback: list[Feedback] = field(default_factory=list)
    agent_named: bool = False
    next_cap_check: int = 0  # span count at which the turn cap counts exchanges again (see ConversationStore)

    def turn_count(self, said: Sequence[Turn] | None = None) -> int:
        """Real exchanges (nested and duplicate spans are not turns); turn indices cover turns before a restart."""
        return version_of(exchanges(self.spans.values()) if said is None else said)

    def snapshot(self, completed_by: str) -> JudgeJob:
        said = tuple(exchanges(self.spans.values()))  # nesting decided by content: see exchanges.py
        return JudgeJob(
            content_id=content_id(self.id, said),
            key=self.key,
            conversation_id=self.id,
            agent=self.agent or "unknown",
            partition=self.partition,
            version=self.turn_count(said),
            exchanges=said,
            has_error=any(t.is_error for t in said),
            negative_feedback=self.negative_feedback,
            truncated=self.truncated,
            completed_by=completed_by,
        )


@dataclass
class ConversationCounts:
    """What the store dropped or cut, for tests and benchmarks (`ConversationStore.counts`)."""

    duplicate_spans: int = 0
    truncated_conversations: int = 0
    dropped_empty: int = 0
    unreadable: int = 0  # conversations whose snapshot raised: dropped, their holds released


class ConversationStore:
    """Open conversations (by last activity), those being judged, and recently judged ones (for continuations)."""

    def __init__(
        self,
        *,
        idle_timeout_s: float = 300.0,
        max_open: int = 100_000,
        max_turns: int = 1_000,
        max_done: int = 10_000,
    ) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.max_open = max_open
        self.max_turns = max_turns
        self.max_done = max_done
        self.open: OrderedDict[str, Conversation] = OrderedDict()
        self.judging: dict[str, Conversation] = {}
        self.done: OrderedDict[str, Conversation] = OrderedDict()
        self._ready: list[tuple[Conversation, str]] = []
        self._unreadable: list[str] = []
        self.counts = ConversationCounts()

    def __len__(self) -> int:
        return len(self.open)

    @property
    def over_capacity(self) -> bool:
        return len(self.open) >= self.max_open

    def apply(self, event: ConversationEvent, partition: int, offset: int, now: float) -> str | None:
        """Fold one event in; returns the key of a conversation that now needs an offset hold, if any."""
        cid = event.conversation_id
        conversation = self.open.get(cid)
        if conversation is not None and conversation.spans and now - conversation.last_seen >= self.idle_timeout_s:
            # Idle before this event came: complete it first, so idleness is decided by the conversation's own
            # clock (wall time live, record timestamps in backfill), never by when `expire_idle` happened to run.
            self._complete(conversation, "idle_timeout")
            conversation = None
        new_hold: str | None = None
        if conversation is None:
            previous = self.judging.get(cid) or self.done.get(cid)
            if event.turn is not None and previous is not None and event.turn.span_id in previous.spans:
                self.counts.duplicate_spans += 1  # a redelivered turn of a judged conversation: nothing new
                return None
            if event.turn is None and previous is not None:
                if event.feedback is None:
                    return None  # an end marker for a conversation already complete
                self._add_feedback(previous, event.feedback)
                if not (event.feedback.negative and not previous.judged and self.done.get(cid) is previous):
                    return None  # judging: `finished()` decides; judged: feedback joins the verdict, no second call
                # Negative feedback on a conversation that was not judged (sampled out, over budget): judge it now.
                # Its hold is the feedback record: the earlier records may already be committed.
                again = self._again(previous, partition, offset, now)
                again.agent = again.agent or event.agent
                self.done.pop(cid, None)
                self._complete(again, "negative_feedback")
                return again.key
            conversation = Conversation(
                id=cid,
                key=f"{cid}#{next(_generation)}",
                partition=partition,
                agent=event.agent,
                last_seen=now,
                hold_offset=offset,
            )
            if previous is not None:  # it continues after its judgement: a new version with all its spans so far
                # ...unless the turn cap cut it: then the next window starts empty, so memory stays bounded.
                conversation.spans = {} if previous.truncated else dict(previous.spans)
                conversation.agent = conversation.agent or previous.agent
                conversation.negative_feedback = previous.negative_feedback
                self.done.pop(cid, None)
            self.open[cid] = conversation
            new_hold = conversation.key
        else:
            self.open.move_to_end(cid)
            conversation.last_seen = max(conversation.last_seen, now)  # backfill: timestamps only roughly ordered
        if event.agent and (not conversation.agent or (event.agent_named and not conversation.agent_named)):
            # A named agent (gen_ai.agent.name, the framework's) beats the service.name a child span fell back to.
            conversation.agent, conversation.agent_named = event.agent, event.agent_named
        if event.feedback is not None:
            self._add_feedback(conversation, event.feedback)
        if event.turn is not None:
            turn = event.turn
            if turn.span_id in conversation.spans:
                self.counts.duplicate_spans += 1
            else:
                # Surrounding whitespace is nobody's words (Strands' str(AgentResult) ends in a newline).
                turn.input = None if turn.input is None else clip(turn.input.strip(), MAX_FIELD_CHARS) or None
                turn.output = None if turn.output is None else clip(turn.output.strip(), MAX_FIELD_CHARS) or None
                conversation.spans[turn.span_id] = turn
        if event.ended:
            conversation.ended = True
        if conversation.spans and (conversation.ended or self._at_turn_cap(conversation)):
            if not conversation.ended:
                conversation.truncated = True
                self.counts.truncated_conversations += 1
            self._complete(conversation, "end_marker" if conversation.ended else "turn_cap")
        return new_hold

    def _at_turn_cap(self, conversation: Conversation) -> bool:
        """The cap counts exchanges, not spans (an agent span around an LLM span is one turn). Counting is not free,
        so it is redone only once enough spans came to possibly reach the cap (at least an eighth more spans: a
        stream of spans that add no exchange costs O(log n) counts); past MAX_SPANS_PER_TURN x cap spans, memory wins.
        """
        seen = len(conversation.spans)
        if seen < self.max_turns or seen < conversation.next_cap_check:
            return False
        if seen >= self.max_turns * MAX_SPANS_PER_TURN:
            return True
        counted = len(exchanges(conversation.spans.values()))
        if counted >= self.max_turns:
            return True
        conversation.next_cap_check = seen + max(self.max_turns - counted, seen // 8)
        return False

    @staticmethod
    def _add_feedback(conversation: Conversation, feedback: Feedback) -> None:
        if len(conversation.feedback) < 100:
            conversation.feedback.append(feedback)
        if feedback.negative:
            conversation.negative_feedback = True

    def _complete(self, conversation: Conversation, completed_by: str) -> None:
        self.open.pop(conversation.id, None)
        self.judging[conversation.id] = conversation
        self._ready.append((conversation, completed_by))

    def expire_idle(self, now: float) -> list[str]:
        """Complete conversations idle past the timeout; returns keys of empty ones dropped (release their holds)."""
        released: list[str] = []
        while self.open:
            cid, conversation = next(iter(self.open.items()))
            if now - conversation.last_seen < self.idle_timeout_s:
                break
            if conversation.spans:
                self._complete(conversation, "idle_timeout")
            else:
                self.open.pop(cid)
                self.counts.dropped_empty += 1
                released.append(conversation.key)
        return released

    def take_ready(self) -> list[JudgeJob]:
        """Snapshots of the completed conversations, taken now: feedback that came while they waited is in them.

        A conversation whose snapshot raises is dropped (nothing may stop the consumer); see `take_unreadable()`.
        """
        ready, self._ready = self._ready, []
        jobs: list[JudgeJob] = []
        for conversation, completed_by in ready:
            try:
                jobs.append(conversation.snapshot(completed_by))
            except Exception:
                logger.exception("conversation %r could not be assembled: dropped", conversation.id)
                self.counts.unreadable += 1
                if self.judging.get(conversation.id) is conversation:
                    del self.judging[conversation.id]
                self._unreadable.append(conversation.key)
        return jobs

    def take_unreadable(self) -> list[str]:
        """Hold keys of the conversations dropped because they could not be assembled (release them)."""
        dropped, self._unreadable = self._unreadable, []
        return dropped

    def finished(self, job: JudgeJob, judged: bool = True) -> Conversation | None:
        """The job is over (judged, failed, sampled out or skipped): keep it for continuations and late feedback.

        Negative feedback that arrived after the snapshot, on a job that was not judged, re-completes the conversation
        at once (completed_by `negative_feedback`); it is returned so the caller holds its offset (the conversation's
        first record) before releasing the finished job's hold.
        """
        conversation = self.judging.pop(job.conversation_id, None)
        if conversation is None or conversation.key != job.key:
            if conversation is not None:
                self.judging[job.conversation_id] = conversation
            return None
        conversation.judged = judged
        if (
            conversation.negative_feedback
            and not judged
            and not job.negative_feedback
            and job.conversation_id not in self.open
        ):
            again = self._again(conversation, conversation.partition, conversation.hold_offset, conversation.last_seen)
            self._complete(again, "negative_feedback")
            return again
        self.done[conversation.id] = conversation
        while len(self.done) > self.max_done:
            self.done.popitem(last=False)
        return None

    @staticmethod
    def _again(previous: Conversation, partition: int, offset: int | None, now: float) -> Conversation:
        """A new version of a completed, unjudged conversation, to judge it for negative feedback."""
        return Conversation(
            id=previous.id,
            key=f"{previous.id}#{next(_generation)}",
            partition=partition,
            agent=previous.agent,
            last_seen=now,
            hold_offset=offset,
            spans=dict(previous.spans),
            ended=True,
            negative_feedback=True,
            feedback=list(previous.feedback),
        )

    def drop_partitions(self, partitions: set[int]) -> list[str]:
        """Partitions revoked: forget their conversations, open, completed or being judged (the new owner re-reads
        them); returns the hold keys of those not dispatched. One left in `judging` would make its records, re-read
        if the partition comes back, look like duplicates: never judged again, committed past."""
        dropped = [c for c in self.open.values() if c.partition in partitions]
        for conversation in dropped:
            del self.open[conversation.id]
        for cid in [cid for cid, c in self.done.items() if c.partition in partitions]:
            del self.done[cid]
        dropped += [c for c, _ in self._ready if c.partition in partitions]
        self._ready = [(c, by) for c, by in self._ready if c.partition not in partitions]
        for cid in [cid for cid, c in self.judging.items() if c.partition in partitions]:
            del self.judging[cid]  # a job in the pool still finishes (and emits); `finished()` then finds nothing
        return [c.key for c in dropped]
