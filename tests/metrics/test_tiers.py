"""The flex and batch tiers against the local judge server (OpenAI chat, Files and Batches API) through LiteLLM."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.judge_server import JudgeServer, Reply, conversation_text, verdict
from tracejudge.metrics import ConversationalEvalTestCase, EvalTestCase, FailureRateMetric
from tracejudge.metrics._backends import LiteLLMBackend
from tracejudge.metrics.batch import ERROR_BATCH_EXPIRED, BatchBackend, BatchCoordinator, MemoryBatchStore
from tracejudge.metrics.tiers import TIER_BATCH, TIER_FLEX, TIER_STANDARD, has_tier_price, tier_cost, tier_prices

LABELS = ["hallucination", "stall", "mixed", "honest_fallback", "alternative_proposed", "not_applicable"]


def conversation(i: int) -> ConversationalEvalTestCase:
    return ConversationalEvalTestCase(
        name=f"c{i}", turns=[EvalTestCase(input=f"question {i}", actual_output=f"answer number {i}")]
    )


def scripted(request: dict) -> Reply:
    """The same answer for the same conversation, whichever tier asks."""
    text = conversation_text(request)
    index = int(text.split("answer number ")[1].split('"')[0].split("\\")[0])
    return verdict(LABELS[index % len(LABELS)], reason=f"r{index}")


def coordinator(store: MemoryBatchStore | None = None, **kwargs: object) -> BatchCoordinator:
    options: dict = {"batch_size": 100, "batch_wait_s": 0.2, "poll_s": 0.05, "store": store or MemoryBatchStore()}
    options.update(kwargs)
    return BatchCoordinator("openai/gpt-5-mini", **options)


def batch_metric(coord: BatchCoordinator) -> FailureRateMetric:
    return FailureRateMetric(BatchBackend("gpt-5-mini", coord), timeout=60.0, max_retries=0)


def test_tier_prices_from_litellms_map() -> None:
    assert tier_prices("openai/gpt-5-mini", TIER_FLEX).input == pytest.approx(1.25e-07)
    assert tier_prices("openai/gpt-5-mini", TIER_BATCH).cache_read == pytest.approx(1.25e-08)
    assert tier_prices("anthropic/claude-haiku-4-5", TIER_BATCH).cache_write == pytest.approx(6.25e-07)
    assert not has_tier_price("openai/gpt-4o-mini", TIER_FLEX) and has_tier_price("openai/gpt-4o-mini", TIER_BATCH)
    usage = {"input_tokens": 1000, "output_tokens": 100, "cached_input_tokens": 800}
    standard = tier_cost("openai/gpt-5-mini", TIER_STANDARD, **usage)
    assert tier_cost("openai/gpt-5-mini", TIER_BATCH, **usage) == pytest.approx(standard / 2)


async def test_flex_sends_service_tier_and_falls_back_on_capacity(judge_server: JudgeServer) -> None:
    judge_server.responder = scripted
    refusals = iter([True, False])
    judge_server.flex_refuse = lambda _body: next(refusals, False)
    metric = FailureRateMetric(LiteLLMBackend("gpt-5-mini", tier=TIER_FLEX), timeout=30.0, max_retries=0)
    first = await metric.evaluate(conversation(1))  # refused for flex capacity: judged at standard
    second = await metric.evaluate(conversation(1))
    assert first.error is None and second.error is None
    assert (first.verdict, second.verdict) == (LABELS[1], LABELS[1])
    assert (first.tier, first.tier_fallbacks) == (TIER_STANDARD, 1)
    assert (second.tier, second.tier_fallbacks) == (TIER_FLEX, 0)
    assert judge_server.flex_requests == 2 and judge_server.flex_refused == 1
    tiers = [r.get("service_tier") for r in judge_server.requests]
    assert tiers == [None, "flex"]  # the fallback went out without the flex tier
    assert second.cost_usd == pytest.approx(
        tier_cost("openai/gpt-5-mini", TIER_FLEX, input_tokens=second.input_tokens, output_tokens=second.output_tokens)
    )


async def test_batch_verdicts_match_standard(judge_server: JudgeServer) -> None:
    judge_server.responder = scripted
    standard = FailureRateMetric("gpt-5-mini", timeout=30.0)
    expected = [await standard.evaluate(conversation(i)) for i in range(12)]
    coord = coordinator()
    metric = batch_metric(coord)
    results = await asyncio.gather(*(metric.evaluate(conversation(i)) for i in range(12)))
    assert [(r.verdict, r.reason, r.rubric_version) for r in results] == [
        (e.verdict, e.reason, e.rubric_version) for e in expected
    ]
    assert all(r.tier == TIER_BATCH for r in results)
    assert len(judge_server.batch.created) == 1 and coord.submissions == 1
    for r in results:  # half the standard price for the same usage
        full = tier_cost("openai/gpt-5-mini", TIER_STANDARD, input_tokens=r.input_tokens, output_tokens=r.output_tokens)
        assert r.cost_usd == pytest.approx(full / 2)
    # the batch's requests are the standard request bodies
    batch_bodies = judge_server.requests[12:]
    assert {json.dumps(b["response_format"], sort_keys=True) for b in batch_bodies} == {
        json.dumps(FailureRateMetric.response_format(), sort_keys=True)
    }


async def test_batch_size_splits_and_failed_items_are_failures(judge_server: JudgeServer) -> None:
    def respond(request: dict) -> Reply:
        if "answer number 3" in conversation_text(request):
            return Reply(status=500, content="scripted item failure")
        return scripted(request)

    judge_server.responder = respond
    coord = coordinator(batch_size=4)
    metric = batch_metric(coord)
    results = await asyncio.gather(*(metric.evaluate(conversation(i)) for i in range(8)))
    assert len(judge_server.batch.created) == 2
    failed = [r for r in results if r.error is not None]
    assert [r.error_kind for r in failed] == ["server_error"] and "batch item failed (500)" in failed[0].error
    assert [r.verdict for r in results if r.error is None] == [LABELS[i % 6] for i in range(8) if i != 3]


async def test_expired_batch_resubmitted_once_then_fails(judge_server: JudgeServer) -> None:
    judge_server.responder = scripted
    judge_server.batch.script.outcomes = ["expired"]
    judge_server.batch.script.expire_after_items = 2
    metric = batch_metric(coordinator())
    results = await asyncio.gather(*(metric.evaluate(conversation(i)) for i in range(5)))
    assert [r.error for r in results] == [None] * 5  # 2 answered before the expiry, 3 in the resubmission
    assert len(judge_server.batch.created) == 2

    judge_server.batch.script.outcomes = ["expired", "cancelled"]
    judge_server.batch.script.expire_after_items = 0
    metric = batch_metric(coordinator())
    results = await asyncio.gather(*(metric.evaluate(conversation(i)) for i in range(10, 13)))
    assert {r.error_kind for r in results} == {ERROR_BATCH_EXPIRED}
    assert len(judge_server.batch.created) == 4


async def test_restart_polls_the_same_batch_and_never_pays_twice(judge_server: JudgeServer) -> None:
    judge_server.responder = scripted
    judge_server.batch.script.hold.clear()  # batches stay in_progress until released
    store = MemoryBatchStore()
    first = batch_metric(coordinator(store))
    calls = [asyncio.ensure_future(first.evaluate(conversation(i))) for i in range(6)]

    async def submitted() -> None:
        for _ in range(500):  # a condition with a deadline (10 s), polled: the store has no notification
            if any(r.get("state") == "submitted" for r in store.load()):
                return
            await asyncio.sleep(0.02)
        raise AssertionError("the batch was not recorded as submitted within 10 s")

    await submitted()
    for call in calls:  # the process dies: its calls are gone, the batch record is not
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)

    second_coordinator = coordinator(store)
    second = batch_metric(second_coordinator)
    judge_server.batch.script.hold.set()
    results = await asyncio.wait_for(asyncio.gather(*(second.evaluate(conversation(i)) for i in range(6))), 20)
    assert [r.verdict for r in results] == [LABELS[i % 6] for i in range(6)]
    assert len(judge_server.batch.created) == 1 and second_coordinator.submissions == 0
    assert judge_server.batch.uploads == 1


async def test_batch_recorded_but_never_created_is_found_or_resubmitted(judge_server: JudgeServer) -> None:
    judge_server.responder = scripted
    store = MemoryBatchStore()
    coord = coordinator(store)
    first = await batch_metric(coord).evaluate(conversation(1))
    assert first.error is None
    # A record whose process died before the provider's id was written: looked up by its metadata key.
    record = dict(next(iter(store.load())), state="submitting", batch_id=None)
    fresh = MemoryBatchStore()
    fresh.save(record)
    again = coordinator(fresh)
    result = await batch_metric(again).evaluate(conversation(1))
    assert result.verdict == first.verdict and again.submissions == 0
    assert len(judge_server.batch.created) == 1


async def test_a_recorded_batch_the_provider_never_created_is_submitted_again(judge_server: JudgeServer) -> None:
    """Killed after recording a batch and before creating it: no batch carries its key, so the replayed request is
    submitted in a new batch and answered, not left waiting (for the 2-day call timeout) on a batch that never was."""
    judge_server.responder = scripted
    probe_store = MemoryBatchStore()
    first = await batch_metric(coordinator(probe_store)).evaluate(conversation(1))
    assert first.error is None
    record = dict(next(iter(probe_store.load())), state="submitting", batch_id=None, key="never-created")
    store = MemoryBatchStore()
    store.save(record)
    created = len(judge_server.batch.created)
    result = await asyncio.wait_for(batch_metric(coordinator(store)).evaluate(conversation(1)), 30)
    assert result.error is None and result.verdict == first.verdict
    assert len(judge_server.batch.created) == created + 1


def test_flex_without_a_flex_price_says_so_and_judges_at_standard(caplog: pytest.LogCaptureFixture) -> None:
    from tracejudge.consumer.app import build_judges
    from tracejudge.consumer.settings import Settings

    caplog.set_level("WARNING")
    judges = build_judges(Settings(judge_model="gpt-4o-mini", judge_tier="flex", metrics=["failure_rate"]))
    assert not isinstance(judges[0].backend, LiteLLMBackend) or judges[0].backend.tier == TIER_STANDARD
    assert "no flex price" in caplog.text
    flex = build_judges(Settings(judge_model="gpt-5-mini", judge_tier="flex", metrics=["failure_rate"]))
    assert flex[0].backend.tier == TIER_FLEX and flex[0].timeout >= 900


async def test_a_replay_after_the_batch_was_answered_reads_its_output_again(judge_server: JudgeServer) -> None:
    """Killed after the answers came and before the verdicts were committed: the replayed judgement is not paid
    for again, its batch's output is read again."""
    judge_server.responder = scripted
    store = MemoryBatchStore()
    first = await batch_metric(coordinator(store)).evaluate(conversation(4))
    for _ in range(250):  # recorded done just after the answers were handed out (5 s deadline)
        if [r["state"] for r in store.load()] == ["done"]:
            break
        await asyncio.sleep(0.02)
    assert [r["state"] for r in store.load()] == ["done"]
    again = coordinator(store)
    replayed = await batch_metric(again).evaluate(conversation(4))
    assert (replayed.verdict, replayed.cost_usd) == (first.verdict, first.cost_usd)
    assert again.submissions == 0 and len(judge_server.batch.created) == 1


async def done_record(store: MemoryBatchStore) -> None:
    for _ in range(250):  # recorded done just after the answers were handed out (5 s deadline)
        if [r["state"] for r in store.load()] == ["done"]:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not recorded done: {store.load()}")


async def test_asked_again_in_the_same_process_after_its_batch_was_answered_is_not_paid_twice(
    judge_server: JudgeServer,
) -> None:
    """A partition revoked and handed back: its job is read again by the process that judged it. The answered
    batch is no longer followed nor held in memory with its bodies, yet the replay reads its output again."""
    judge_server.responder = scripted
    store = MemoryBatchStore()
    coord = coordinator(store)
    first = await batch_metric(coord).evaluate(conversation(3))
    await done_record(store)
    for _ in range(250):  # retired by the same coroutine once its done record is written: a step or more later
        if coord._batches == {}:
            break
        await asyncio.sleep(0.02)
    assert coord._batches == {}  # not followed, its request bodies not kept
    replayed = await batch_metric(coord).evaluate(conversation(3))
    assert (replayed.verdict, replayed.cost_usd) == (first.verdict, first.cost_usd)
    assert coord.submissions == 1 and len(judge_server.batch.created) == 1


async def test_an_answered_batch_is_remembered_from_its_answer_not_its_creation_then_tombstoned(
    judge_server: JudgeServer,
) -> None:
    from tracejudge.metrics.batch import DONE_RETENTION_S

    judge_server.responder = scripted
    store = MemoryBatchStore()
    await batch_metric(coordinator(store)).evaluate(conversation(5))
    await done_record(store)
    (record,) = store.load()
    answered_at = record["done_at"]
    record["created"] -= 2 * DONE_RETENTION_S  # a batch that took two hours: answered just now
    again = coordinator(store)
    await batch_metric(again).evaluate(conversation(5))
    assert again.submissions == 0  # its output read again, not paid for twice
    for _ in range(250):  # written again by the replay's reading
        if store.load()[0]["done_at"] != answered_at:
            break
        await asyncio.sleep(0.02)
    (record,) = store.load()
    record["done_at"] -= 2 * DONE_RETENTION_S  # answered two hours ago: nothing can replay it any more
    later = coordinator(store)
    await later._ready()
    for _ in range(100):
        if not store.load():
            break
        await asyncio.sleep(0.02)
    assert store.load() == []  # tombstoned: the compacted topic does not grow with every batch ever made
