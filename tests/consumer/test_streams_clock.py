"""A state partition's record-time clock moves only with records that carry record time.

Watermarks and verdict acks are stamped with wall time when sent. Taking their timestamps moved a lagging
partition's clock to "now" (and it broadcast that clock as how far it had routed its input), so while catching up on
a backlog older than the idle timeout every conversation with routed events could complete before its turns came.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from tracejudge.consumer.adapters import ConversationEvent, Turn
from tracejudge.consumer.conversation.table import ConversationTable
from tracejudge.consumer.streams import records as R
from tracejudge.consumer.streams.assembler import Assembler, Task


def record(kind: str, key: bytes, value: object, timestamp: int) -> SimpleNamespace:
    return SimpleNamespace(
        headers=R.header(kind), key=key, value=R.dumps(value), timestamp=timestamp, partition=0, offset=0
    )


def test_watermarks_and_verdicts_do_not_move_the_record_clock() -> None:
    assembler = Assembler.__new__(Assembler)  # _repartitioned needs no clients
    task = Task(0, ConversationTable(idle_timeout_s=1.0), restoring=False)
    now = int(time.time() * 1000)
    backlog = now - 60_000  # records a minute old, being caught up on
    turn = Turn("s1", "t1", "", 1, 2, "question", "answer")
    event = ConversationEvent("conv-1", "agent", turn=turn)
    assembler._repartitioned(task, record(R.EVENTS, b"conv-1", {"events": [R.event_to_json(event)]}, backlog))
    assert task.watermark_ms == backlog
    assembler._repartitioned(task, record(R.WATERMARK, R.WATERMARK_KEY, {"source": 1, "ms": backlog}, now))
    assembler._repartitioned(task, record(R.VERDICT, b"conv-1", {"content_id": "x", "outcome": "judged"}, now))
    assert task.sources == {1: backlog}
    assert task.watermark_ms == backlog  # not `now`: input up to now was not read
    task.table.advance(task.watermark_ms, backlog)
    assert task.table.open_count == 1  # its other turns may still be in the backlog
