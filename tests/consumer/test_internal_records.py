"""The judge worker's fast readers and writers of internal records (msgspec) give exactly what json gave."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import msgspec
import pytest

from tracejudge.consumer.adapters import Turn
from tracejudge.consumer.conversation.job import JudgeJob
from tracejudge.consumer.streams import records as R


def _old_loads(value: bytes) -> Any:
    return json.loads(value.decode("utf-8", "surrogatepass"))


def _job(conversation_id: str = "cé", **turn: Any) -> JudgeJob:
    fields = {"span_id": "s1", "trace_id": "t1", "parent_span_id": "", "start_ns": 1, "end_ns": 2, "input": "q"}
    fields.update({"output": "a", **turn})
    return JudgeJob(
        key="",
        conversation_id=conversation_id,
        agent="agent",
        partition=0,
        version=2,
        exchanges=(Turn(**fields), Turn("s2", "t1", "s1", 3, 4, None, 'a\n"b"', is_error=True, index=7)),
        has_error=True,
        negative_feedback=False,
        truncated=True,
        completed_by="end",
        content_id="content",
        completed_ms=1_700_000_000_000,
    )


def _old_job(value: bytes) -> tuple[JudgeJob, bool, Any]:
    data = _old_loads(value)
    job, sampled, _completed_ms = R.job_from_json(data, key="0:1", partition=0)
    return job, sampled, data.get("retry")


def test_turn_record_mirrors_turn() -> None:
    """The typed reader's turn has Turn's fields and defaults: a field added to Turn must be added there too (else
    every job falls back to the slow reader)."""
    turn_fields = [(f.name, f.default) for f in dataclasses.fields(Turn)]
    record_fields = [
        (f.name, dataclasses.MISSING if f.required else f.default) for f in msgspec.structs.fields(R._TurnRecord)
    ]
    assert record_fields == turn_fields


@pytest.mark.parametrize(
    ("turn", "fast"),
    [
        ({}, True),
        ({"input": "x" * 10_000, "output": None, "start_ns": 2**64 - 1}, True),
        ({"input": "emoji 😀 and \u2028 and \x00"}, True),
        ({"start_ns": 2**70}, True),
        ({"conversation_id": "c\ud800"}, False),  # a lone surrogate (written with surrogatepass): read by json
        ({"input": "\udc80 lone"}, False),
    ],
)
def test_job_record_reads_what_json_reads(turn: dict[str, Any], fast: bool) -> None:
    for retry in (None, {"attempt": 1, "reason": "rate_limit"}):
        value = R.job_to_json(_job(**turn), sampled=True, completed_ms=5)
        if retry is not None:
            value["retry"] = retry
        encoded = R.dumps(value)
        assert R.job_record(encoded, key="0:1", partition=0) == _old_job(encoded)
        assert R.loads(encoded) == _old_loads(encoded)
        try:
            R._read_job(encoded)
            read_fast = True
        except msgspec.DecodeError:
            read_fast = False
        assert read_fast == fast


@pytest.mark.parametrize(
    "turn",
    [
        {},
        {"input": "x" * 10_000, "output": None, "start_ns": 2**64 - 1},
        {"input": 'emoji 😀 and \u2028 and \x00 \x1f \x7f "quoted" \\'},
        {"start_ns": 2**70},
        {"conversation_id": "c\ud800"},  # a lone surrogate: msgspec refuses it, `dumps` writes it
        {"input": "\udc80 lone"},
    ],
)
@pytest.mark.parametrize("answered", [True, False])
def test_a_job_written_by_dumps_job_reads_back_as_one_written_by_dumps(turn: dict[str, Any], answered: bool) -> None:
    job = dataclasses.replace(_job(**turn), answered=answered)
    fast = R.dumps_job(job, sampled=not answered, completed_ms=5)
    slow = R.dumps(R.job_to_json(job, sampled=not answered, completed_ms=5))
    assert R.loads(fast) == R.loads(slow) == _old_loads(slow)
    assert R.job_record(fast, key="0:1", partition=0) == R.job_record(slow, key="0:1", partition=0)
    assert R.job_record(fast, key="0:1", partition=0)[0].answered is answered


@pytest.mark.parametrize(
    "edit",
    [
        lambda v: v["turns"][0].update(extra=1),  # a field Turn does not have: Turn(**) refuses it
        lambda v: v["turns"][0].update(start_ns=1.0),  # a float where an int was written: kept as json kept it
        lambda v: v["turns"][0].update(input=5),
        lambda v: v.update(version="3", has_error=0),  # coerced by job_from_json
        lambda v: v["turns"][0].pop("is_error"),  # its default
        lambda v: v["turns"][0].pop("span_id"),  # missing: refused by both
        lambda v: v.pop("sampled"),
        lambda v: v.update(extra={"any": [1, 2]}),  # ignored by both
    ],
)
def test_job_record_agrees_with_json_on_records_it_does_not_expect(edit: Any) -> None:
    value = R.job_to_json(_job(), sampled=False, completed_ms=5)
    edit(value)
    encoded = R.dumps(value)
    try:
        expected: Any = _old_job(encoded)
    except Exception as exc:
        with pytest.raises(type(exc)):
            R.job_record(encoded, key="0:1", partition=0)
        return
    got = R.job_record(encoded, key="0:1", partition=0)
    assert got == expected
    assert [type(t.start_ns) for t in got[0].exchanges] == [type(t.start_ns) for t in expected[0].exchanges]


@pytest.mark.parametrize(
    "text",
    [
        b'{"a":NaN}',
        b'{"a":1e400}',
        b'{"a":"\\ud800"}',
        b'{"a":123456789012345678901234567890}',
        b'[1.5,-0.0,"\\u00e9"]',
    ],
)
def test_loads_is_json_loads(text: bytes) -> None:
    got, expected = R.loads(text), _old_loads(text)
    assert repr(got) == repr(expected)  # NaN != NaN: compared by repr


@pytest.mark.parametrize("content_id", ["", "abc", 'é"\\\n\x00\x1f\x7f\u2028😀', "\ud800 lone"])
def test_verdict_value_is_dumps(content_id: str) -> None:
    assert R.verdict_value(content_id, "judged") == R.dumps({"content_id": content_id, "outcome": "judged"})
