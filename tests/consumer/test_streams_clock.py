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


class _Consumer:
    """A consumer whose last fetch said `highwater` (stale or not) for every partition."""

    def __init__(self, highwater: int | None) -> None:
        self._highwater = highwater
        self.assigned: list[object] = []

    def highwater(self, tp: object) -> int | None:
        return self._highwater

    def assign(self, partitions: list[object]) -> None:
        self.assigned = list(partitions)

    def seek(self, tp: object, offset: int) -> None:
        pass

    def poll(self, **kwargs: object) -> dict[object, list[object]]:
        return {}

    def close(self, **kwargs: object) -> None:
        pass


def _assembler(group_highwater: int, fresh_highwater: int | None) -> tuple[Assembler, Task]:
    from tracejudge.consumer.settings import Settings
    from tracejudge.consumer.streams.probe import HighwaterProbe

    assembler = Assembler.__new__(Assembler)
    assembler.settings = Settings.from_options(bootstrap_servers="127.0.0.1:9", topic="spans", group_id="g")
    assembler.topics = SimpleNamespace(repartition="g-repartition")  # type: ignore[assignment]
    assembler.group = _Consumer(group_highwater)  # type: ignore[assignment]
    assembler.side = _Consumer(None)  # type: ignore[assignment]
    assembler.probe = HighwaterProbe(lambda **config: _Consumer(fresh_highwater), "127.0.0.1:9", {})  # type: ignore[arg-type, return-value]
    assembler._last_probe = 0.0
    task = Task(0, ConversationTable(idle_timeout_s=1.0), restoring=False, input_position=10)
    task.watermark_ms = int(time.time() * 1000) - 60_000
    assembler.tasks = {0: task}
    return assembler, task


def test_a_stale_high_watermark_never_lets_wall_time_run() -> None:
    """The group consumer's last fetch says offset 10 is the end (it stopped fetching: a rebalance, a busy thread),
    but 5 more records are in the partition: a fresh fetch says so, and the clock stays at record time."""
    assembler, task = _assembler(group_highwater=10, fresh_highwater=15)
    now = int(time.time() * 1000)
    assembler._probe_caught_up()
    assert assembler._clock(task, now) == task.watermark_ms


def test_a_fresh_fetch_that_finds_nothing_more_moves_the_clock_to_wall_time() -> None:
    assembler, task = _assembler(group_highwater=10, fresh_highwater=10)
    before = int(time.time() * 1000)
    assembler._probe_caught_up()
    clock = assembler._clock(task, int(time.time() * 1000))
    assert before - 1_000 <= clock <= before  # the probe's start, less one interval: never past it


def test_no_answer_from_the_probe_keeps_record_time() -> None:
    assembler, task = _assembler(group_highwater=10, fresh_highwater=None)
    assembler._probe_caught_up()
    assert assembler._clock(task, int(time.time() * 1000)) == task.watermark_ms
