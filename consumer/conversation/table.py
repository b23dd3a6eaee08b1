"""One state partition's conversations: the state machine a Kafka record's events drive, with no Kafka in it.

A conversation is the unit of durable state (as a Kafka Streams key-value store): the runtime writes every changed
conversation to a compacted changelog (`take_changes()`) and restores the table from it (`restore()`) before
processing a partition's records, so a rebalance, a restart or a replay never loses or fragments a conversation.
Everything here is deterministic in the events and their record timestamps: replaying the same records (after a
restart, or in backfill) cuts the same conversations and gives the same content ids.

Lifecycle: open → completed (end marker, idle in record time, the turn cap, or the memory bound) → dispatched to
the judges (a snapshot with a content id) → an outcome comes back (`verdict()`) → kept for `retention_s` for
continuations (a later turn reopens it with its whole history) and late feedback → forgotten (a tombstone).
Every span id seen is remembered while the conversation is kept: a redelivered span is never a new turn.

Beyond memory (`store`): a clean conversation (its state as the last commit wrote it to the changelog and the local
store) may leave memory (`spill_open`, `spill_oldest`) and is read back from the store when an event, a verdict or
the clock needs it; the table keeps only its id in its orderings. A dirty one stays until the next commit wrote it
(`stored`): the store never holds a state the changelog lacks, so store and checkpoint stay a valid restore point.

Negative feedback on a conversation whose last snapshot was not judged (sampled out, skipped for budget) completes
it again, forced; while that snapshot's outcome is unknown the decision waits for `verdict()`.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

from tracejudge._shared.text import clip

from ..adapters import ConversationEvent, Feedback, Turn
from ..exchanges import exchanges
from .identity import content_id
from .job import MAX_FIELD_CHARS, JudgeJob, version_of

logger = logging.getLogger("tracejudge.consumer.conversation")

OPEN, COMPLETED = "open", "completed"
JUDGED_OUTCOMES = frozenset({"judged", "failed"})
RETRYING = "retrying"  # judgement.OUTCOME_RETRYING: not final, a later attempt's outcome follows
_SPAN_OVERHEAD = 200  # bytes a kept span costs beyond its text (ids, times, dict slots): an estimate, for the bound
_STATE_OVERHEAD = 600
NO_IDS: frozenset[str] = frozenset()


def _as_list(items: Sequence[Any]) -> list[Any]:
    return items if isinstance(items, list) else list(items)


def dropped_lookup(span_ids: Sequence[str]) -> AbstractSet[str]:
    """The lookup set of a state's dropped span ids (the shared empty one when there are none)."""
    return set(span_ids) if span_ids else NO_IDS


MAX_FEEDBACK = 100
MAX_DROPPED_IDS = 10_000  # span ids remembered per conversation beyond its kept spans (duplicates detection)
MAX_DISPATCHED = 64  # content ids remembered per conversation (its judged versions)
_FIELDS = {kind: tuple(f.name for f in fields(kind)) for kind in (Turn, Feedback)}


def plain(item: Turn | Feedback) -> dict[str, Any]:
    """A turn or feedback as a dict: `dataclasses.asdict` without its recursive deep copy (every field is a str,
    number, bool or None), which was the largest cost of writing a state to the changelog."""
    return {name: getattr(item, name) for name in _FIELDS[type(item)]}


@dataclass(slots=True)
class ConversationState:
    """What the judges will need of a conversation, and what it has been through; serialisable for the changelog."""

    id: str
    first_ms: int
    last_ms: int
    agent: str | None = None
    agent_named: bool = False
    spans: dict[str, Turn] = field(default_factory=dict)  # turn spans by span id (the changelog's key: "turns")
    # Spans cut from `spans` by the bound, still seen. It and `feedback` are the shared empty tuple until their first
    # item (an empty list costs 56 bytes, and most conversations never have one): a list from then on.
    dropped_span_ids: Sequence[str] = ()
    status: str = OPEN
    ended: bool = False
    completed_by: str | None = None
    truncated: bool = False
    negative_feedback: bool = False
    feedback: Sequence[Feedback] = ()
    dispatched: dict[str, str | None] = field(default_factory=dict)  # content id → outcome (None: not known yet)
    rejudge_on_outcome: bool = False  # negative feedback came while the last snapshot's outcome was unknown
    completed_ms: int | None = None
    reordered: bool = False  # some event came another way than its partition's own order (e.g. keyed by trace id)
    end_due_ms: int | None = None  # an end marker that waits for turns still being routed
    size: int = _STATE_OVERHEAD
    # dropped_span_ids, for lookups: one shared empty set until a span is dropped (an empty set costs 216 bytes, an
    # eighth of a one-turn conversation, and most conversations never drop one)
    _dropped: AbstractSet[str] = field(default=NO_IDS, repr=False, compare=False)

    def seen(self, span_id: str) -> bool:
        return span_id in self.spans or span_id in self._dropped

    def drop_ids(self, span_ids: list[str]) -> None:
        if not span_ids:
            return
        self.dropped_span_ids = ids = _as_list(self.dropped_span_ids)
        ids.extend(span_ids)
        if isinstance(self._dropped, set):
            self._dropped.update(span_ids)
        else:  # the first drop: the shared empty set is replaced, never changed
            self._dropped = set(self.dropped_span_ids)

    def forget_oldest_ids(self, count: int) -> None:
        if isinstance(self._dropped, set):
            self._dropped.difference_update(self.dropped_span_ids[:count])
        self.dropped_span_ids = _as_list(self.dropped_span_ids[count:])
        if not self.dropped_span_ids:  # all forgotten: the shared empties again, as a state read back has them
            self.dropped_span_ids, self._dropped = (), NO_IDS

    @property
    def last_content_id(self) -> str | None:
        return next(reversed(self.dispatched), None) if self.dispatched else None

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__slots__ if name not in ("spans", "feedback", "_dropped")}  # type: ignore[attr-defined]
        data["turns"] = [plain(turn) for turn in self.spans.values()]
        data["feedback"] = [plain(item) for item in self.feedback]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ConversationState:
        values = dict(data)
        spans = [Turn(**turn) for turn in values.pop("turns", [])]
        feedback = [Feedback(**item) for item in values.pop("feedback", [])]
        known = set(cls.__slots__) - {"_dropped"}  # type: ignore[attr-defined]
        state = cls(**{k: v for k, v in values.items() if k in known})
        state.shared_empties()
        state.spans = {turn.span_id: turn for turn in spans}
        state.feedback = feedback or ()
        return state

    def shared_empties(self) -> None:
        """A state read back holds the shared empty tuple and set where it has no dropped ids or feedback, as a new
        one does (the formats carry empty lists)."""
        self.dropped_span_ids = self.dropped_span_ids or ()
        self.feedback = self.feedback or ()
        self._dropped = dropped_lookup(self.dropped_span_ids)


def _utf8(text: str | None) -> int:
    return len(text.encode("utf-8", "surrogatepass")) if text else 0


def _turn_size(turn: Turn) -> int:
    """Bytes as the changelog will carry the text (UTF-8), plus an overhead estimate: the bound that keeps a
    conversation's state record well under the brokers' 1 MB record limit."""
    return _SPAN_OVERHEAD + _utf8(turn.input) + _utf8(turn.output)


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A completed conversation to judge: the snapshot and when (record time) it completed."""

    job: JudgeJob
    completed_ms: int


class SpillStore(Protocol):
    """Where conversations that left memory are read back from (`store.LocalStore`)."""

    def get(self, conversation_id: str) -> ConversationState | None: ...


class MemoryBound:
    """Bytes held by every table of the process (shared), against `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0

    @property
    def over(self) -> bool:
        return self.used > self.max_bytes


class TableOptions(Protocol):
    """The options that decide what a conversation is (`Settings` has them; no import: Settings knows Kafka)."""

    session_idle_timeout: float
    max_turns_per_conversation: int
    max_conversation_bytes: int
    state_retention: float
    end_grace: float


class ConversationTable:
    """The conversations of one state partition. Only one thread drives a table (its partition's task)."""

    def __init__(
        self,
        *,
        idle_timeout_s: float = 300.0,
        max_turns: int = 1_000,
        max_bytes: int = 262_144,
        retention_s: float = 86_400.0,
        end_grace_s: float = 2.0,
        memory: MemoryBound | None = None,
        store: SpillStore | None = None,
    ) -> None:
        self.idle_ms = int(idle_timeout_s * 1000)
        self.max_turns = max_turns
        self.max_bytes = max_bytes
        self.retention_ms = int(retention_s * 1000)
        self.end_grace_ms = int(end_grace_s * 1000)
        self._ending: dict[str, int] = {}  # conversation id → when its end marker completes it
        self.memory = memory or MemoryBound(1 << 62)
        self.states: dict[str, ConversationState] = {}  # those in memory
        self.store = store
        self._spilled: set[str] = set()  # in the store only
        self._spilled_open = 0  # of which open
        self._unstored: set[str] = set()  # in memory, changed since the store last got them
        self._unstored_removed: set[str] = set()  # forgotten, their deletion not yet in the store (a write failed)
        self._open: OrderedDict[str, None] = OrderedDict()  # by last activity (record time, roughly ordered)
        self._completed: OrderedDict[str, None] = OrderedDict()  # by completion
        self._dirty: set[str] = set()
        self._removed: set[str] = set()
        self._outbox: list[Dispatch] = []
        self.counts: Counter[str] = Counter()

    @classmethod
    def from_settings(
        cls, settings: TableOptions, memory: MemoryBound, store: SpillStore | None = None
    ) -> ConversationTable:
        """A table with the options that decide what a conversation is: the live consumer and backfill alike."""
        return cls(
            idle_timeout_s=settings.session_idle_timeout,
            max_turns=settings.max_turns_per_conversation,
            max_bytes=settings.max_conversation_bytes,
            retention_s=settings.state_retention,
            end_grace_s=settings.end_grace,
            memory=memory,
            store=store,
        )

    # -- reading ---------------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.states) + len(self._spilled)

    @property
    def open_count(self) -> int:
        return len(self._open)

    @property
    def resident_open_count(self) -> int:
        """Open conversations held in memory (the others wait in the store)."""
        return len(self._open) - self._spilled_open

    @property
    def spilled_count(self) -> int:
        return len(self._spilled)

    def get(self, conversation_id: str) -> ConversationState | None:
        """The conversation as it stands (read from the store if it left memory; it stays there)."""
        state = self.states.get(conversation_id)
        if state is None and conversation_id in self._spilled and self.store is not None:
            return self.store.get(conversation_id)
        return state

    def _resident(self, conversation_id: str) -> ConversationState | None:
        """The conversation in memory, read back from the store if it left (None: the table does not hold it)."""
        state = self.states.get(conversation_id)
        if state is not None or conversation_id not in self._spilled:
            return state
        assert self.store is not None
        state = self.store.get(conversation_id)
        self._unspill(conversation_id)
        if state is None:  # the store lost it (it cannot: written before it left); forgotten, counted
            self.counts["spilled_lost"] += 1
            self._open.pop(conversation_id, None)
            self._completed.pop(conversation_id, None)
            self._ending.pop(conversation_id, None)
            return None
        self.states[conversation_id] = state
        self.memory.used += state.size
        self.counts["read_back"] += 1
        return state

    # -- events ----------------------------------------------------------------------------------------------------

    def apply(self, event: ConversationEvent, ts_ms: int, *, ordered: bool = True) -> None:
        """Fold one event in at record time `ts_ms`. `ordered`: it came in its conversation's own order (a record
        keyed by conversation id, read where it was written); when any event of a conversation did not, its end
        marker waits `end_grace_s` for turns still being routed from other partitions."""
        cid = event.conversation_id
        state = self._resident(cid)
        if state is not None and state.status == OPEN and state.spans and ts_ms - state.last_ms >= self.idle_ms:
            self._complete(state, "idle_timeout", state.last_ms + self.idle_ms)  # idle before this event came
        if event.turn is not None and state is not None and state.seen(event.turn.span_id):
            self.counts["duplicate_spans"] += 1
            if event.feedback is None:
                return
        if state is None:
            if event.turn is None and event.feedback is None and ordered:
                return  # an end marker read after its conversation's turns, which this table no longer holds
            # A routed end marker may come before the turns it ends (they wait in a partition read later): it is
            # held, spanless, and ends them by its own time once they came (or is forgotten at the idle timeout).
            state = ConversationState(id=cid, first_ms=ts_ms, last_ms=ts_ms)
            self.states[cid] = state
            self.memory.used += state.size
            self._open[cid] = None
        elif state.status == COMPLETED:
            if event.feedback is not None:
                self._feedback(state, event.feedback, ts_ms)
            if event.turn is None or state.seen(event.turn.span_id):
                self._touch(state)
                return  # an end marker or feedback for a completed conversation
            self._reopen(state)  # a continuation: a new version with its whole history
        else:
            self._open.move_to_end(cid)
        state.last_ms = max(state.last_ms, ts_ms)
        if event.agent and (not state.agent or (event.agent_named and not state.agent_named)):
            state.agent, state.agent_named = event.agent, event.agent_named
        if event.feedback is not None and state.status == OPEN:
            self._add_feedback(state, event.feedback)
        if event.turn is not None and not state.seen(event.turn.span_id):
            self._add_turn(state, event.turn)
        if not ordered:
            state.reordered = True
        if event.ended:
            state.ended = True
        self._touch(state)
        if state.ended and state.reordered and (self.end_grace_ms > 0 or not state.spans):
            if state.end_due_ms is None:  # by the end marker's time (a turn after it never moves it)
                state.end_due_ms = ts_ms + self.end_grace_ms
                self._ending[cid] = state.end_due_ms
        elif state.spans and state.ended:
            self._complete(state, "end_marker", ts_ms)
        elif len(state.spans) >= self.max_turns and len(exchanges(state.spans.values())) >= self.max_turns:
            state.truncated = True
            self.counts["truncated_conversations"] += 1
            self._complete(state, "turn_cap", ts_ms)

    def verdict(self, conversation_id: str, cid_content: str, outcome: str, ts_ms: int) -> None:
        """The judges' outcome for a snapshot (judged, failed, sampled out, skipped for budget). The outcome it
        already has (a replayed verdict) changes nothing: nothing to write."""
        state = self._resident(conversation_id)
        if state is None or state.dispatched.get(cid_content, outcome) == outcome:
            return
        state.dispatched[cid_content] = outcome
        self._touch(state)
        if outcome == RETRYING:
            return  # not final: negative feedback waiting for the outcome keeps waiting
        if (
            state.rejudge_on_outcome
            and outcome not in JUDGED_OUTCOMES
            and state.status == COMPLETED
            and cid_content == state.last_content_id
        ):
            state.rejudge_on_outcome = False
            self._dispatch(state, "negative_feedback", ts_ms, force=True)
        elif outcome in JUDGED_OUTCOMES and cid_content == state.last_content_id:
            state.rejudge_on_outcome = False

    def advance(self, now_ms: int, upstream_ms: int | None = None) -> None:
        """The partition's clock moved to `now_ms`: complete idle conversations, forget those past retention.

        `upstream_ms` is how far every other partition has routed its records here (the least of their watermarks):
        a conversation with events routed from elsewhere completes by that clock, so a turn still on its way from a
        lagging or reassigned partition is never cut off."""
        routed_ms = now_ms if upstream_ms is None else min(now_ms, upstream_ms)
        for cid, due in list(self._ending.items()):
            if due > now_ms:
                continue
            ending = self.get(cid)
            clock = routed_ms if ending is not None and ending.reordered else now_ms
            if due <= clock:
                del self._ending[cid]
                # Spanless still once every source passed its time: a stray end marker (its turns completed and
                # forgotten long ago), left to the idle timeout.
                if ending is not None and ending.status == OPEN and ending.end_due_ms is not None and ending.spans:
                    ending = self._resident(cid)
                    if ending is not None:
                        self._complete(ending, "end_marker", due)
        waiting: list[str] = []  # idle by this partition's clock, not yet by the routed one
        while self._open:
            cid = next(iter(self._open))
            peeked = self.get(cid)
            if peeked is None:
                self._resident(cid)  # gone from the store: dropped from the orderings, counted
                continue
            if now_ms - peeked.last_ms < self.idle_ms:
                break
            if peeked.reordered and routed_ms - peeked.last_ms < self.idle_ms:
                waiting.append(cid)
                self._open.move_to_end(cid)
                if len(waiting) >= len(self._open):
                    break
                continue
            state = self._resident(cid)
            if state is None:
                continue
            if state.spans:
                self._complete(state, "idle_timeout", state.last_ms + self.idle_ms)
            else:  # feedback alone, never a turn
                self._forget(state, "empty")
        expired: list[ConversationState] = []
        for cid in self._completed:  # by completion time: stops at the first one still within retention
            state = self.get(cid)
            if state is None:
                continue
            if state.completed_ms is None or now_ms - state.completed_ms < self.retention_ms:
                break
            unanswered = any(outcome is None or outcome == RETRYING for outcome in state.dispatched.values())
            if unanswered and now_ms - state.completed_ms < 2 * self.retention_ms:
                continue  # its outcome is not back yet: kept a while longer, without holding up the others
            if unanswered:
                self.counts["outcomes_never_returned"] += 1
            expired.append(state)
        for state in expired:
            self._forget(state, "retention")

    def complete_oldest(self, now_ms: int) -> bool:
        """Complete the least recently active open conversation (a bound was reached and the store cannot take it);
        False when none is open."""
        state = next((self.states[cid] for cid in self._open if cid in self.states), None)
        if state is None:
            return False
        self.counts["completed_at_bound"] += 1
        if state.spans:
            self._complete(state, "memory_bound", max(now_ms, state.last_ms))
        else:
            self._forget(state, "empty")
        return True

    def take_dispatches(self) -> list[Dispatch]:
        out, self._outbox = self._outbox, []
        return out

    def take_changes(self) -> tuple[list[ConversationState], list[str]]:
        """Conversations changed and forgotten since the last call (for the changelog and the store)."""
        changed = [self.states[cid] for cid in self._dirty if cid in self.states]
        removed = list(self._removed)
        self._dirty, self._removed = set(), set()
        return changed, removed

    def unstored(self) -> list[ConversationState]:
        """Conversations in memory whose latest state the store has not got (changed, or a store write failed)."""
        return [self.states[cid] for cid in self._unstored if cid in self.states]

    def unstored_removed(self) -> list[str]:
        """Conversations forgotten whose deletion the store has not got (a store write failed): else they would come
        back from the store, as completed, after a restart."""
        return list(self._unstored_removed)

    def stored(self, conversation_ids: Iterable[str]) -> None:
        """The store now holds these conversations as they are, or no longer holds the forgotten ones (and the
        changelog too): they may leave memory."""
        for cid in conversation_ids:
            self._unstored_removed.discard(cid)
            if cid not in self._dirty:
                self._unstored.discard(cid)

    def spill_open(self, count: int) -> int:
        """Up to `count` least recently active open conversations leave memory (clean ones only); how many left."""
        return self._spill(self._open, count)

    def spill_oldest(self, count: int) -> int:
        """Up to `count` conversations leave memory, the oldest completed first, then the least recently active open
        ones (clean ones only); how many left."""
        done = self._spill(self._completed, count)
        return done + self._spill(self._open, count - done) if done < count else done

    def _spill(self, order: OrderedDict[str, None], count: int) -> int:
        if self.store is None or count <= 0:
            return 0
        done = 0
        for cid in order:
            if done >= count:
                break
            state = self.states.get(cid)
            if state is None or cid in self._unstored or cid in self._dirty:
                continue
            del self.states[cid]
            self.memory.used -= state.size
            self._spilled.add(cid)
            self._spilled_open += cid in self._open
            done += 1
        self.counts["spilled"] += done
        return done

    def restore(self, state: ConversationState | None, conversation_id: str, *, resident: bool = True) -> None:
        """A changelog record: the conversation as last written (None: forgotten). `resident=False`: it stays in
        the store, which already holds it (restoring more than the memory bounds allow)."""
        old = self.states.pop(conversation_id, None)
        if old is not None:
            self.memory.used -= old.size
        self._unspill(conversation_id)
        self._unstored.discard(conversation_id)
        self._unstored_removed.discard(conversation_id)
        self._open.pop(conversation_id, None)
        self._completed.pop(conversation_id, None)
        self._ending.pop(conversation_id, None)
        if state is None:
            return
        if resident or self.store is None:
            self.states[conversation_id] = state
            self.memory.used += state.size
        else:
            self._spilled.add(conversation_id)
            self._spilled_open += state.status == OPEN
        (self._open if state.status == OPEN else self._completed)[conversation_id] = None
        if state.status == OPEN and state.end_due_ms is not None:
            self._ending[conversation_id] = state.end_due_ms

    def restored(self, *, stored: bool) -> None:
        """The restore ended: the states read are the changelog's (and the store's, when `stored`)."""
        self.take_changes()
        if not stored and self.store is not None:
            self._unstored.update(self.states)

    def close(self) -> None:
        """The partition left this process: its memory goes (its state stays in the changelog)."""
        for state in self.states.values():
            self.memory.used -= state.size
        self.states.clear()
        self._spilled.clear()
        self._spilled_open = 0
        self._unstored.clear()
        self._unstored_removed.clear()
        self._open.clear()
        self._completed.clear()
        self._outbox.clear()
        self._ending.clear()

    # -- internals -------------------------------------------------------------------------------------------------

    def _unspill(self, conversation_id: str) -> None:
        """Out of the store-only set (before its orderings change)."""
        if conversation_id in self._spilled:
            self._spilled.remove(conversation_id)
            self._spilled_open -= conversation_id in self._open

    def _touch(self, state: ConversationState) -> None:
        self._dirty.add(state.id)
        if self.store is not None:
            self._unstored.add(state.id)
            self._unstored_removed.discard(state.id)  # back again: its state replaces the deletion

    def _add_turn(self, state: ConversationState, turn: Turn) -> None:
        # Surrounding whitespace is nobody's words (Strands' str(AgentResult) ends in a newline).
        turn.input = None if turn.input is None else clip(turn.input.strip(), MAX_FIELD_CHARS) or None
        turn.output = None if turn.output is None else clip(turn.output.strip(), MAX_FIELD_CHARS) or None
        state.spans[turn.span_id] = turn
        grown = _turn_size(turn)
        state.size += grown
        self.memory.used += grown
        # the kept spans' text: the size less the overheads and the 40 bytes each remembered dropped span id costs
        chars = state.size - _STATE_OVERHEAD - _SPAN_OVERHEAD * len(state.spans) - 40 * len(state.dropped_span_ids)
        while chars > self.max_bytes and len(state.spans) > 1:  # the judge's window: the oldest spans go first
            oldest = min(state.spans.values(), key=lambda t: (t.start_ns, t.span_id))
            del state.spans[oldest.span_id]
            state.drop_ids([oldest.span_id])
            shrink = _turn_size(oldest)
            state.size -= shrink - 40  # the id stays
            self.memory.used -= shrink - 40
            chars -= shrink - _SPAN_OVERHEAD
            state.truncated = True
            self.counts["spans_past_window"] += 1
        self._bound_dropped(state)

    def _new_window(self, state: ConversationState) -> None:
        """The judged window's spans go (their span ids stay: a redelivered one is still a duplicate)."""
        for turn in state.spans.values():
            shrink = _turn_size(turn) - 40  # the id stays
            state.size -= shrink
            self.memory.used -= shrink
        state.drop_ids(list(state.spans))
        state.spans.clear()
        self._bound_dropped(state)

    def _bound_dropped(self, state: ConversationState) -> None:
        """Dropped span ids are remembered up to MAX_DROPPED_IDS (the newest; a replay only redelivers recent spans)
        so that one endless conversation's state stays within a changelog record."""
        excess = len(state.dropped_span_ids) - MAX_DROPPED_IDS
        if excess > 0:
            state.forget_oldest_ids(excess)
            state.size -= 40 * excess
            self.memory.used -= 40 * excess
            self.counts["span_ids_forgotten"] += excess

    @staticmethod
    def _add_feedback(state: ConversationState, feedback: Feedback) -> bool:
        """False for a feedback span already folded in (a replay)."""
        if any(item.span_id == feedback.span_id for item in state.feedback):
            return False
        feedback.comment = None if feedback.comment is None else clip(feedback.comment, 1_000)
        if len(state.feedback) < MAX_FEEDBACK:
            state.feedback = [*state.feedback, feedback]
        if feedback.negative:
            state.negative_feedback = True
        return True

    def _feedback(self, state: ConversationState, feedback: Feedback, ts_ms: int) -> None:
        """Feedback for a completed conversation: negative feedback gets the last snapshot judged, exactly once."""
        already_negative = state.negative_feedback
        if not self._add_feedback(state, feedback):
            return
        if not feedback.negative or (already_negative and state.rejudge_on_outcome):
            return
        last = state.last_content_id
        outcome = state.dispatched.get(last) if last is not None else None
        if last is None or outcome in JUDGED_OUTCOMES:
            return  # judged: the feedback joins the verdict, no second call
        if outcome is None or outcome == RETRYING:
            if outcome is None and self._join_outbox(state.id, last):
                return  # not sampled yet (same record or poll batch): the feedback is part of that snapshot
            state.rejudge_on_outcome = True  # its outcome decides (see `verdict`)
            return
        self._dispatch(state, "negative_feedback", ts_ms, force=True)

    def _join_outbox(self, conversation_id: str, content: str) -> bool:
        """Mark the snapshot still waiting in the outbox negative (the sampler then always judges it)."""
        for i, dispatch in enumerate(self._outbox):
            job = dispatch.job
            if job.conversation_id == conversation_id and job.content_id == content:
                self._outbox[i] = Dispatch(replace(job, negative_feedback=True), dispatch.completed_ms)
                return True
        return False

    def _reopen(self, state: ConversationState) -> None:
        if state.completed_by == "turn_cap":  # past the cap the conversation goes on in windows of max_turns turns
            self._new_window(state)
        state.status = OPEN
        state.ended = False
        state.end_due_ms = None
        state.completed_by = None
        state.completed_ms = None
        state.rejudge_on_outcome = False
        self._completed.pop(state.id, None)
        self._open[state.id] = None

    def _complete(self, state: ConversationState, completed_by: str, at_ms: int) -> None:
        state.end_due_ms = None
        self._ending.pop(state.id, None)
        state.status = COMPLETED
        state.completed_by = completed_by
        state.completed_ms = at_ms
        self._open.pop(state.id, None)
        self._completed[state.id] = None
        self._completed.move_to_end(state.id)
        self._touch(state)
        self._dispatch(state, completed_by, at_ms)

    def _dispatch(self, state: ConversationState, completed_by: str, at_ms: int, *, force: bool = False) -> None:
        try:
            said = tuple(exchanges(state.spans.values()))
            identity = content_id(state.id, said)
        except Exception:  # nothing a record contains may stop the consumer
            logger.exception("conversation %r could not be assembled: dropped", state.id)
            self.counts["unreadable"] += 1
            return
        if identity in state.dispatched and not force:
            self.counts["unchanged_completions"] += 1  # the same transcript again: one judgement per content
            return
        job = JudgeJob(
            key=f"{state.id}#{identity}",
            conversation_id=state.id,
            agent=state.agent or "unknown",
            partition=-1,
            version=version_of(said),
            exchanges=said,
            has_error=any(t.is_error for t in said),
            negative_feedback=force or state.negative_feedback,
            truncated=state.truncated,
            completed_by=completed_by,
            content_id=identity,
        )
        state.dispatched.pop(identity, None)
        state.dispatched[identity] = None
        while len(state.dispatched) > MAX_DISPATCHED:
            state.dispatched.pop(next(iter(state.dispatched)))
        self._touch(state)
        self._outbox.append(Dispatch(job, at_ms))

    def _forget(self, state: ConversationState, reason: str) -> None:
        self._ending.pop(state.id, None)
        if self.states.pop(state.id, None) is not None:
            self.memory.used -= state.size
        self._unspill(state.id)
        self._unstored.discard(state.id)
        self._open.pop(state.id, None)
        self._completed.pop(state.id, None)
        self._dirty.discard(state.id)
        self._removed.add(state.id)
        if self.store is not None:
            self._unstored_removed.add(state.id)
        self.counts[f"forgotten_{reason}"] += 1

    def oldest_completed_ms(self) -> int | None:
        """When the oldest completed conversation completed (for process-wide eviction), None when there is none."""
        state = next((self.states[cid] for cid in self._completed if cid in self.states), None)
        return None if state is None else state.completed_ms or 0

    def forget_oldest_completed(self) -> bool:
        """The memory bound: forget the oldest completed conversation (counted); False when none is kept."""
        state = next((self.states[cid] for cid in self._completed if cid in self.states), None)
        if state is None:
            return False
        self._forget(state, "memory")
        return True
