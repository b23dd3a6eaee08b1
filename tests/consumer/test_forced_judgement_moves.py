"""Negative feedback on a sampled-out conversation whose partition moved (restart, rebalance) before the judge
worker's answer came: one forced judgement, and the late answer never stands for it. Both ways a state can hold the
sampled-out job: its outcome recorded when the job was sent (this version: durable with the completion, and the
worker sends no answer, though one of an earlier version still does) or waiting for the worker's answer (a state an
earlier version wrote). (A sampled-out outcome recorded at dispatch in memory only once judged some conversations
twice here.)"""

from __future__ import annotations

import pytest

from tracejudge.consumer.adapters import ConversationEvent, Feedback, Turn
from tracejudge.consumer.conversation.table import ConversationTable
from tracejudge.consumer.streams import records as R


def turn(cid: str, n: int) -> ConversationEvent:
    return ConversationEvent(cid, "a", turn=Turn(f"{cid}-s{n}", "t", "", 10 + n, 11 + n, f"q{n}", "a", index=n))


def neg(n: int) -> ConversationEvent:
    return ConversationEvent("c", "a", feedback=Feedback(-1.0, "thumbs_down", "bad", f"fb-{n}"))


def _dispatch_sampled_out(table: ConversationTable, *, recorded: bool) -> str:
    """As Processor.dispatch does (`recorded`: this version records the outcome as it sends the job; else the
    state waits for the worker's answer, as an earlier version's did)."""
    (first,) = table.take_dispatches()
    if recorded:
        table.verdict("c", first.job.content_id, "sampled_out", 1002)
    return first.job.content_id


def _moved(table: ConversationTable) -> ConversationTable:
    """The state as the commit wrote it to the changelog, restored by the partition's next owner (or after a
    restart): encode_state/decode_state, then restore."""
    changed, _removed = table.take_changes()
    (state,) = [s for s in changed if s.id == "c"]
    kind, value = R.encode_state(state)
    fresh = ConversationTable()
    fresh.restore(R.decode_state(kind, value), "c")
    fresh.restored(stored=False)
    return fresh


def _completed_and_moved(recorded: bool) -> tuple[ConversationTable, str]:
    """A two-turn conversation completed, its job J1 sent (to be sampled out), committed, then kill -9 / rebalance:
    its next owner's table, J1's answer not in yet; and J1's content id."""
    table = ConversationTable()
    for n in range(2):
        table.apply(turn("c", n), 1000 + n)
    table.apply(ConversationEvent("c", "a", ended=True), 1002)
    content = _dispatch_sampled_out(table, recorded=recorded)
    return _moved(table), content


@pytest.mark.parametrize("recorded", [True, False], ids=["outcome recorded at dispatch", "waiting for the answer"])
def test_forced_judgements_after_a_move_before_the_answer(recorded: bool) -> None:
    table, content = _completed_and_moved(recorded)
    forced = []
    table.apply(neg(1), 1003)
    forced += table.take_dispatches()
    table.verdict("c", content, "sampled_out", 1004)  # J1's answer (sampled out), arriving now
    forced += table.take_dispatches()
    table.apply(neg(2), 1005)  # a second thumbs-down while the forced judgement is still out
    forced += table.take_dispatches()
    # one forced judgement (J2), dispatched when J1's answer came; the second feedback waits for J2's outcome
    assert len(forced) == 1, [(d.job.completed_by, d.job.content_id) for d in forced]


@pytest.mark.parametrize("recorded", [True, False], ids=["outcome recorded at dispatch", "waiting for the answer"])
def test_the_late_answer_never_overwrites_a_judgement(recorded: bool) -> None:
    table, content = _completed_and_moved(recorded)
    table.apply(neg(1), 1003)
    table.take_dispatches()
    table.verdict("c", content, "sampled_out", 1004)  # J1's answer
    table.take_dispatches()
    table.verdict("c", content, "judged", 1005)  # J2's answer
    state = table.get("c")
    assert state is not None and state.dispatched[content] == "judged"
    table.apply(neg(2), 1006)
    assert table.take_dispatches() == []  # judged: the feedback joins the verdict
