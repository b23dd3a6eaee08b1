"""Conversation assembly: turns by conversation id, de-duplicated, completed by end marker, idle timeout or cap.

Only the poll thread touches a SessionStore; the judge pool gets immutable JudgeJob snapshots.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

from .adapters import ConversationEvent, Feedback, Turn

MAX_FIELD_CHARS = 16_000
_generation = itertools.count(1)


@dataclass(frozen=True, slots=True)
class JudgeJob:
    """An immutable snapshot of a complete conversation, handed to the judge pool."""

    key: str
    conversation_id: str
    agent: str
    partition: int
    version: int
    turns: tuple[Turn, ...]
    has_error: bool
    negative_feedback: bool
    truncated: bool
    completed_by: str

    @property
    def turn_count(self) -> int:
        return self.version

    @property
    def last_turn(self) -> Turn:
        return self.turns[-1]

    @property
    def judgeable_turns(self) -> tuple[Turn, ...]:
        return tuple(t for t in self.turns if t.judgeable)


@dataclass(slots=True)
class Conversation:
    id: str
    partition: int
    agent: str | None
    last_seen: float
    hold_offset: int | None
    key: str
    turns: dict[str, Turn] = field(default_factory=dict)
    ended: bool = False
    truncated: bool = False
    negative_feedback: bool = False
    judged: bool = False
    feedback: list[Feedback] = field(default_factory=list)

    def turn_count(self) -> int:
        indices = [t.index for t in self.turns.values() if t.index is not None]
        counted = len(self.turns)
        return max(counted, max(indices) + 1) if indices else counted

    def snapshot(self, completed_by: str) -> JudgeJob:
        ordered = sorted(self.turns.values(), key=lambda t: (t.start_ns, t.index or 0))
        top_level_ids = {t.span_id for t in ordered}
        # A turn nested inside another turn of the same conversation (an LLM call inside the agent turn) is not a turn.
        turns = tuple(t for t in ordered if t.parent_span_id not in top_level_ids) or tuple(ordered)
        return JudgeJob(
            key=self.key,
            conversation_id=self.id,
            agent=self.agent or "unknown",
            partition=self.partition,
            version=self.turn_count(),
            turns=turns,
            has_error=any(t.is_error for t in turns),
            negative_feedback=self.negative_feedback,
            truncated=self.truncated,
            completed_by=completed_by,
        )


def _clip(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_FIELD_CHARS:
        return text
    return f"{text[:MAX_FIELD_CHARS]} …[{len(text) - MAX_FIELD_CHARS} characters truncated]"


@dataclass
class StoreCounts:
    duplicate_spans: int = 0
    truncated_conversations: int = 0
    dropped_empty: int = 0


class SessionStore:
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
        self.ready: list[JudgeJob] = []
        self.counts = StoreCounts()

    def __len__(self) -> int:
        return len(self.open)

    @property
    def over_capacity(self) -> bool:
        return len(self.open) >= self.max_open

    def apply(self, event: ConversationEvent, partition: int, offset: int, now: float) -> str | None:
        """Fold one event in; returns the key of a conversation that now needs an offset hold, if any."""
        cid = event.conversation_id
        conversation = self.open.get(cid)
        new_hold: str | None = None
        if conversation is None:
            previous = self.judging.get(cid) or self.done.get(cid)
            if event.turn is not None and previous is not None and event.turn.span_id in previous.turns:
                self.counts.duplicate_spans += 1  # a redelivered turn of a judged conversation: nothing new
                return None
            if event.turn is None and previous is not None:
                if event.feedback is None:
                    return None  # an end marker for a conversation already complete
                self._add_feedback(previous, event.feedback)
                if not (event.feedback.negative and not previous.judged and self.done.get(cid) is previous):
                    return None
                # Negative feedback on a conversation that was not judged (sampled out, over budget): judge it now.
                again = Conversation(
                    id=cid,
                    key=f"{cid}#{next(_generation)}",
                    partition=partition,
                    agent=previous.agent or event.agent,
                    last_seen=now,
                    hold_offset=offset,
                    turns=dict(previous.turns),
                    ended=True,
                    negative_feedback=True,
                    feedback=list(previous.feedback),
                )
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
            if previous is not None:  # it continues after its judgement: a new version with all turns so far
                # ...unless the turn cap cut it: then the next window starts empty, so memory stays bounded.
                conversation.turns = {} if previous.truncated else dict(previous.turns)
                conversation.agent = conversation.agent or previous.agent
                conversation.negative_feedback = previous.negative_feedback
                self.done.pop(cid, None)
            self.open[cid] = conversation
            new_hold = conversation.key
        else:
            self.open.move_to_end(cid)
            conversation.last_seen = now
        if event.agent and not conversation.agent:
            conversation.agent = event.agent
        if event.feedback is not None:
            self._add_feedback(conversation, event.feedback)
        if event.turn is not None:
            turn = event.turn
            if turn.span_id in conversation.turns:
                self.counts.duplicate_spans += 1
            else:
                turn.input, turn.output = _clip(turn.input), _clip(turn.output)
                conversation.turns[turn.span_id] = turn
        if event.ended:
            conversation.ended = True
        if conversation.turns and (conversation.ended or len(conversation.turns) >= self.max_turns):
            if len(conversation.turns) >= self.max_turns and not conversation.ended:
                conversation.truncated = True
                self.counts.truncated_conversations += 1
            self._complete(conversation, "end_marker" if conversation.ended else "turn_cap")
        return new_hold

    @staticmethod
    def _add_feedback(conversation: Conversation, feedback: Feedback) -> None:
        if len(conversation.feedback) < 100:
            conversation.feedback.append(feedback)
        if feedback.negative:
            conversation.negative_feedback = True

    def complete(self, conversation_id: str, completed_by: str) -> None:
        """Complete an open conversation now (backfill decides idleness from record timestamps)."""
        conversation = self.open.get(conversation_id)
        if conversation is not None and conversation.turns:
            self._complete(conversation, completed_by)

    def _complete(self, conversation: Conversation, completed_by: str) -> None:
        self.open.pop(conversation.id, None)
        self.judging[conversation.id] = conversation
        self.ready.append(conversation.snapshot(completed_by))

    def expire_idle(self, now: float) -> list[str]:
        """Complete conversations idle past the timeout; returns keys of empty ones dropped (release their holds)."""
        released: list[str] = []
        while self.open:
            cid, conversation = next(iter(self.open.items()))
            if now - conversation.last_seen < self.idle_timeout_s:
                break
            if conversation.turns:
                self._complete(conversation, "idle_timeout")
            else:
                self.open.pop(cid)
                self.counts.dropped_empty += 1
                released.append(conversation.key)
        return released

    def take_ready(self) -> list[JudgeJob]:
        ready, self.ready = self.ready, []
        return ready

    def finished(self, job: JudgeJob, judged: bool = True) -> None:
        """The job is over (judged, failed, sampled out or skipped): keep it briefly for continuations."""
        conversation = self.judging.pop(job.conversation_id, None)
        if conversation is None or conversation.key != job.key:
            if conversation is not None:
                self.judging[job.conversation_id] = conversation
            return
        conversation.judged = judged
        self.done[conversation.id] = conversation
        while len(self.done) > self.max_done:
            self.done.popitem(last=False)

    def drop_partitions(self, partitions: set[int]) -> list[str]:
        """Partitions revoked: forget their open conversations (the new owner re-reads them); returns hold keys."""
        dropped = [c for c in self.open.values() if c.partition in partitions]
        for conversation in dropped:
            del self.open[conversation.id]
        for cid in [cid for cid, c in self.done.items() if c.partition in partitions]:
            del self.done[cid]
        self.ready = [job for job in self.ready if job.partition not in partitions]
        return [c.key for c in dropped]
