"""Negative feedback on a sampled-out conversation whose partition moved (restart, rebalance) before the judge
worker's answer came: one forced judgement, and the late answer never stands for it. Both ways a state can hold the
sampled-out job: its outcome recorded when the job was sent (this version: durable with the completion; the worker
sends no answer) or waiting for the worker's answer (a state an earlier version wrote). (A sampled-out outcome
recorded at dispatch in memory only once judged some conversations twice here.)"""

from __future__ import annotations

from typing import Any

import pytest

from tests.consumer.test_review_state import FakeProducer, assembler
from tracejudge.consumer.adapters import ConversationEvent, Feedback, Turn
from tracejudge.consumer.conversation.table import ConversationTable
from tracejudge.consumer.judging.sampling import Sampler
from tracejudge.consumer.streams import records as R
from tracejudge.consumer.streams.task import Task


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
    if not recorded:  # (a job whose outcome was recorded as it was sent gets no answer)
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
    if not recorded:
        table.verdict("c", content, "sampled_out", 1004)  # J1's answer
    table.take_dispatches()
    table.verdict("c", content, "judged", 1005)  # J2's answer
    state = table.get("c")
    assert state is not None and state.dispatched[content] == "judged"
    table.apply(neg(2), 1006)
    assert table.take_dispatches() == []  # judged: the feedback joins the verdict


def _sampling_assembler() -> tuple[Any, Task]:
    """An assembler whose sampler judges only what must be (errors, negative feedback): the rest is sampled out."""
    asm = assembler()
    asm.processor.select = Sampler(0.0).should_judge
    task = Task(0, asm.state.new_table(), restoring=False, input_position=1)
    asm.tasks = {0: task}
    return asm, task


def test_a_continuation_and_negative_feedback_before_the_dispatch_keep_the_recorded_outcome() -> None:
    """The end marker, a continuation and a thumbs-down read before the step's dispatch (a catch-up batch): J1, made
    before the feedback, is sampled out as it is sent and no worker will answer it: the table holds that outcome, so
    the conversation is forgotten after one retention, not kept waiting for an answer."""
    asm, task = _sampling_assembler()
    table = task.table
    table.apply(turn("c", 0), 1000)
    table.apply(ConversationEvent("c", "a", ended=True), 1001)  # J1 in the outbox
    table.apply(turn("c", 1), 1002)  # reopened
    table.apply(neg(1), 1003)  # on the open conversation
    asm.processor.dispatch([task])
    state = table.get("c")
    assert state is not None and list(state.dispatched.values()) == ["sampled_out"]
    table.apply(ConversationEvent("c", "a", ended=True), 1004)
    asm.processor.dispatch([task])  # J2: negative, always judged
    _j1, j2 = state.dispatched
    assert state.dispatched[j2] is None
    table.verdict("c", j2, "judged", 1005)
    table.advance(1004 + table.retention_ms + 1)
    assert table.get("c") is None and table.counts["outcomes_never_returned"] == 0


def test_a_commit_in_the_middle_of_a_step_sends_the_jobs_of_what_it_writes() -> None:
    """A memory bound commits before the step's dispatch: the completions it writes (and commits the input past)
    have their jobs sent first, else a crash after it would never judge them."""
    asm, task = _sampling_assembler()
    task.input_position = 3
    producer = asm.collector.producer
    assert isinstance(producer, FakeProducer)
    task.table.apply(turn("c", 0), 1000)
    task.table.apply(ConversationEvent("c", "a", ended=True), 1001)  # completed: its job in the outbox
    asm.commit()
    sent = [topic for topic, key, _ in producer.sent if key == b"c"]
    assert sent == [asm.topics.judge_queue, asm.topics.changelog], sent  # the job, then the state
    assert task.committed_input == 3
