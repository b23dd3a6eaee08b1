"""The batch and flex tiers through the real consumer on the Tansu broker, the judge a local server speaking the
OpenAI chat, Files and Batches API behind LiteLLM over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.consumer.test_pipeline import Collect
from tests.support.judge_server import JudgeServer, Reply, conversation_text, metric_of
from tests.support.pipeline import (
    ROOT,
    RunningConsumer,
    consumer_process,
    consumer_settings,
    play,
    read_all,
    traced_app,
    wait_for,
)
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.streams.batch_store import batches_topic
from tracejudge.metrics._litellm import _import_litellm
from tracejudge.metrics.tiers import TIER_BATCH, TIER_STANDARD, tier_cost

LABELS = ["hallucination", "stall", "mixed", "honest_fallback", "alternative_proposed", "not_applicable"]
FLOW = ["fully", "mostly", "partial", "minor", "none"]
CONVERSATIONS = 200


def number_of(request: dict) -> int:
    return int(conversation_text(request).split("tier question ", 1)[1].split(" ", 1)[0])


def scripted(request: dict) -> Reply:
    """The verdict follows from the conversation's number, whichever tier asks; numbers 7, 57, ... fail (500)."""
    number = number_of(request)
    if metric_of(request) == "conversational_flow":
        return Reply(content=json.dumps({"verdict": FLOW[number % 5], "key_issues": [], "reason": f"f{number}"}))
    if number % 50 == 7:
        return Reply(status=500, content="scripted item failure")
    return Reply(content=json.dumps({"verdict": LABELS[number % 6], "evidence": [], "reason": f"r{number}"}))


def conversations(prefix: str, count: int) -> dict[str, list[tuple[str, str]]]:
    return {f"{prefix}-{i}": [(f"tier question {i} about things", f"answer {i}")] for i in range(count)}


def verdicts(collect: Collect) -> dict[tuple[str, str], tuple]:
    with collect.lock:
        return {
            (j.job.conversation_id.split("-", 1)[1], r.name): (
                r.verdict,
                None if r.error else r.reason,  # a failure's reason is the provider's message, worded per tier
                r.rubric_version,
                r.error_kind,
            )
            for j in collect.judgements
            for r in j.results
        }


def run_tier(broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tier: str, prefix: str) -> tuple:
    """The consumer up and owning its partitions first, then the conversations: the delay is the tier's own."""
    collect = Collect()
    settings = consumer_settings(
        broker.bootstrap_servers,
        topic,
        judge_model="gpt-5-mini",
        judge_tier=tier,
        judge_batch_size=500,
        judge_batch_wait=1.0,
        judge_batch_poll=0.2,
        max_cost_per_hour=100.0,
        session_idle_timeout=1.0,
    )
    with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
        assert consumer.app.service.assigned.wait(60), "partitions not assigned"
        play(traced_app(broker.bootstrap_servers, topic), conversations(prefix, CONVERSATIONS))
        wait_for(lambda: len(collect.ids()) >= CONVERSATIONS, timeout=120, what=f"{tier}: every conversation judged")

        def delivered() -> float:
            return sum(
                consumer.value("tracejudge_verdict_delay_seconds_count", metric=m)
                for m in ("failure_rate", "conversational_flow")
            )

        wait_for(lambda: delivered() >= 2 * CONVERSATIONS, timeout=30, what="every verdict delivered")
        delay_sum = sum(
            consumer.value("tracejudge_verdict_delay_seconds_sum", metric=m)
            for m in ("failure_rate", "conversational_flow")
        )
        delay_count = sum(
            consumer.value("tracejudge_verdict_delay_seconds_count", metric=m)
            for m in ("failure_rate", "conversational_flow")
        )
        wait_for(lambda: consumer.app.service.pool.budget.spent() > 0, timeout=10, what="spend recorded")
        spent = consumer.app.service.pool.budget.spent()
        batches = consumer.value("tracejudge_judge_batches_total", event="submitted")
        cost_metric = sum(
            consumer.value("tracejudge_judge_cost_usd_total", metric=m, model="gpt-5-mini", purpose="live")
            for m in ("failure_rate", "conversational_flow")
        )
    return collect, delay_sum / max(1, delay_count), delay_count, spent, cost_metric, batches


def test_batch_tier_matches_standard_at_half_price(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    judge_server.responder = scripted
    _import_litellm()  # both runs warm: the delay measured is the tier's, not LiteLLM's import
    standard, standard_delay, _, standard_spent, _, _ = run_tier(broker, topic, judge_server, TIER_STANDARD, "std")
    assert judge_server.batch.created == []

    topic_b = f"{topic}-b"
    broker.create_topic(topic_b, partitions=3)
    batched, batch_delay, delays, batch_spent, cost_metric, batches = run_tier(
        broker, topic_b, judge_server, TIER_BATCH, "bat"
    )

    assert len(verdicts(batched)) == 2 * CONVERSATIONS
    assert verdicts(batched) == verdicts(standard)  # verdict, reason, rubric version, failure reason: identical
    failed = [k for k, v in verdicts(batched).items() if v[3] is not None]
    assert len(failed) == 4 and all(v[3] == "server_error" for k, v in verdicts(batched).items() if k in failed)
    assert batches == len(judge_server.batch.created)  # counted
    assert 1 <= len(judge_server.batch.created) <= 3  # gathered: 400 requests in a few batches, not 400 calls
    assert delays == 2 * CONVERSATIONS
    # Priced at the batch tier: half the standard price for the same tokens, in the budget and in the metric.
    with batched.lock:
        results = [r for j in batched.judgements for r in j.results if r.error is None]
    for result in results:
        assert result.tier == TIER_BATCH
        usage = {"input_tokens": result.input_tokens, "output_tokens": result.output_tokens}
        assert result.cost_usd == pytest.approx(tier_cost("openai/gpt-5-mini", TIER_BATCH, **usage))
        assert result.cost_usd == pytest.approx(tier_cost("openai/gpt-5-mini", TIER_STANDARD, **usage) / 2)
    assert batch_spent == pytest.approx(sum(r.cost_usd for r in results))
    assert cost_metric == pytest.approx(batch_spent)
    assert batch_spent == pytest.approx(standard_spent / 2, rel=0.02)
    print(f"verdict delay: standard {standard_delay:.2f}s, batch {batch_delay:.2f}s (mean)")  # docs/tiers.md
    assert batch_delay < 60  # the batch's wait (1 s), the server's batch (0.25 s) and polls (0.2 s): seconds here


def test_kill_9_after_submission_polls_the_same_batch(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = scripted
    judge_server.batch.script.hold.clear()  # submitted batches stay in_progress until released
    results, group = f"{topic}-results", f"tiers-{uuid.uuid4().hex[:6]}"
    broker.create_topic(results, 1)
    count = 60
    play(traced_app(broker.bootstrap_servers, topic), conversations("kill", count))
    env = {
        "TRACEJUDGE_JUDGE_MODEL": "gpt-5-mini",
        "TRACEJUDGE_JUDGE_TIER": "batch",
        "TRACEJUDGE_JUDGE_BATCH_WAIT": "1",
        "TRACEJUDGE_JUDGE_BATCH_POLL": "0.2",
        "TRACEJUDGE_SESSION_IDLE_TIMEOUT": "1",
    }
    log = tmp_path / "consumer.log"
    process = consumer_process(broker, topic, group, results, log=log, **env)
    try:
        wait_for(lambda: len(judge_server.batch.created) == 1, timeout=90, what="the batch submitted")
        recorded = lambda: [  # noqa: E731
            json.loads(r.value) for r in read_all(broker.bootstrap_servers, batches_topic(group), timeout_s=5)
        ]
        wait_for(lambda: any(r.get("batch_id") for r in recorded()), timeout=30, what="the batch id recorded")
        process.kill()
        process.wait(10)
        process = consumer_process(broker, topic, group, results, log=log, **env)
        wait_for(lambda: "resumed" in log.read_text(), timeout=90, what="the batch resumed after the restart")
        judge_server.batch.script.hold.set()
        wait_for(
            lambda: len(read_all(broker.bootstrap_servers, results, timeout_s=5)) >= count,
            timeout=90,
            what="every conversation judged",
        )
        from tests.reliability.test_crash import at_ends, committed_offsets, ends

        queue = f"{group}-judge-queue"
        queue_ends = ends(broker.bootstrap_servers, queue)
        wait_for(  # the barrier: every job's outcome durable and committed, so nothing more is on its way
            lambda: at_ends(committed_offsets(broker.bootstrap_servers, queue, f"{group}-judges"), queue_ends),
            timeout=90,
            what="every judge-queue job committed",
        )
        records = [json.loads(r.value) for r in read_all(broker.bootstrap_servers, results)]
    finally:
        judge_server.batch.script.hold.set()
        process.terminate()
        process.wait(30)
    assert len(judge_server.batch.created) == 1 and judge_server.batch.uploads == 1, log.read_text()[-3000:]
    ids = sorted(r["conversation_id"] for r in records)
    assert ids == sorted(f"kill-{i}" for i in range(count))  # every conversation judged once
    assert len(judge_server.requests) == count  # the batch's lines only: nothing was asked twice


@pytest.mark.parametrize(
    ("models", "flag"),
    [
        (["--judge-model", "mistral/small"], "--judge-model"),
        (["--judge-model", "gpt-5-mini", "--shadow-judge-model", "mistral/small"], "--shadow-judge-model"),
    ],
)
def test_batch_tier_without_a_batch_api_exits_2(models: list[str], flag: str) -> None:
    """Said before anything reaches a broker or a provider (none runs here), naming the flag at fault."""
    completed = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "--judge-tier", "batch", *models],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert completed.returncode == 2
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no Batch API" in lines[0] and f"({flag} 'mistral/small')" in lines[0], lines


def test_flex_tier_falls_back_to_standard_counted(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    judge_server.responder = scripted
    refused = iter([True, False, False] * 20)
    judge_server.flex_refuse = lambda _body: next(refused, False)
    collect = Collect()
    settings = consumer_settings(
        broker.bootstrap_servers,
        topic,
        judge_model="gpt-5-mini",
        judge_tier="flex",
        metrics=["failure_rate"],
        session_idle_timeout=1.0,
    )
    with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
        assert consumer.app.service.assigned.wait(60), "partitions not assigned"
        play(traced_app(broker.bootstrap_servers, topic), conversations("flex", 30))
        wait_for(lambda: len(collect.ids()) >= 30, timeout=60, what="every conversation judged")
        fallbacks = consumer.value("tracejudge_judge_tier_fallbacks_total", metric="failure_rate", model="gpt-5-mini")
    assert judge_server.flex_refused >= 10 and fallbacks == judge_server.flex_refused
    with collect.lock:
        results = [r for j in collect.judgements for r in j.results]
    assert sum(r.tier_fallbacks for r in results) == judge_server.flex_refused
    assert {r.tier for r in results if r.tier_fallbacks == 0 and r.error is None} == {"flex"}
    assert [r.verdict for r in sorted(results, key=lambda r: r.reason) if r.error is None]  # judged either way


def test_an_expired_batch_is_resubmitted_once_through_the_consumer(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    judge_server.responder = lambda request: Reply(
        content=json.dumps({"verdict": LABELS[number_of(request) % 6], "evidence": [], "reason": "r"})
    )
    judge_server.batch.script.outcomes = ["expired", "expired"]  # the first batch, then its resubmission
    judge_server.batch.script.expire_after_items = 10
    collect = Collect()
    settings = consumer_settings(
        broker.bootstrap_servers,
        topic,
        judge_model="gpt-5-mini",
        judge_tier="batch",
        metrics=["failure_rate"],
        judge_batch_wait=1.0,
        judge_batch_poll=0.2,
        session_idle_timeout=1.0,
    )
    with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
        assert consumer.app.service.assigned.wait(60), "partitions not assigned"
        play(traced_app(broker.bootstrap_servers, topic), conversations("exp", 30))
        wait_for(lambda: len(collect.ids()) >= 30, timeout=60, what="every conversation has its outcome")
        events = {e: consumer.value("tracejudge_judge_batches_total", event=e) for e in ("resubmitted", "expired")}
        errors = consumer.value("tracejudge_judge_errors_total", metric="failure_rate", reason="batch_expired")
    with collect.lock:
        results = [r for j in collect.judgements for r in j.results]
    judged = [r for r in results if r.error is None]
    expired = [r for r in results if r.error_kind == "batch_expired"]
    # 10 answered before the first expiry, 10 of the 20 resubmitted before the second; the last 10 fail, counted.
    assert (len(judged), len(expired), errors) == (20, 10, 10.0)
    assert len(judge_server.batch.created) == 2 and events == {"resubmitted": 1.0, "expired": 1.0}


def test_a_budget_holds_at_the_batch_tier_before_any_batch_settled(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    """A batch settles minutes to hours after its requests were reserved: until then the budget reserves each
    request at its own estimate (prompt at the batch price), not at an unknown zero that would let a whole batch
    through a budget worth three calls."""
    from tracejudge.metrics import ConversationalEvalTestCase, EvalTestCase, FailureRateMetric
    from tracejudge.metrics._backends import LiteLLMBackend

    judge_server.responder = lambda request: Reply(
        content=json.dumps({"verdict": LABELS[number_of(request) % 6], "evidence": [], "reason": "r"})
    )
    _import_litellm()
    judge = FailureRateMetric(LiteLLMBackend("gpt-5-mini", tier=TIER_BATCH))
    case = ConversationalEvalTestCase(
        name="x", turns=[EvalTestCase(input="tier question 10 about things", actual_output="answer 10")]
    )
    per_call = judge.estimated_cost(case)
    assert per_call > 0
    collect = Collect()
    settings = consumer_settings(
        broker.bootstrap_servers,
        topic,
        judge_model="gpt-5-mini",
        judge_tier="batch",
        metrics=["failure_rate"],
        judge_batch_wait=1.0,
        judge_batch_poll=0.2,
        max_cost_per_hour=per_call * 3.5,
        session_idle_timeout=1.0,
    )
    with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
        assert consumer.app.service.assigned.wait(60), "partitions not assigned"
        play(traced_app(broker.bootstrap_servers, topic), conversations("bud", 20))
        wait_for(lambda: len(collect.ids()) >= 20, timeout=60, what="every conversation has its outcome")
        judged, skipped = consumer.sessions("judged"), consumer.sessions("skipped_budget")
    lines = sum(
        len(judge_server.batch.files[judge_server.batch.batches[b]["input_file_id"]]["content"].splitlines())
        for b in judge_server.batch.created
    )
    assert (judged, skipped) == (3, 17), (judged, skipped)
    assert lines == 3  # three requests paid for, not twenty


def test_a_replica_joining_while_a_batch_is_in_flight_delivers_each_verdict_once(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    """Scale-out mid-batch: judge-queue partitions move to the new replica while their judgements wait for a batch.
    The new owner finds the batch in the batch records and waits for it; the old owner cancels those judgements
    (it would deliver them too). One batch paid for, one verdict per conversation, every job committed."""
    from tests.reliability.test_crash import at_ends, committed_offsets, ends

    judge_server.responder = scripted
    judge_server.batch.script.hold.clear()  # the batch stays in_progress until released
    results, group = f"{topic}-results", f"tiers-{uuid.uuid4().hex[:6]}"
    broker.create_topic(results, 1)
    count = 40
    play(traced_app(broker.bootstrap_servers, topic), conversations("join", count))
    env = {
        "TRACEJUDGE_JUDGE_MODEL": "gpt-5-mini",
        "TRACEJUDGE_JUDGE_TIER": "batch",
        "TRACEJUDGE_JUDGE_BATCH_WAIT": "1",
        "TRACEJUDGE_JUDGE_BATCH_POLL": "0.2",
        "TRACEJUDGE_SESSION_IDLE_TIMEOUT": "1",
    }
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = consumer_process(broker, topic, group, results, log=first_log, **env)
    second = None
    try:
        wait_for(lambda: len(judge_server.batch.created) == 1, timeout=90, what="the batch submitted")
        recorded = lambda: [  # noqa: E731
            json.loads(r.value)
            for r in read_all(broker.bootstrap_servers, batches_topic(group), timeout_s=5)
            if r.value is not None
        ]
        wait_for(lambda: any(r.get("batch_id") for r in recorded()), timeout=30, what="the batch id recorded")
        second = consumer_process(broker, topic, group, results, log=second_log, **env)
        wait_for(
            lambda: "judge-queue partitions assigned" in second_log.read_text(),
            timeout=90,
            what="judge-queue partitions moved to the new replica",
        )
        judge_server.batch.script.hold.set()
        wait_for(
            lambda: len(read_all(broker.bootstrap_servers, results, timeout_s=5)) >= count,
            timeout=90,
            what="every conversation judged",
        )
        queue = f"{group}-judge-queue"
        queue_ends = ends(broker.bootstrap_servers, queue)
        wait_for(  # the barrier: every job's outcome durable and committed, so nothing more is on its way
            lambda: at_ends(committed_offsets(broker.bootstrap_servers, queue, f"{group}-judges"), queue_ends),
            timeout=90,
            what="every judge-queue job committed",
        )
        records = [json.loads(r.value) for r in read_all(broker.bootstrap_servers, results)]
    finally:
        judge_server.batch.script.hold.set()
        for process in (first, second):
            if process is not None:
                process.terminate()
                process.wait(30)
    logs = first_log.read_text()[-2000:] + second_log.read_text()[-2000:]
    assert len(judge_server.batch.created) == 1 and judge_server.batch.uploads == 1, logs
    ids = sorted(r["conversation_id"] for r in records)
    assert ids == sorted(f"join-{i}" for i in range(count)), logs  # each verdict delivered once
