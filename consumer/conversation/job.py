"""What the judges are handed: an immutable snapshot of a complete conversation (a value type, used by every layer
above the conversation)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..adapters import Turn

MAX_FIELD_CHARS = 16_000  # one message, at most: the judge's window is smaller still


def version_of(exchanges: Sequence[Turn]) -> int:
    """A transcript's version, its turn count: its exchanges, or more where a turn index says earlier turns came
    first (a continuation after a restart whose start was forgotten)."""
    indices = [t.index for t in exchanges if t.index is not None]
    return max(len(exchanges), max(indices) + 1) if indices else len(exchanges)


@dataclass(frozen=True, slots=True)
class JudgeJob:
    """An immutable snapshot of a complete conversation, handed to the judge pool."""

    key: str
    conversation_id: str
    agent: str
    partition: int
    version: int  # the turn count: its exchanges, plus turns before a restart that `Turn.index` says came first
    exchanges: tuple[Turn, ...]  # the real exchanges (exchanges.py folds nested and duplicate spans), oldest first
    has_error: bool
    negative_feedback: bool
    truncated: bool
    completed_by: str
    content_id: str = ""  # names exactly this transcript (conversation/identity.py): result ids derive from it
    # When the conversation completed (record time, ms since the epoch; None before the judge queue carried it):
    # where tracejudge_verdict_delay_seconds starts.
    completed_ms: int | None = None
    # True: the job is sampled out and its owner recorded that outcome when it sent the job (one changelog write, with
    # the completion): the judge worker sends no outcome back. False for every other job, and for jobs of a version
    # that did not record it (their owner waits for the answer as before).
    answered: bool = False

    @property
    def last_exchange(self) -> Turn:
        return self.exchanges[-1]

    @property
    def judgeable_exchanges(self) -> tuple[Turn, ...]:
        return tuple(t for t in self.exchanges if t.judgeable)

    # The names a result sink (`JudgementSink`, public) was written against before "turn" meant only a span:
    # read-only aliases, kept so such sinks keep working.
    @property
    def turns(self) -> tuple[Turn, ...]:
        """Alias of `exchanges`."""
        return self.exchanges

    @property
    def last_turn(self) -> Turn:
        """Alias of `last_exchange`."""
        return self.exchanges[-1]

    @property
    def judgeable_turns(self) -> tuple[Turn, ...]:
        """Alias of `judgeable_exchanges`."""
        return self.judgeable_exchanges

    @property
    def turn_count(self) -> int:
        """Alias of `version` (the turn count)."""
        return self.version
