"""The live consumer's assembly without Kafka, for span-convention tests: record values → `read_events` (decode,
adapters) → one ConversationTable, as a state partition's task folds them in (record time: `ts_ms`)."""

from __future__ import annotations

from collections.abc import Iterable

from tracejudge.consumer.conversation.job import JudgeJob
from tracejudge.consumer.conversation.reading import read_events
from tracejudge.consumer.conversation.table import ConversationTable
from tracejudge.consumer.conversation.textless import TextlessSpans


def fold(
    table: ConversationTable, values: Iterable[bytes], ts_ms: int = 0, textless: TextlessSpans | None = None
) -> None:
    """Each record value's events into `table`; a record that does not read fails the test."""
    for value in values:
        events, failure = read_events(value, max_bytes=64 * 1024 * 1024, textless=textless)
        assert failure is None, failure
        for event in events:
            table.apply(event, ts_ms)


def assemble(values: Iterable[bytes], idle_timeout_s: float = 300.0) -> tuple[list[JudgeJob], list[JudgeJob]]:
    """The conversations these records make, in this order: (completed on arrival, completed by the idle timeout)."""
    table = ConversationTable(idle_timeout_s=idle_timeout_s)
    fold(table, values)
    on_arrival = [dispatch.job for dispatch in table.take_dispatches()]
    table.advance(table.idle_ms)
    return on_arrival, [dispatch.job for dispatch in table.take_dispatches()]
