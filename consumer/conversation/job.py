"""What the judges are handed: an immutable snapshot of a complete conversation (a value type, used by every layer
above the conversation)."""

from __future__ import annotations

from dataclasses import dataclass

from ..adapters import Turn

MAX_FIELD_CHARS = 16_000  # one message, at most: the judge's window is smaller still


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
    content_id: str = ""  # names exactly this transcript (conversation/identity.py): result ids derive from it
    # When the conversation completed (record time, ms since the epoch; None before the judge queue carried it):
    # where tracejudge_verdict_delay_seconds starts.
    completed_ms: int | None = None

    @property
    def turn_count(self) -> int:
        return self.version

    @property
    def last_turn(self) -> Turn:
        return self.turns[-1]

    @property
    def judgeable_turns(self) -> tuple[Turn, ...]:
        return tuple(t for t in self.turns if t.judgeable)
