"""Backfill's assembly without Kafka (`streams/range_assembler.py`): the windows in which an event can reach it.

Records of a range arrive on their conversation's own partition (keyed: the tests in test_backfill_live.py), on another
one (routed: waits for the slowest partition, below), after the snapshot's outcome came back (negative feedback on
one not judged: judged once more, below), or when the state is over --max-state-bytes (completed ones forgotten, open
ones never cut, below).
"""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider

from tests.consumer.test_backfill import conversation_record
from tracejudge.consumer.adapters import ConversationEvent, Feedback
from tracejudge.consumer.kafka.partitioner import state_partition
from tracejudge.consumer.settings import Settings
from tracejudge.consumer.streams.range_assembler import RangeAssembler

PARTITIONS = 3
TRACER = TracerProvider().get_tracer("range-assembler")


def assembler(**options: object) -> RangeAssembler:
    settings = Settings.from_options(bootstrap_servers="127.0.0.1:9", topic="spans", **options)
    return RangeAssembler(settings, PARTITIONS, start_ms=0)


def owned_by(partition: int, stem: str) -> str:
    """A conversation id whose state partition is `partition` (its records, keyed by it, are read in order there)."""
    return next(f"{stem}-{i}" for i in range(1_000) if state_partition(f"{stem}-{i}", PARTITIONS) == partition)


def keyed(backfill: RangeAssembler, partition: int, stem: str, ts_ms: int, **record: object) -> str:
    cid = owned_by(partition, stem)
    backfill.record(partition, cid.encode(), conversation_record(TRACER, cid, **record), ts_ms)  # type: ignore[arg-type]
    return cid


def test_a_routed_end_marker_waits_for_the_slowest_other_partition() -> None:
    """Not keyed by its conversation, read on another partition: its end marker completes it once every other
    partition's clock passed it by --end-grace (as live, where it came through the repartition topic)."""
    backfill = assembler(end_grace=2.0)
    owner = state_partition("routed", PARTITIONS)
    source, third = (owner + 1) % PARTITIONS, (owner + 2) % PARTITIONS
    backfill.record(source, None, conversation_record(TRACER, "routed", 2, ended=True), 10_000)
    backfill.advance({owner}, end_ms=100_000)  # nothing in range on its own partition: read to the end
    assert backfill.take_dispatches() == []  # the third partition stands at the start: a turn may still come
    keyed(backfill, third, "third", 12_500, turns=1, ended=False)
    backfill.advance({owner}, end_ms=100_000)
    assert backfill.take_dispatches() == []  # the source itself is at 10,000
    keyed(backfill, source, "source", 12_500, turns=1, ended=False)
    backfill.advance({owner}, end_ms=100_000)
    (dispatch,) = backfill.take_dispatches()
    assert dispatch.job.conversation_id == "routed" and dispatch.job.completed_by == "end_marker"
    assert dispatch.completed_ms == 12_000  # its end marker's record time plus the grace
    assert sorted(backfill.still_open()) == sorted([owned_by(third, "third"), owned_by(source, "source")])


def test_negative_feedback_on_a_snapshot_not_judged_is_judged_once() -> None:
    backfill = assembler()
    cid = keyed(backfill, 0, "c", 1_000, turns=2, ended=True)
    (first,) = backfill.take_dispatches()
    owner = backfill.tables[0]
    thumbs_down = ConversationEvent(cid, None, feedback=Feedback(-1.0, None, None, "f1"))
    owner.apply(thumbs_down, 2_000)
    assert backfill.take_dispatches() == []  # its outcome is not known yet: the verdict decides
    backfill.verdict(first.job, "sampled_out")
    (again,) = backfill.take_dispatches()
    assert again.job.content_id == first.job.content_id and again.job.negative_feedback
    assert again.job.completed_by == "negative_feedback"
    backfill.verdict(again.job, "judged")
    owner.apply(ConversationEvent(cid, None, feedback=Feedback(-1.0, None, None, "f2")), 3_000)
    assert backfill.take_dispatches() == []  # judged: the feedback joins the verdict, no second call


def test_past_max_state_bytes_completed_conversations_go_and_open_ones_stay(caplog: pytest.LogCaptureFixture) -> None:
    backfill = assembler(max_state_bytes=4_000)
    done = [keyed(backfill, 0, f"done{i}", 1_000 + i, turns=1, ended=True) for i in range(3)]
    still = keyed(backfill, 0, "open", 2_000, turns=3, ended=False, text=" " + "x" * 3_000)
    with caplog.at_level(logging.WARNING, logger="tracejudge.backfill"):
        backfill.advance(set(), end_ms=10_000)
    assert [d.job.conversation_id for d in backfill.take_dispatches()] == done
    forgotten = sum(t.counts["forgotten_memory"] for t in backfill.tables.values())
    assert forgotten == 3 and backfill.still_open() == [still] and backfill.memory.over
    assert any("not cut" in r.getMessage() for r in caplog.records)
