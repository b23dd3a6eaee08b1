"""The internal topics' record formats: JSON values (MessagePack for conversation states), a `tracejudge.kind` header
saying what a record is.

UTF-8 JSON (lone surrogates kept with surrogatepass) carries any text the spans held, at about its own size (ASCII
escapes would cost 6 bytes a character and push a long conversation past the brokers' 1 MB record limit), and stays
readable with any Kafka tool; these topics are ours, so their format is versioned by the header, not by a schema
registry.

A conversation's state is MessagePack (`state.msgpack`, `conversation/codec.py`): the changelog is read whole at every
restore, and MessagePack reads several times faster than JSON at a smaller size. A state
MessagePack cannot carry (a lone surrogate, an integer past 64 bits) is written as JSON (`state`), and the JSON states
an older version wrote are read as before.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from ..adapters import ConversationEvent, Feedback, Turn
from ..conversation import codec
from ..conversation.job import JudgeJob
from ..conversation.table import ConversationState, plain

KIND = "tracejudge.kind"
EVENTS, VERDICT, STATE, POSITIONS, JOB, FEEDBACK = "events", "verdict", "state", "positions", "job", "feedback"
STATE_PACKED = "state.msgpack"  # a conversation's state in MessagePack (STATE: the same in JSON)
STATES = frozenset({STATE, STATE_PACKED})
# {"sources": {input partition: how far (record time, ms) it has routed its records}, and one of them as "source",
# "ms": the form a replica of an earlier version sends and reads}
WATERMARK = "watermark"
WATERMARK_KEY = b"\x00tracejudge.watermark"
POSITIONS_KEY = b"\x00tracejudge.positions"  # never a conversation id's key: ids are text, this starts with NUL

Headers = list[tuple[str, bytes]]


def kind_of(headers: Any) -> str | None:
    for key, value in headers or ():
        if key == KIND:
            return bytes(value).decode("ascii", "replace")
    return None


def header(kind: str) -> Headers:
    return [(KIND, kind.encode("ascii"))]


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def dumps_job(job: JudgeJob, *, sampled: bool, completed_ms: int) -> bytes:
    """A job record (`job_to_json`), by msgspec (~5x faster than `dumps`, one per completed conversation). A job holds
    no floats (where msgspec and json would differ: NaN), and a text msgspec refuses (a lone surrogate) goes through
    `dumps`: either way `loads` reads back the same value."""
    data = job_to_json(job, sampled=sampled, completed_ms=completed_ms)
    try:
        return _encode(data)
    except UnicodeEncodeError:
        return dumps(data)


_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def loads(value: bytes) -> Any:
    """msgspec reads a record ~3x faster than json (the judge worker reads every job); it is as strict as json, and
    what it refuses (a lone surrogate, NaN, a number past a float's range) goes to json, so the result is json's."""
    try:
        return _decode(value)
    except msgspec.DecodeError:
        return json.loads(value.decode("utf-8", "surrogatepass"))


def verdict_value(content_id: str, outcome: str) -> bytes:
    """A verdict acknowledgement (one per conversation), byte for byte as `dumps` writes it, ~20x faster: a string
    msgspec refuses (a lone surrogate) goes through `dumps`."""
    value = {"content_id": content_id, "outcome": outcome}
    try:
        return _encode(value)
    except UnicodeEncodeError:
        return dumps(value)


def event_to_json(event: ConversationEvent) -> dict[str, Any]:
    return {
        "agent": event.agent,
        "agent_named": event.agent_named,
        "ended": event.ended,
        "turn": None if event.turn is None else plain(event.turn),
        "feedback": None if event.feedback is None else plain(event.feedback),
    }


def event_from_json(conversation_id: str, data: dict[str, Any]) -> ConversationEvent:
    turn, feedback = data.get("turn"), data.get("feedback")
    return ConversationEvent(
        conversation_id=conversation_id,
        agent=data.get("agent"),
        turn=None if turn is None else Turn(**turn),
        ended=bool(data.get("ended")),
        feedback=None if feedback is None else Feedback(**feedback),
        agent_named=bool(data.get("agent_named", True)),
    )


def job_to_json(job: JudgeJob, *, sampled: bool, completed_ms: int) -> dict[str, Any]:
    """`answered` is written only when true: a worker of an earlier version ignores it and answers as before."""
    data = {
        "conversation_id": job.conversation_id,
        "agent": job.agent,
        "version": job.version,
        "content_id": job.content_id,
        "turns": [plain(turn) for turn in job.exchanges],
        "has_error": job.has_error,
        "negative_feedback": job.negative_feedback,
        "truncated": job.truncated,
        "completed_by": job.completed_by,
        "sampled": sampled,
        "completed_ms": completed_ms,
    }
    if job.answered:
        data["answered"] = True
    return data


def job_from_json(data: dict[str, Any], *, key: str, partition: int) -> tuple[JudgeJob, bool, int]:
    """The job, whether it was sampled in, and when (record time, ms) its conversation completed."""
    job = JudgeJob(
        key=key,
        conversation_id=str(data["conversation_id"]),
        agent=str(data["agent"]),
        partition=partition,
        version=int(data["version"]),
        exchanges=tuple(Turn(**turn) for turn in data["turns"]),
        has_error=bool(data["has_error"]),
        negative_feedback=bool(data["negative_feedback"]),
        truncated=bool(data["truncated"]),
        completed_by=str(data["completed_by"]),
        content_id=str(data["content_id"]),
        completed_ms=int(data["completed_ms"]),
        answered=data.get("answered") is True,
    )
    return job, bool(data["sampled"]), int(data["completed_ms"])


class _TurnRecord(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A job's turn as `job_to_json` writes it: Turn's fields, types and defaults (a test keeps them the same).
    Read records hold no cycles: `gc=False` keeps them out of the collector's passes, as `_JobRecord`."""

    span_id: str
    trace_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    input: str | None
    output: str | None
    is_error: bool = False
    index: int | None = None
    input_from_body: bool = False
    output_from_body: bool = False


class _JobRecord(msgspec.Struct, gc=False):
    conversation_id: str
    agent: str
    version: int
    content_id: str
    turns: list[_TurnRecord]
    has_error: bool
    negative_feedback: bool
    truncated: bool
    completed_by: str
    sampled: bool
    completed_ms: int
    retry: Any = None
    answered: bool = False


_read_job = msgspec.json.Decoder(_JobRecord).decode


def job_record(value: bytes, *, key: str, partition: int) -> tuple[JudgeJob, bool, Any]:
    """A job record's job, whether it was sampled in, and its `retry` field, as `loads` and `job_from_json` read them
    (~2.5x faster: msgspec reads the record straight into typed fields). A record it refuses (a field, type or value
    `job_to_json` does not write) is read by those, so the result, or the exception, is theirs."""
    try:
        data = _read_job(value)
    except msgspec.DecodeError:
        plain_data = loads(value)
        job, sampled, _completed_ms = job_from_json(plain_data, key=key, partition=partition)
        return job, sampled, plain_data.get("retry")
    exchanges = tuple(
        Turn(
            t.span_id,
            t.trace_id,
            t.parent_span_id,
            t.start_ns,
            t.end_ns,
            t.input,
            t.output,
            t.is_error,
            t.index,
            t.input_from_body,
            t.output_from_body,
        )
        for t in data.turns
    )
    job = JudgeJob(
        key=key,
        conversation_id=data.conversation_id,
        agent=data.agent,
        partition=partition,
        version=data.version,
        exchanges=exchanges,
        has_error=data.has_error,
        negative_feedback=data.negative_feedback,
        truncated=data.truncated,
        completed_by=data.completed_by,
        content_id=data.content_id,
        completed_ms=data.completed_ms,
        answered=data.answered,
    )
    return job, data.sampled, data.retry


def encode_state(state: ConversationState) -> tuple[str, bytes]:
    """(kind, value) of a conversation's state: MessagePack, or JSON for what MessagePack cannot carry."""
    try:
        return STATE_PACKED, codec.pack(state)
    except codec.UNPACKABLE:
        return STATE, dumps(state.to_json())


def decode_state(kind: str | None, value: bytes) -> ConversationState:
    """A state as `encode_state` (or an older version, in JSON) wrote it."""
    return codec.unpack(value) if kind == STATE_PACKED else ConversationState.from_json(loads(value))


def state_activity_ms(kind: str | None, value: bytes) -> int:
    """`codec.activity_ms` of a state as `encode_state` wrote it, without decoding all of a packed one."""
    return (
        codec.unpack_activity_ms(value)
        if kind == STATE_PACKED
        else codec.checked_activity_ms(decode_state(kind, value))
    )
