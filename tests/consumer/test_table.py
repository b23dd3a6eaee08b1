"""ConversationTable (Kafka-free): the bounds and windows a conversation's state goes through."""

from __future__ import annotations

from tracejudge.consumer.adapters import ConversationEvent, Feedback, Turn
from tracejudge.consumer.conversation.codec import pack, unpack
from tracejudge.consumer.conversation.table import MAX_DROPPED_IDS, NO_IDS, ConversationTable


def turn(cid: str, n: int) -> ConversationEvent:
    return ConversationEvent(
        cid, "a", turn=Turn(f"{cid}-s{n}", "t", "", 10 + n, 11 + n, f"q{n}", "a", index=n)
    )  # fmt: skip


def test_past_the_turn_cap_the_conversation_goes_on_in_windows() -> None:
    """Each window of max_turns turns is one snapshot; the turns after the cap never make every later turn re-judge
    the whole growing history."""
    table = ConversationTable(max_turns=5)
    for n in range(12):
        table.apply(turn("c", n), 1000 + n)
    table.apply(turn("c", 3), 2000)  # a redelivered span of the first window: still a duplicate
    dispatched = table.take_dispatches()
    assert [[t.span_id for t in d.job.exchanges] for d in dispatched] == [
        [f"c-s{n}" for n in range(5)],
        [f"c-s{n}" for n in range(5, 10)],
    ]
    assert all(d.job.truncated and d.job.completed_by == "turn_cap" for d in dispatched)
    assert table.counts["truncated_conversations"] == 2 and table.counts["duplicate_spans"] == 1
    state = table.get("c")
    assert state is not None and [t.span_id for t in state.spans.values()] == ["c-s10", "c-s11"]
    assert table.memory.used == state.size  # the windows' text was released, their ids kept
    table.advance(2000 + table.idle_ms)
    [last] = table.take_dispatches()
    assert [t.span_id for t in last.job.exchanges] == ["c-s10", "c-s11"] and last.job.completed_by == "idle_timeout"


def test_remembered_span_ids_are_bounded() -> None:
    table = ConversationTable(max_turns=1_000)
    for n in range(MAX_DROPPED_IDS // 1_000 * 1_000 + 3_000):
        table.apply(turn("long", n), 1000)
    state = table.get("long")
    assert state is not None and len(state.dropped_span_ids) == MAX_DROPPED_IDS
    assert table.counts["span_ids_forgotten"] > 0


def test_dropped_ids_share_one_empty_lookup_until_a_span_is_dropped() -> None:
    """A conversation that never dropped a span holds no lookup set of its own (216 bytes each); the first drop gives
    it one, the shared empty one is never changed, and duplicates of dropped spans are still found, also after a
    restore."""
    table = ConversationTable(max_turns=2)
    table.apply(turn("short", 0), 1000)
    for n in range(5):
        table.apply(turn("long", n), 1000)
    short, long = table.get("short"), table.get("long")
    assert short is not None and long is not None
    assert short._dropped is NO_IDS and not NO_IDS
    assert long._dropped is not NO_IDS and set(long.dropped_span_ids) == long._dropped == {
        f"long-s{n}" for n in range(4)
    }
    table.apply(turn("long", 0), 1001)  # a redelivered span the window cut: a duplicate
    assert table.counts["duplicate_spans"] == 1
    restored = unpack(pack(long))
    assert restored.seen("long-s1") and not restored.seen("long-s9")
    again = unpack(pack(short))  # read back: the shared empties again, not empty lists of its own
    assert again == short and again._dropped is NO_IDS and again.dropped_span_ids == () and again.feedback == ()
    long.forget_oldest_ids(1)
    assert long._dropped == {"long-s1", "long-s2", "long-s3"} and not NO_IDS
    long.forget_oldest_ids(3)  # all of them: the shared empties again, equal to the state read back
    assert long.dropped_span_ids == () and long._dropped is NO_IDS and unpack(pack(long)) == long


def test_negative_feedback_in_the_end_markers_batch_joins_its_snapshot() -> None:
    """End marker then thumbs-down before the snapshot left the table (one record, one poll batch): one snapshot,
    negative (the sampler always judges it), no second one after its outcome."""
    table = ConversationTable()
    table.apply(turn("fb", 0), 1000)
    table.apply(ConversationEvent("fb", "a", ended=True), 1001)
    down = Feedback(score=None, label="thumbs_down", comment=None, span_id="f1")
    table.apply(ConversationEvent("fb", "a", feedback=down), 1001)
    [dispatch] = table.take_dispatches()
    assert dispatch.job.negative_feedback and dispatch.job.completed_by == "end_marker"
    table.verdict("fb", dispatch.job.content_id, "judged", 1500)
    assert table.take_dispatches() == []
