"""A conversation's outcome records, built once and copied per metric, are exactly the records built per metric."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from tracejudge.consumer.adapters import Turn
from tracejudge.consumer.conversation.job import JudgeJob
from tracejudge.consumer.emit.results_topic import ResultsTopic
from tracejudge.consumer.judging.judgement import (
    OUTCOME_FAILED,
    OUTCOME_RETRYING,
    OUTCOME_SAMPLED_OUT,
    OUTCOME_SKIPPED_BUDGET,
    Judgement,
    Retry,
)
from tracejudge.consumer.judging.results import outcome_record, outcome_records

METRICS = ["failure_rate", "conversational_flow", "custom"]


def _judgement(outcome: str) -> Judgement:
    turns = (
        Turn("s1", "t1", "", 10**18, 10**18 + 5, "q é", "a"),
        Turn("s2", "t2", "s1", 2 * 10**18, 3 * 10**18, None, "b"),
    )
    job = JudgeJob("0:1", "conv\ud800", "agent", 0, 2, turns, False, False, True, "end", "content", 1_700_000_000_000)
    retry = Retry(attempt=2, reason="server_error", first_failed_at=1.7e9, until=1.8e9, next_at=1.75e9)
    return Judgement(job, outcome, judged_at=1.7e9 + 0.5, retry=retry, sample_rate=0.25)


@pytest.mark.parametrize("outcome", [OUTCOME_SAMPLED_OUT, OUTCOME_FAILED, OUTCOME_SKIPPED_BUDGET, OUTCOME_RETRYING])
def test_outcome_records_are_outcome_record_per_metric(outcome: str) -> None:
    judgement = _judgement(outcome)
    expected = [outcome_record(judgement, metric) for metric in METRICS]
    got = outcome_records(judgement, METRICS)
    assert [json.dumps(r, ensure_ascii=False) for r in got] == [json.dumps(r, ensure_ascii=False) for r in expected]
    assert len({r["result_id"] for r in got}) == len(METRICS)
    assert outcome_records(judgement, []) == []


class Writer:
    def __init__(self) -> None:
        self.values: list[bytes] = []

    def write(self, key: bytes, value: bytes) -> threading.Event:
        self.values.append(value)
        return threading.Event()


def test_the_results_topic_writes_json_dumps_of_each_record() -> None:
    writer = Writer()
    judgement = _judgement(OUTCOME_SAMPLED_OUT)
    topic = ResultsTopic(writer, METRICS)  # type: ignore[arg-type]
    assert len(topic.emit(judgement)) == len(METRICS)
    expected: list[Any] = [outcome_record(judgement, metric) for metric in METRICS]
    assert writer.values == [json.dumps(r, ensure_ascii=False).encode("utf-8", "surrogatepass") for r in expected]
