"""State writes at Kafka Streams' cost (issue 31): one changelog record per changed conversation and commit (the
record cache), MessagePack states that read back equal, the JSON an older version wrote still restored."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tracejudge.consumer.adapters import ConversationEvent, Feedback, Turn
from tracejudge.consumer.conversation import codec
from tracejudge.consumer.conversation.table import ConversationState, ConversationTable
from tracejudge.consumer.streams import records as R
from tracejudge.consumer.streams.task import Task

from .test_review_state import FakeProducer, assembler


def turn(cid: str, n: int, text: str = "q") -> ConversationEvent:
    return ConversationEvent(cid, "a", turn=Turn(f"{cid}-s{n}", "t", "", 10 + n, 11 + n, f"{text}{n}", "a", index=n))


def state_with_everything() -> ConversationState:
    table = ConversationTable(max_bytes=40)
    for n in range(4):
        table.apply(turn("c", n, "x" * 20), 1000 + n)  # past the window: dropped span ids
    table.apply(ConversationEvent("c", "a", feedback=Feedback(-1.0, "thumbs_down", "bad", "fb-1")), 1005)
    table.apply(ConversationEvent("c", "a", ended=True), 1006)
    state = table.get("c")
    assert state is not None and state.dropped_span_ids and state.feedback and state.dispatched
    return state


def changelog_writes(producer: Any, asm: Any) -> list[bytes]:
    return [key for topic, key, _ in producer.sent if topic == asm.topics.changelog]


def test_a_conversation_changed_fifty_times_in_a_commit_interval_is_written_once() -> None:
    asm = assembler()
    task = Task(0, asm.state.new_table(), restoring=False, input_position=50)
    asm.tasks = {0: task}
    for n in range(50):
        task.table.apply(turn("busy", n), 1000 + n)
    asm.commit()
    producer = asm.collector.producer
    assert isinstance(producer, FakeProducer)
    writes = changelog_writes(producer, asm)
    assert writes.count(b"busy") == 1, writes
    assert writes[-1] == R.POSITIONS_KEY  # then the positions, once
    task.table.apply(turn("busy", 50), 1050)
    task.input_position = 51
    asm.commit()
    assert changelog_writes(producer, asm).count(b"busy") == 2  # changed again: written again at the next commit
    asm.commit()
    assert changelog_writes(producer, asm).count(b"busy") == 2  # unchanged: nothing written


def test_a_state_packs_and_reads_back_equal() -> None:
    state = state_with_everything()
    kind, value = R.encode_state(state)
    assert kind == R.STATE_PACKED
    again = R.decode_state(kind, value)
    assert again == state
    assert again._dropped == set(state.dropped_span_ids)  # the duplicate check works on the restored state
    assert len(value) < len(R.dumps(state.to_json()))


def test_the_json_an_older_version_wrote_is_restored() -> None:
    state = state_with_everything()
    assert R.decode_state(R.STATE, R.dumps(state.to_json())) == state


def test_what_messagepack_cannot_carry_is_written_as_json() -> None:
    table = ConversationTable()
    far = 10**30  # a record may claim any start time (tests/reliability/test_malformed.py)
    table.apply(ConversationEvent("c", "a", turn=Turn("s", "t", "", far, far + 1, "lone \udc80", "b")), 1000)
    state = table.get("c")
    assert state is not None
    try:
        codec.pack(state)
    except codec.UNPACKABLE:
        pass
    else:
        raise AssertionError("packed an integer past 64 bits")
    kind, value = R.encode_state(state)
    assert kind == R.STATE
    assert R.decode_state(kind, value) == state


def test_a_sampled_out_conversation_is_written_once_with_its_outcome_and_a_replayed_verdict_writes_nothing() -> None:
    """The processor records a sampled-out outcome when it sends the job (`answered` on the job: the worker sends
    nothing back): the conversation goes to the changelog once, with its completion. An answer that comes all the same
    (a worker of an earlier version, a replay) changes nothing; another outcome is a change."""
    asm = assembler()
    asm.processor.select = lambda job: False  # sampled out
    task = Task(0, asm.state.new_table(), restoring=False, input_position=4)
    asm.tasks = {0: task}
    for n in range(3):
        task.table.apply(turn("quiet", n), 1000 + n)
    task.table.apply(ConversationEvent("quiet", "a", ended=True), 1003)
    producer = asm.collector.producer
    assert isinstance(producer, FakeProducer)
    jobs: list[Any] = []
    send = producer.send

    def keeping_jobs(topic: str, **kw: Any) -> Any:
        if topic == asm.topics.judge_queue:
            jobs.append(kw["value"])
        return send(topic, **kw)

    producer.send = keeping_jobs  # type: ignore[method-assign]
    asm.processor.dispatch([task])
    asm.commit()
    assert changelog_writes(producer, asm).count(b"quiet") == 1  # completed, with its outcome
    state = task.table.get("quiet")
    assert state is not None and state.last_content_id is not None
    content = state.last_content_id
    assert state.dispatched == {content: "sampled_out"}
    (job,) = jobs
    assert R.loads(job)["answered"] is True and R.loads(job)["sampled"] is False
    answer = {"content_id": content, "outcome": "sampled_out"}
    for replay in range(2):  # an earlier version's answer, then the same answer replayed
        asm.processor.repartitioned(task, verdict_record(b"quiet", answer))
        task.repartition_position = replay + 1
        asm.commit()
        assert changelog_writes(producer, asm).count(b"quiet") == 1  # it changed nothing: not written again
    assert state.dispatched == {content: "sampled_out"}
    asm.processor.repartitioned(task, verdict_record(b"quiet", {"content_id": content, "outcome": "judged"}))
    asm.commit()
    assert changelog_writes(producer, asm).count(b"quiet") == 2  # another outcome is a change: written
    assert state.dispatched == {content: "judged"}


def verdict_record(key: bytes, value: object) -> SimpleNamespace:
    return SimpleNamespace(headers=R.header(R.VERDICT), key=key, value=R.dumps(value), timestamp=2000, partition=0)
