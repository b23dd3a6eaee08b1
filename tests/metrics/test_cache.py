"""Prompt caching: the rubric carries a cache breakpoint where the provider needs one (Claude), it is long enough to be
cached where the provider's minimum is above it (extended worked examples), and cached tokens are counted by kind into
the token counter and the cost. LiteLLM talks over real HTTP to local servers speaking the Anthropic Messages API and
the OpenAI API."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.consumer.test_outputs import job
from tests.support.anthropic_server import AnthropicServer
from tests.support.judge_server import JudgeServer, Reply
from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.judging.judgement import Judgement
from tracejudge.metrics import (
    ConversationalEvalTestCase,
    ConversationalFlowRateMetric,
    EvalTestCase,
    FailureRateMetric,
)
from tracejudge.metrics._caching import caching_minimum, estimated_tokens, with_worked_examples
from tracejudge.metrics._litellm import needs_cache_breakpoint, with_cache_breakpoint
from tracejudge.metrics._usage import usage_tokens
from tracejudge.metrics.conversational_flow import CONVERSATIONAL_FLOW_EXTENDED_EXAMPLES
from tracejudge.metrics.failure_rate import FAILURE_RATE_EXTENDED_EXAMPLES

CONVERSATION = ConversationalEvalTestCase(
    turns=[
        EvalTestCase(input="What was the population of Atlantis in 2024?", actual_output="Atlantis is mythical."),
        EvalTestCase(input="And of Lisbon?", actual_output="About 545,000 in the city proper (2021 census)."),
    ]
)
ANSWER = {"verdict": "not_applicable", "evidence": [], "reason": "no uncertainty"}


def _answer(body: dict[str, Any]) -> str:
    system = json.dumps(body.get("system"))
    return json.dumps({**ANSWER, "verdict": "fully"} if "fully" in system else ANSWER)


@pytest.fixture
def anthropic(monkeypatch: pytest.MonkeyPatch) -> Iterator[AnthropicServer]:
    server = AnthropicServer(_answer).start()
    monkeypatch.setenv("ANTHROPIC_API_BASE", server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-local")
    monkeypatch.setenv("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True")
    yield server
    server.stop()
    assert server.rejected == []  # every request LiteLLM sent passed the real API's checks


def _marked_paths(value: Any, path: str = "") -> list[str]:
    """Where `cache_control` occurs anywhere inside a request body."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend([f"{path}.{key}"] if key == "cache_control" else _marked_paths(item, f"{path}.{key}"))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_marked_paths(item, f"{path}[{index}]"))
    return found


def _price(model: str) -> dict[str, float]:
    import litellm

    return litellm.model_cost[model]


def test_claude_request_marks_the_system_block_only(anthropic: AnthropicServer) -> None:
    anthropic.minimum_cacheable_tokens = 4096  # Claude Haiku 4.5's minimum cacheable prompt length
    metrics = [
        FailureRateMetric("anthropic:claude-haiku-4-5", failure_modes=()),
        ConversationalFlowRateMetric("anthropic/claude-haiku-4-5"),
    ]
    first = [asyncio.run(metric.evaluate(CONVERSATION)) for metric in metrics]
    again = [asyncio.run(metric.evaluate(CONVERSATION)) for metric in metrics]
    assert [r.verdict for r in first + again] == ["not_applicable", "fully"] * 2
    assert len(anthropic.requests) == 4 and anthropic.rejected == []
    for request, metric in zip(anthropic.requests, metrics * 2, strict=True):
        # The rubric with its extended examples, byte-identical on every call: the base rubric is below 4,096.
        prompt = with_worked_examples(metric.system_prompt, metric.extended_examples)
        assert metric.effective_system_prompt == prompt != metric.system_prompt
        system = request["system"]
        assert system == [{"type": "text", "text": prompt, "cache_control": {"type": "ephemeral"}}]
        assert _marked_paths(request) == [".system[0].cache_control"]  # nothing in messages, no top-level marker
        assert metric.extended_examples not in json.dumps(request["messages"])

    # The first call per rubric writes the cache, the second reads it; the conversation part is never cached.
    price = _price("claude-haiku-4-5")
    for result, usage in zip(first + again, anthropic.usages, strict=True):
        read, written = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
        assert result.input_tokens == usage["input_tokens"] + read + written
        assert result.cached_input_tokens == read
        assert result.cache_write_input_tokens == written
        expected = (
            usage["input_tokens"] * price["input_cost_per_token"]
            + read * price["cache_read_input_token_cost"]
            + written * price["cache_creation_input_token_cost"]
            + usage["output_tokens"] * price["output_cost_per_token"]
        )
        assert result.cost_usd == pytest.approx(expected, rel=1e-9)
    assert [u["cache_read_input_tokens"] for u in anthropic.usages[:2]] == [0, 0]
    assert all(u["cache_creation_input_tokens"] >= 4096 for u in anthropic.usages[:2])
    assert [u["cache_read_input_tokens"] for u in anthropic.usages[2:]] == [
        u["cache_creation_input_tokens"] for u in anthropic.usages[:2]
    ]
    assert all(a.cost_usd < f.cost_usd / 2 for f, a in zip(first, again, strict=True))

    registry = CollectorRegistry()
    instruments = ConsumerInstruments(registry)
    instruments.record_judgement(Judgement(job("c"), "judged", first + again))
    tokens = {
        direction: registry.get_sample_value(
            "tracejudge_judge_tokens_total",
            {"metric": "failure_rate", "model": "anthropic:claude-haiku-4-5", "direction": direction},
        )
        for direction in ("input", "cached_input", "cache_write", "output")
    }
    usages = anthropic.usages[0::2]  # the Failure Rate calls
    assert tokens == {
        "input": sum(u["input_tokens"] for u in usages),  # uncached only: cache reads and writes are not in it
        "cached_input": usages[1]["cache_read_input_tokens"],
        "cache_write": usages[0]["cache_creation_input_tokens"],
        "output": sum(u["output_tokens"] for u in usages),
    }


def test_corrective_retry_keeps_the_conversation_unmarked(anthropic: AnthropicServer) -> None:
    answers = iter(["not json at all", json.dumps(ANSWER)])
    anthropic.answer = lambda body: next(answers)
    result = asyncio.run(FailureRateMetric("anthropic/claude-haiku-4-5", failure_modes=()).evaluate(CONVERSATION))
    assert result.verdict == "not_applicable"
    retry = anthropic.requests[1]
    assert [m["role"] for m in retry["messages"]] == ["user", "assistant", "user"]
    assert _marked_paths(retry) == [".system[0].cache_control"]
    written, read = anthropic.usages[0]["cache_creation_input_tokens"], anthropic.usages[1]["cache_read_input_tokens"]
    assert written > 4096 and read == written  # the retry reads the rubric the first call wrote
    assert (result.cache_write_input_tokens, result.cached_input_tokens) == (written, read)  # both rounds counted
    assert result.input_tokens == sum(
        u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"] for u in anthropic.usages
    )


def test_below_the_minimum_nothing_is_cached_or_billed_as_a_write(anthropic: AnthropicServer) -> None:
    """Why the extended examples exist: the base rubric alone, marked, is never cached by Claude Haiku 4.5."""
    anthropic.minimum_cacheable_tokens = 4096  # Claude Haiku 4.5's minimum cacheable prompt length
    bare = type("BaseRubricOnly", (FailureRateMetric,), {"extended_examples": ""})(
        "anthropic/claude-haiku-4-5", failure_modes=()
    )
    assert bare.effective_system_prompt == FailureRateMetric.system_prompt
    results = [asyncio.run(bare.evaluate(CONVERSATION)) for _ in range(2)]
    assert _marked_paths(anthropic.requests[1]) == [".system[0].cache_control"]
    assert [(r.cached_input_tokens, r.cache_write_input_tokens) for r in results] == [(0, 0), (0, 0)]
    price = _price("claude-haiku-4-5")
    usage = anthropic.usages[1]
    assert results[1].cost_usd == pytest.approx(
        usage["input_tokens"] * price["input_cost_per_token"] + usage["output_tokens"] * price["output_cost_per_token"]
    )


def test_openai_request_carries_no_breakpoint(judge_server: JudgeServer) -> None:
    judge_server.enqueue(Reply(content=json.dumps(ANSWER), prompt_tokens=2000, cached_tokens=1536))
    result = asyncio.run(FailureRateMetric("gpt-4o-mini", failure_modes=()).evaluate(CONVERSATION))
    request = judge_server.requests[0]
    assert request["messages"][0]["content"] == FailureRateMetric.system_prompt  # no extension: 1,024 is cleared
    assert _marked_paths(request) == []
    assert (result.input_tokens, result.cached_input_tokens, result.cache_write_input_tokens) == (2000, 1536, None)
    price = _price("gpt-4o-mini")
    output = result.output_tokens or 0
    expected = (
        464 * price["input_cost_per_token"]
        + 1536 * price["cache_read_input_token_cost"]
        + output * price["output_cost_per_token"]
    )
    assert result.cost_usd == pytest.approx(expected, rel=1e-9)

    registry = CollectorRegistry()
    ConsumerInstruments(registry).record_judgement(Judgement(job("c"), "judged", [result]))
    labels = {"metric": "failure_rate", "model": "gpt-4o-mini"}
    sample = registry.get_sample_value
    assert sample("tracejudge_judge_tokens_total", {**labels, "direction": "input"}) == 464
    assert sample("tracejudge_judge_tokens_total", {**labels, "direction": "cached_input"}) == 1536
    assert sample("tracejudge_judge_tokens_total", {**labels, "direction": "cache_write"}) is None


def test_claude_at_a_1024_minimum_caches_the_base_rubric(anthropic: AnthropicServer) -> None:
    metric = FailureRateMetric("anthropic/claude-sonnet-4-5", failure_modes=())
    assert metric.effective_system_prompt is FailureRateMetric.system_prompt
    results = [asyncio.run(metric.evaluate(CONVERSATION)) for _ in range(2)]
    assert [block["text"] for block in anthropic.requests[0]["system"]] == [FailureRateMetric.system_prompt]
    written = anthropic.usages[0]["cache_creation_input_tokens"]
    assert 1024 <= written < 4096
    assert [(r.cache_write_input_tokens, r.cached_input_tokens) for r in results] == [(written, 0), (0, written)]


# --- the extended rubric: only where the provider's minimum is above the base rubric ------------------------------

METRICS = (FailureRateMetric, ConversationalFlowRateMetric)


def test_extended_rubric_clears_4096_and_base_rubric_is_unchanged() -> None:
    import litellm

    for cls, examples in (
        (FailureRateMetric, FAILURE_RATE_EXTENDED_EXAMPLES),
        (ConversationalFlowRateMetric, CONVERSATIONAL_FLOW_EXTENDED_EXAMPLES),
    ):
        assert cls.extended_examples is examples
        extended = cls("anthropic/claude-haiku-4-5", failure_modes=()).effective_system_prompt
        assert extended.startswith(cls.system_prompt.partition("\n\n## Output format")[0])
        assert extended.endswith(cls.system_prompt[cls.system_prompt.index("## Output format") :])  # format stays last
        for counter in ("claude-haiku-4-5", "gpt-4o", "gemini/gemini-2.5-flash"):
            base = litellm.token_counter(model=counter, text=cls.system_prompt)
            tokens = litellm.token_counter(model=counter, text=extended)
            assert base < 2048 and tokens >= 4096 * 1.05, (cls.name, counter, base, tokens)  # a 5% margin
        for model in (
            "gpt-4o-mini",
            "openai/gpt-4.1-mini",
            "gpt-5-mini",
            "azure/gpt-4o",
            "anthropic/claude-sonnet-4-5",
        ):
            assert cls(model, failure_modes=()).effective_system_prompt is cls.system_prompt, model


@pytest.mark.parametrize(
    ("model", "minimum", "extended"),
    [
        ("anthropic/claude-haiku-4-5", 4096, True),
        ("anthropic:claude-haiku-4-5-20251001", 4096, True),
        ("bedrock/us.anthropic.claude-haiku-4-5-20251001-v1:0", 4096, True),
        ("vertex_ai/claude-haiku-4-5@20251001", 4096, True),
        ("openrouter/anthropic/claude-haiku-4.5", 4096, True),
        ("anthropic/claude-opus-4-5", 4096, True),
        ("anthropic/claude-opus-4-7", 2048, True),
        ("anthropic/claude-3-5-haiku-20241022", 2048, True),
        ("anthropic/claude-sonnet-4-5", 1024, False),
        ("anthropic:claude-3-5-sonnet-latest", 1024, False),
        ("gemini/gemini-2.5-flash", 2048, True),
        ("google:gemini-2.5-pro", 2048, True),
        ("vertex_ai/gemini-2.5-flash", 2048, True),
        ("gemini/gemini-2.5-flash-lite", 1024, False),  # not in the Gemini API's table
        ("vertex_ai/gemini-2.5-flash-lite", 2048, True),  # Vertex AI: 2,048 for every Gemini 2.5 model
        ("vertex_ai/gemini-2.0-flash", 1024, False),
        ("gpt-4o-mini", 1024, False),
        ("openai/gpt-5-mini", 1024, False),
        ("openai/claude-haiku-4-5", None, False),  # an OpenAI-compatible server: no breakpoint, so never cached
    ],
)
def test_which_models_get_the_extended_rubric(model: str, minimum: int | None, extended: bool) -> None:
    from tracejudge.metrics._litellm import litellm_model_string

    assert caching_minimum(litellm_model_string(model)) == minimum
    for cls in METRICS:
        assert (cls(model, failure_modes=()).effective_system_prompt != cls.system_prompt) is extended


@pytest.mark.parametrize(
    ("price_key", "model"),
    [
        ("claude-haiku-4-5", "anthropic/claude-haiku-4-5"),
        ("vertex_ai/claude-haiku-4-5", "vertex_ai/claude-haiku-4-5"),
        ("us.anthropic.claude-haiku-4-5-20251001-v1:0", "bedrock/us.anthropic.claude-haiku-4-5-20251001-v1:0"),
        ("claude-opus-4-5", "anthropic/claude-opus-4-5"),
        ("claude-opus-4-6", "anthropic/claude-opus-4-6"),
        ("claude-opus-4-7", "anthropic/claude-opus-4-7"),
        ("claude-sonnet-4-5", "anthropic/claude-sonnet-4-5"),
        ("us.anthropic.claude-3-5-haiku-20241022-v1:0", "bedrock/us.anthropic.claude-3-5-haiku-20241022-v1:0"),
        ("gemini/gemini-2.5-pro", "gemini/gemini-2.5-pro"),
    ],
)
def test_minimums_agree_with_litellms_price_list(price_key: str, model: str) -> None:
    """Where LiteLLM's price list knows a model's minimum (`prompt_cache_min_tokens`), ours is the same."""
    import litellm

    assert caching_minimum(model) == litellm.model_cost[price_key]["prompt_cache_min_tokens"]


def test_the_length_estimate_decides_as_litellms_counters_do() -> None:
    import litellm

    for cls in METRICS:
        for prompt in (cls.system_prompt, with_worked_examples(cls.system_prompt, cls.extended_examples)):
            for counter in ("claude-haiku-4-5", "gpt-4o", "gemini/gemini-2.5-flash"):
                tokens = litellm.token_counter(model=counter, text=prompt)
                for minimum in (1024, 2048, 4096):
                    assert (estimated_tokens(prompt) >= minimum) == (tokens >= minimum), (cls.name, counter, minimum)


def test_extended_examples_are_answers_the_rubric_allows() -> None:
    """Each extra example answers in the output format with one of the metric's labels; numbering continues."""
    for cls in METRICS:
        numbers = [int(n) for n in re.findall(r"^Example (\d+)$", cls.system_prompt, re.M)]
        extra = [int(n) for n in re.findall(r"^Example (\d+)$", cls.extended_examples, re.M)]
        assert extra == list(range(numbers[-1] + 1, numbers[-1] + 1 + len(extra))) and len(extra) >= 12
        answers = [
            json.loads(line[len("Answer: ") :])
            for line in cls.extended_examples.splitlines()
            if line.startswith("Answer: ")
        ]
        assert len(answers) == len(extra)
        for answer in answers:
            assert set(answer) == {"verdict", cls.evidence_key, "reason"}, answer
            assert answer["verdict"] in cls.weights
        assert {a["verdict"] for a in answers} >= set(cls.weights) - {"not_applicable", "none"}


def test_rubric_version_follows_the_prompt_sent() -> None:
    for cls in METRICS:
        base = cls("gpt-4o-mini").rubric_version
        extended = cls("anthropic/claude-haiku-4-5").rubric_version
        assert base != extended
        assert cls("anthropic/claude-sonnet-4-5").rubric_version == cls("gpt-5-mini").rubric_version == base
        assert (
            cls("gemini/gemini-2.5-flash").rubric_version
            == cls("vertex_ai/claude-haiku-4-5").rubric_version
            == (extended)
        )


@pytest.mark.parametrize(
    ("model", "marked"),
    [
        ("anthropic/claude-haiku-4-5", True),
        ("bedrock/us.anthropic.claude-sonnet-4-5-20250929-v1:0", True),
        ("bedrock/converse/anthropic.claude-3-5-haiku-20241022-v1:0", True),
        ("vertex_ai/claude-sonnet-4-5@20250929", True),
        ("openrouter/anthropic/claude-haiku-4.5", True),
        ("azure_ai/claude-haiku-4-5", True),
        ("openai/gpt-4o-mini", False),
        ("gemini/gemini-2.5-flash", False),
        ("vertex_ai/gemini-2.5-flash", False),
        ("bedrock/amazon.nova-lite-v1:0", False),
        ("azure/gpt-4.1-mini", False),
        ("openai/claude-on-my-vllm", False),  # an OpenAI-compatible server: LiteLLM would pass the block through
    ],
)
def test_which_models_get_a_breakpoint(model: str, marked: bool) -> None:
    assert needs_cache_breakpoint(model) is marked


def test_breakpoint_leaves_the_messages_alone() -> None:
    messages = [{"role": "system", "content": "rubric"}, {"role": "user", "content": "conversation"}]
    marked = with_cache_breakpoint(messages)
    assert messages == [{"role": "system", "content": "rubric"}, {"role": "user", "content": "conversation"}]
    assert marked[1] is messages[1]
    assert with_cache_breakpoint(marked) == marked  # idempotent: the JSON-mode fallback re-sends the same messages
    assert with_cache_breakpoint(messages[1:]) == messages[1:]  # no system message, nothing to mark


def test_bedrock_converse_turns_the_breakpoint_into_a_cache_point() -> None:
    from litellm.llms.bedrock.chat.converse_transformation import AmazonConverseConfig

    request = AmazonConverseConfig()._transform_request(
        model="anthropic.claude-haiku-4-5-20251001-v1:0",
        messages=with_cache_breakpoint([{"role": "system", "content": "rubric"}, {"role": "user", "content": "c"}]),
        optional_params={},
        litellm_params={},
        headers={},
    )
    assert request["system"] == [{"text": "rubric"}, {"cachePoint": {"type": "default"}}]
    assert "cachePoint" not in json.dumps(request["messages"])


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        # OpenAI / Gemini through LiteLLM: cached tokens are inside prompt_tokens.
        (
            {"prompt_tokens": 2000, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 1536}},
            (2000, 1536, None, 9),
        ),
        # Anthropic / Bedrock through LiteLLM: cache reads and writes added into prompt_tokens, mirrored in details.
        (
            {
                "prompt_tokens": 1907,
                "completion_tokens": 40,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 1776,
                "prompt_tokens_details": {"cached_tokens": 0, "cache_creation_tokens": 1776},
            },
            (1907, 0, 1776, 40),
        ),
        # A shape that leaves cache reads out of the prompt count (Anthropic's own input_tokens semantics).
        ({"prompt_tokens": 131, "completion_tokens": 40, "cache_read_input_tokens": 1776}, (1907, 1776, None, 40)),
        ({"prompt_tokens": 10}, (10, None, None, None)),
        (None, (None, None, None, None)),
        ({"prompt_tokens": "many", "cache_read_input_tokens": True}, (None, None, None, None)),
    ],
)
def test_usage_shapes(usage: dict[str, Any] | None, expected: tuple[int | None, ...]) -> None:
    assert usage_tokens(usage) == expected


def test_litellm_usage_objects() -> None:
    from litellm import Usage
    from litellm.llms.anthropic.chat.transformation import AnthropicConfig

    anthropic = AnthropicConfig().calculate_usage(
        {"input_tokens": 131, "output_tokens": 40, "cache_read_input_tokens": 1776, "cache_creation_input_tokens": 0},
        reasoning_content=None,
    )
    assert usage_tokens(anthropic) == (1907, 1776, 0, 40)
    openai = Usage(prompt_tokens=2000, completion_tokens=9, prompt_tokens_details={"cached_tokens": 1024})
    assert usage_tokens(openai) == (2000, 1024, None, 9)


def test_bedrock_and_gemini_usage_objects() -> None:
    """Bedrock Converse (camelCase cache fields) and Gemini (`cachedContentTokenCount`, inside `promptTokenCount`) as
    LiteLLM's own transforms turn them into `Usage`: each prompt token lands in exactly one direction."""
    from litellm.llms.bedrock.chat.converse_transformation import AmazonConverseConfig
    from litellm.llms.vertex_ai.gemini.vertex_and_google_ai_studio_gemini import VertexGeminiConfig

    converse = {"inputTokens": 131, "outputTokens": 40, "totalTokens": 171, "cacheWriteInputTokens": 4600}
    assert usage_tokens(AmazonConverseConfig().transform_usage(converse)) == (4731, 0, 4600, 40)
    metadata = {"promptTokenCount": 4800, "candidatesTokenCount": 40, "totalTokenCount": 4840}
    gemini = VertexGeminiConfig._calculate_usage({"usageMetadata": {**metadata, "cachedContentTokenCount": 4096}})
    assert usage_tokens(gemini) == (4800, 4096, None, 40)


def test_the_failure_mode_taxonomy_is_part_of_the_cached_system_block(anthropic: AnthropicServer) -> None:
    """The default taxonomy (one more key in the same answer) is static: it follows the rubric inside the one system
    block that carries the breakpoint, so a cached prefix covers it and no call pays for it twice."""
    metric = FailureRateMetric("anthropic/claude-sonnet-4-5")
    assert metric.failure_modes and metric.effective_system_prompt.startswith(FailureRateMetric.system_prompt)
    assert metric.effective_system_prompt.endswith('For any other verdict "failure_mode" is null.')
    results = [asyncio.run(metric.evaluate(CONVERSATION)) for _ in range(2)]
    assert [block["text"] for block in anthropic.requests[0]["system"]] == [metric.effective_system_prompt]
    assert _marked_paths(anthropic.requests[1]) == [".system[0].cache_control"]
    assert results[1].cached_input_tokens == anthropic.usages[0]["cache_creation_input_tokens"] > 0
