"""Review of issue 26: a forced (negative-feedback) job for a transcript being judged without force."""

from __future__ import annotations

from dataclasses import replace

from tests.consumer.test_judge_worker_duplicates import Judges, Record, job_record
from tracejudge.consumer.judging.judgement import OUTCOME_SKIPPED_BUDGET, Judgement
from tracejudge.consumer.streams import records as R


def test_a_negative_feedback_job_is_not_given_the_budget_skip_of_the_unforced_job_it_copies() -> None:
    """Standard tier, partition moved from A to B: B re-reads job P (same transcript) and judges it; A's own P ends
    skipped for budget, so the assembler sends a forced job F (negative feedback: "judged whatever the budget")
    for the same transcript. B attaches F to P as a copy; P is skipped for budget on B too, F inherits the skip:
    the negative-feedback conversation is never judged."""
    judges = Judges()
    judges.read(job_record(5, "x"))
    plain = R.loads(job_record(9, "x").value)
    job, _sampled, ms = R.job_from_json(plain, key="0:9", partition=0)
    forced = Record(9, R.dumps(R.job_to_json(replace(job, negative_feedback=True), sampled=True, completed_ms=ms)))
    judges.read(forced)
    judges.judged(Judgement(judges.pool.submitted[0], OUTCOME_SKIPPED_BUDGET))
    # F judged (forced), not given P's skip
    assert [j.key for j in judges.pool.submitted] == ["0:5", "0:9"], judges.producer.acks
