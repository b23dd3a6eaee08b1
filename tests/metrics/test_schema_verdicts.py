"""Verdicts bound to a JSON schema, the per-model fallback ladder, and the rubric version, against the real judge
server through LiteLLM over HTTP (calls are counted at the server)."""

from __future__ import annotations

import asyncio
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import ClassVar

import pytest

from tests.support.judge_server import FAULTS, SEED_LABELS, JudgeServer, Reply, conversation_text, fault_reply, verdict
from tracejudge.metrics import (
    ConversationalEvalTestCase,
    ConversationalFlowRateMetric,
    EvalTestCase,
    FailureRateMetric,
    evaluate_conversations,
)
from tracejudge.metrics._errors import JudgeCallError
from tracejudge.metrics._judge import HolisticJudgeMetric
from tracejudge.metrics._provider_errors import classify_litellm_error
from tracejudge.metrics._response_modes import RESPONSE_MODES, rejects_response_format
from tracejudge.metrics.failure_rate import FAILURE_RATE_SYSTEM_PROMPT, FAILURE_RATE_WEIGHTS

CONVERSATION = ConversationalEvalTestCase(
    turns=[EvalTestCase(input="What is the population of Atlantis?", actual_output="About 12,000 people.")]
)


@pytest.fixture(autouse=True)
def fresh_modes() -> Iterator[None]:
    RESPONSE_MODES.forget()
    yield
    RESPONSE_MODES.forget()


def judge(
    metric_cls: type[HolisticJudgeMetric] = FailureRateMetric, model: str | None = None, **kwargs
) -> HolisticJudgeMetric:
    kwargs.setdefault("timeout", 10.0)
    metric = metric_cls(model or f"openai/model-{uuid.uuid4().hex[:8]}", **kwargs)
    metric.retry_policy.base_delay_s = 0.01
    return metric


def conversations(count: int, prefix: str = "c") -> list[ConversationalEvalTestCase]:
    return [
        ConversationalEvalTestCase(turns=[EvalTestCase(input=f"{prefix}-{i} question", actual_output="answer")])
        for i in range(count)
    ]


@pytest.mark.parametrize("metric_cls", [FailureRateMetric, ConversationalFlowRateMetric])
async def test_schema_enum_is_exactly_the_labels(judge_server: JudgeServer, metric_cls: type) -> None:
    judge_server.enqueue(
        Reply(content=json.dumps({"verdict": sorted(SEED_LABELS[metric_cls.name])[0], "evidence": [], "reason": "r"}))
    )
    result = await judge(metric_cls).evaluate(CONVERSATION)
    assert result.error is None and judge_server.schema_problems == []
    (request,) = judge_server.requests
    response_format = request["response_format"]
    assert response_format["type"] == "json_schema" and response_format["json_schema"]["strict"] is True
    schema = response_format["json_schema"]["schema"]
    assert set(schema["properties"]["verdict"]["enum"]) == set(metric_cls.weights) == SEED_LABELS[metric_cls.name]
    assert len(schema["properties"]["verdict"]["enum"]) == len(metric_cls.weights)
    assert schema["properties"]["verdict"]["type"] == "string" and "verdict" in schema["required"]


async def test_server_refuses_a_schema_that_is_not_the_labels(judge_server: JudgeServer) -> None:
    class Narrow(FailureRateMetric):
        weights: ClassVar[dict[str, float]] = {"hallucination": 0.0, "honest_fallback": 1.0}

    result = await judge(Narrow).evaluate(CONVERSATION)
    assert result.error_kind == "bad_request" and result.score is None
    assert judge_server.schema_problems and len(judge_server.requests) == 1  # not mistaken for a missing feature


async def test_schema_rejected_falls_back_to_json_mode_once_per_process(judge_server: JudgeServer) -> None:
    judge_server.reject_json_schema = True
    judge_server.responder = lambda request: verdict("honest_fallback")
    model = f"openai/no-schema-{uuid.uuid4().hex[:8]}"
    metric = judge(model=model)
    results = await evaluate_conversations(conversations(12), [metric], max_concurrency=8)
    assert all(r.metrics[0].verdict == "honest_fallback" for r in results)
    assert judge_server.response_modes() == ["json_schema"] + ["json_object"] * 12
    assert RESPONSE_MODES.mode(metric.backend.litellm_model) == "json_object"
    # Another judge on the same model in the same process starts from what was learnt.
    flow = judge(ConversationalFlowRateMetric, model=model)
    judge_server.responder = lambda request: verdict("mostly")
    await evaluate_conversations(conversations(4), [flow], max_concurrency=4)
    assert judge_server.response_modes()[13:] == ["json_object"] * 4


async def test_schema_and_json_mode_rejected_fall_back_to_text(judge_server: JudgeServer) -> None:
    judge_server.reject_json_schema = judge_server.reject_json_object = True
    judge_server.responder = lambda request: Reply(content='Verdict follows: {"verdict": "stall", "reason": "r"}')
    metric = judge()
    results = await evaluate_conversations(conversations(10), [metric], max_concurrency=10)
    assert [r.metrics[0].verdict for r in results] == ["stall"] * 10
    assert judge_server.response_modes() == ["json_schema", "json_object"] + ["text"] * 10


async def test_waiting_for_the_probe_is_not_part_of_the_timeout(judge_server: JudgeServer) -> None:
    """A slow judge (1 s of a 1.5 s timeout): the calls queued behind the probe still get their whole timeout."""
    await judge(model="openai/warm-up").evaluate(CONVERSATION)  # LiteLLM's first call in a process is slow
    judge_server.reject_json_schema = True
    judge_server.responder = lambda request: Reply(content=verdict("mixed").content, delay_s=1.0)
    metric = judge(timeout=1.5, max_retries=0)
    results = await evaluate_conversations(conversations(6), [metric], max_concurrency=6)
    assert [(r.metrics[0].verdict, r.metrics[0].attempts) for r in results] == [("mixed", 1)] * 6
    assert judge_server.response_modes()[1:] == ["json_schema"] + ["json_object"] * 6


async def test_models_learn_separately(judge_server: JudgeServer) -> None:
    judge_server.reject_json_schema = True
    await judge(model="openai/old-model").evaluate(CONVERSATION)
    judge_server.reject_json_schema = False
    await judge(model="openai/new-model").evaluate(CONVERSATION)
    await judge(model="openai/old-model").evaluate(CONVERSATION)
    assert judge_server.response_modes() == ["json_schema", "json_object", "json_schema", "json_object"]


async def test_a_failed_probe_hands_over_without_learning(judge_server: JudgeServer) -> None:
    """A probe that ends in a transient error teaches nothing; the waiting calls take over the probe."""
    judge_server.enqueue(Reply(status=500, content="boom"), Reply(status=500, content="boom"))
    judge_server.responder = lambda request: verdict("stall")
    metric = judge(max_retries=0)
    results = await evaluate_conversations(conversations(6), [metric], max_concurrency=6)
    verdicts = sorted(str(r.metrics[0].verdict) for r in results)
    assert verdicts == ["None", "None", "stall", "stall", "stall", "stall"]
    assert set(judge_server.response_modes()) == {"json_schema"}


async def test_transient_errors_that_name_the_format_are_not_rejections(judge_server: JudgeServer) -> None:
    """429, 500, 503 and a timeout whose bodies even mention response_format / json_schema: retried under the
    schema, never taken for the model refusing it."""

    def error(status: int, **extra: object) -> Reply:
        message = f"response_format json_schema: upstream busy ({status})"
        body = {"error": {"message": message, "type": "server_error", "param": "response_format", "code": None}}
        return Reply(status=status, raw_body=json.dumps(body).encode(), **extra)  # type: ignore[arg-type]

    await judge(model="openai/warm-up").evaluate(CONVERSATION)  # LiteLLM's first call in a process is slow
    judge_server.requests.clear()
    judge_server.enqueue(
        error(429, headers={"retry-after": "0.01"}),
        error(500),
        error(503),
        Reply(content=verdict("stall").content, delay_s=5.0),  # past the 2 s timeout
        verdict("mixed"),
    )
    metric = judge(timeout=2.0, max_retries=4)
    result = await metric.evaluate(CONVERSATION)
    assert (result.verdict, result.attempts) == ("mixed", 5)
    assert judge_server.response_modes() == ["json_schema"] * 5
    assert RESPONSE_MODES.mode(metric.backend.litellm_model) == "json_schema"


async def test_corrective_retry_stays_under_the_schema(judge_server: JudgeServer) -> None:
    judge_server.enqueue(Reply(content=json.dumps({"verdict": "excellent"})), verdict("mixed"))
    result = await judge().evaluate(CONVERSATION)
    assert result.verdict == "mixed" and result.attempts == 2
    first, second = judge_server.requests
    assert second["messages"][-2]["role"] == "assistant" and "excellent" in second["messages"][-2]["content"]
    assert first["response_format"] == second["response_format"] == FailureRateMetric.response_format()


def test_rejection_is_recognised_only_for_the_format() -> None:
    import litellm

    unsupported = litellm.UnsupportedParamsError(message="response_format not supported", model="m", llm_provider="x")
    assert rejects_response_format(unsupported, classify_litellm_error(unsupported))
    other = JudgeCallError("bad_request", "context length exceeded", retryable=False)
    assert not rejects_response_format(ValueError("context length exceeded"), other)


# --- rubric version -------------------------------------------------------------------------------------------


def version_of(**overrides: object) -> str:
    attributes = {"name": "failure_rate"} | overrides
    cls = type("Variant", (FailureRateMetric,), attributes)
    return cls("gpt-4o-mini").rubric_version


def test_rubric_version_format_and_what_changes_it() -> None:
    base = FailureRateMetric("gpt-4o-mini").rubric_version
    assert re.fullmatch(r"failure_rate@[0-9a-f]{12}", base)
    assert version_of() == base
    assert re.fullmatch(r"conversational_flow@[0-9a-f]{12}", ConversationalFlowRateMetric("m").rubric_version)
    # Prompt text, one weight, the schema: each is a new version.
    changed = {
        version_of(system_prompt=FAILURE_RATE_SYSTEM_PROMPT + " "),
        version_of(system_prompt=FAILURE_RATE_SYSTEM_PROMPT.replace("impartial", "neutral")),
        version_of(weights=FAILURE_RATE_WEIGHTS | {"stall": 0.45}),
        version_of(weights=FAILURE_RATE_WEIGHTS | {"off_topic": 0.5}),
        version_of(evidence_key="quotes"),
        version_of(
            response_format=classmethod(lambda cls, modes=None: {"type": "json_schema", "json_schema": {"name": "x"}})
        ),
    }
    assert base not in changed and len(changed) == 6
    # A prompt set on one instance is what that judge sends, and its version says so.
    edited = FailureRateMetric("gpt-4o-mini")
    edited.system_prompt = FAILURE_RATE_SYSTEM_PROMPT + "\nBe brief."
    assert edited.build_messages(CONVERSATION)[0]["content"] == edited.effective_system_prompt
    assert edited.effective_system_prompt.startswith(edited.system_prompt)  # the failure-mode taxonomy after it
    assert edited.rubric_version not in changed | {base}
    # Nothing else: model, threshold, timeout, retries, budget, redaction, label order.
    same = {
        FailureRateMetric("anthropic:claude-3-5-sonnet-latest", threshold=0.2, timeout=3, max_retries=0).rubric_version,
        FailureRateMetric("gpt-4o", transcript_budget_tokens=500, redactor=str.upper, verbose=True).rubric_version,
        version_of(weights=dict(reversed(list(FAILURE_RATE_WEIGHTS.items())))),
    }
    assert same == {base}


async def test_rubric_version_is_on_every_result(judge_server: JudgeServer) -> None:
    judge_server.enqueue(verdict("stall"), Reply(content="nope"), Reply(content="still nope"))
    metric = judge()
    ok = await metric.evaluate(CONVERSATION)
    failed = await metric.evaluate(CONVERSATION)
    assert ok.rubric_version == failed.rubric_version == metric.rubric_version
    assert failed.error_kind == "invalid_output"


# --- the measurement: corrective retries on the fault corpus ----------------------------------------------------

FAULT_CONVERSATIONS = 120
LABELS = sorted(SEED_LABELS["failure_rate"])


class FaultyJudge:
    """The fault corpus of tests/reliability/test_judge_faults.py: 30% of calls fail in one of seven ways (429, 500,
    timeout, hang, garbage, unknown label, empty); the rest answer a label. Seeded per conversation and call, so the
    figures do not depend on the order concurrent requests arrive in."""

    def __init__(self, seed: int = 7) -> None:
        self.seed = seed
        self.lock = threading.Lock()
        self.calls: dict[str, int] = {}

    def __call__(self, request: dict) -> Reply:
        found = re.search(r"faulty-\d+", conversation_text(request))
        conversation = found.group(0) if found else "unknown"
        with self.lock:
            call = self.calls[conversation] = self.calls.get(conversation, 0) + 1
        rng = random.Random(f"{self.seed}/{conversation}/{call}")
        roll = rng.random()
        fault = rng.choice(FAULTS)
        label = rng.choice(LABELS)
        if roll >= 0.3:
            return Reply(content=json.dumps({"verdict": label, "evidence": [], "reason": "ok"}))
        return fault_reply(fault, label)


def corrective_share(server: JudgeServer) -> float:
    """Share of judged conversations whose judgement needed the corrective retry (counted at the server)."""
    corrected = {
        match.group(0)
        for request in server.requests
        if any(m.get("role") == "assistant" for m in request.get("messages", []))
        and (match := re.search(r"faulty-\d+", conversation_text(request)))
    }
    return len(corrected) / FAULT_CONVERSATIONS


async def run_fault_corpus(server: JudgeServer, *, schema: bool, json_mode: bool) -> tuple[float, int]:
    server.requests.clear()
    server.responder = FaultyJudge(seed=7)
    server.constrain = True
    server.reject_json_schema = not schema
    server.reject_json_object = not json_mode
    RESPONSE_MODES.forget()
    metric = judge(timeout=1.0, max_retries=2)
    results = await evaluate_conversations(conversations(FAULT_CONVERSATIONS, "faulty"), [metric], max_concurrency=16)
    for result in results:  # never a made-up score, in every mode
        assert (result.metrics[0].score is None) == (result.metrics[0].error is not None)
    return corrective_share(server), sum(r.metrics[0].error_kind == "invalid_output" for r in results)


async def test_schema_cuts_corrective_retries_on_the_fault_corpus(judge_server: JudgeServer) -> None:
    text, text_invalid = await run_fault_corpus(judge_server, schema=False, json_mode=False)
    json_mode, json_invalid = await run_fault_corpus(judge_server, schema=False, json_mode=True)
    schema, schema_invalid = await run_fault_corpus(judge_server, schema=True, json_mode=True)
    print(
        f"\ncorrective-retry share over {FAULT_CONVERSATIONS} conversations (30% faults, seed 7): "
        f"text {text:.1%} ({text_invalid} invalid_output), JSON mode {json_mode:.1%} ({json_invalid}), "
        f"json_schema {schema:.1%} ({schema_invalid})"
    )
    assert judge_server.schema_problems == []
    assert schema < json_mode <= text
    assert text > 0.05  # the corpus does contain answers that break the rules


# timing-sensitive: asserts how long it took, so it runs alone (tests/run_suite.py's serial phase)
@pytest.mark.serial
def test_waiting_for_a_probe_is_bounded() -> None:
    """Without a bound a caller waits for the prober; with one it goes ahead (not as the prober) once it is spent."""

    async def scenario() -> None:
        model = f"openai/hung-{uuid.uuid4().hex[:6]}"
        mode, probing = await RESPONSE_MODES.acquire(model)
        assert (mode, probing) == ("json_schema", True)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(RESPONSE_MODES.acquire(model), timeout=0.1)
        started = time.monotonic()
        assert await RESPONSE_MODES.acquire(model, wait_s=0.2) == ("json_schema", False)
        assert 0.2 <= time.monotonic() - started < 2
        RESPONSE_MODES.release(model)
        assert await asyncio.wait_for(RESPONSE_MODES.acquire(model), timeout=0.5) == ("json_schema", True)

    asyncio.run(scenario())


async def test_a_probe_that_never_ends_does_not_stall_the_judge(judge_server: JudgeServer) -> None:
    """A probe taken on another thread's loop that is never released (its loop gone): a judgement on this loop
    waits at most twice its timeout for it, then goes ahead with the schema, and the mode is learnt."""
    await judge(model="openai/warm-up").evaluate(CONVERSATION)  # LiteLLM's first call in a process is slow
    judge_server.requests.clear()
    metric = judge(model=f"openai/orphan-{uuid.uuid4().hex[:6]}", timeout=1.5, max_retries=0)
    model = metric.backend.litellm_model
    taken: list[tuple[str, bool]] = []
    holder = threading.Thread(target=lambda: taken.append(asyncio.run(RESPONSE_MODES.acquire(model))))
    holder.start()
    holder.join(5)
    assert taken == [("json_schema", True)]
    started = time.monotonic()
    result = await asyncio.wait_for(metric.evaluate(CONVERSATION), timeout=30)
    assert result.error is None and result.verdict == "not_applicable" and result.attempts == 1
    assert time.monotonic() - started >= 3.0  # it did wait for the probe first (twice the timeout)
    assert judge_server.response_modes() == ["json_schema"]
    assert RESPONSE_MODES.mode(model) == "json_schema"
