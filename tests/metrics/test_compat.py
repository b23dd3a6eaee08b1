"""`tracejudge.metrics.compat` against eval_lib 0.8.2's documented shapes, on the real HTTP judge server via LiteLLM."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tracejudge.metrics as core
from tests.support.judge_server import JudgeServer, Reply, verdict
from tracejudge.metrics import compat
from tracejudge.metrics.compat import (
    ConversationalEvalTestCase,
    ConversationalFlowRateMetric,
    ConversationalMetricPattern,
    ConversationalTestCaseResult,
    CustomLLMClient,
    EvalTestCase,
    FailureRateMetric,
    MetricResult,
    evaluate_conversations,
)
from tracejudge.metrics.conversational_flow import CONVERSATIONAL_FLOW_WEIGHTS
from tracejudge.metrics.failure_rate import FAILURE_RATE_WEIGHTS

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "eval_lib_script.py"
# The keys eval_lib 0.8.2 puts in a result dict and in these two metrics' evaluation_log.
RESULT_KEYS = {"name", "score", "success", "reason", "evaluation_cost", "evaluation_log"}
LOG_KEYS = {
    "dialogue",
    "number_of_turns",
    "verdict",
    "comment_verdict",
    "final_score",
    "comment_final_score",
    "threshold",
    "success",
    "final_reason",
}
CASE = ConversationalEvalTestCase(
    turns=[
        EvalTestCase(input="What is the population of Atlantis?", actual_output="Atlantis is mythical."),
        EvalTestCase(input="And the Mariana Trench depth?", actual_output="About 10,935 m; check NOAA."),
    ],
    chatbot_role="geography tutor",
    name="atlantis",
)


def fast(metric_cls: type, model: Any = "gpt-4o-mini", **kwargs: Any) -> Any:
    kwargs.setdefault("timeout", 10.0)
    metric = metric_cls(model, **kwargs)
    metric.judge.retry_policy.base_delay_s = 0.01
    return metric


class Scripted(CustomLLMClient):
    """Replies in order, each with its own cost."""

    def __init__(self, *replies: tuple[str, float | None]) -> None:
        self.replies = list(replies)
        self.calls = 0

    async def chat_complete(self, messages: list[dict[str, str]], temperature: float) -> tuple[str, float | None]:
        self.calls += 1
        return self.replies.pop(0)

    def get_model_name(self) -> str:
        return "scripted"


def answer(label: str, reason: str = "r", **extra: Any) -> str:
    return json.dumps({"verdict": label, "reason": reason, **extra})


def judge_for_both_libraries(request: dict[str, Any]) -> Reply:
    """Answers eval_lib's prompt (one user message) and ours (system + user) alike: Flow or Failure Rate by rubric."""
    prompt = "\n".join(str(m.get("content", "")) for m in request.get("messages", []))
    if re.search(r"fully\W+mostly", prompt):
        return Reply(content=json.dumps({"verdict": "mostly", "key_issues": [], "reason": "coherent"}))
    return Reply(content=json.dumps({"verdict": "alternative_proposed", "evidence": [], "reason": "pointed on"}))


# ---- the metric dict ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metric_cls", "label", "weight"),
    [(FailureRateMetric, label, weight) for label, weight in FAILURE_RATE_WEIGHTS.items()]
    + [(ConversationalFlowRateMetric, label, weight) for label, weight in CONVERSATIONAL_FLOW_WEIGHTS.items()],
)
async def test_metric_returns_eval_libs_dict(
    judge_server: JudgeServer, metric_cls: type, label: str, weight: float
) -> None:
    judge_server.enqueue(verdict(label, reason="because", evidence=["turn 1"]))
    result = await fast(metric_cls).evaluate(CASE)
    assert set(result) == RESULT_KEYS
    expected_name = "failureRateMetric" if metric_cls is FailureRateMetric else "conversationalFlowRateMetric"
    assert (result["name"], result["score"], result["reason"]) == (expected_name, weight, "because")
    assert result["success"] is (weight >= 0.7)
    log = result["evaluation_log"]
    assert LOG_KEYS <= set(log)
    issues = "evidence" if metric_cls is FailureRateMetric else "key_issues"
    assert log[issues] == ["turn 1"] and log["verdict"] == {"verdict": label, issues: ["turn 1"], "reason": "because"}
    assert (log["final_score"], log["number_of_turns"], log["threshold"]) == (weight, 2, 0.7)
    assert log["dialogue"].startswith("1. User: What is the population of Atlantis?\n   Assistant: Atlantis")
    # LiteLLM priced the real HTTP reply from its usage; eval_lib rounds the cost to 6 places.
    assert result["evaluation_cost"] > 0 and result["evaluation_cost"] == round(log["judge"]["cost_usd"], 6)
    assert len(judge_server.requests) == 1


@pytest.mark.parametrize(
    ("metric_cls", "guess"),
    [(FailureRateMetric, 1.0), (ConversationalFlowRateMetric, 0.0)],
)
async def test_unknown_label_is_no_score_where_eval_lib_guessed(
    judge_server: JudgeServer, metric_cls: type, guess: float
) -> None:
    """eval_lib maps an unknown Failure Rate label to not_applicable (1.0, a pass) and an unknown Flow label to 0.0."""
    judge_server.enqueue(verdict("excellent"), verdict("excellent"))
    result = await fast(metric_cls).evaluate(CASE)
    assert result["score"] is None and result["score"] != guess and result["success"] is False
    assert "invalid judge output" in result["reason"]
    assert result["evaluation_log"]["error_kind"] == "invalid_output"
    assert result["evaluation_log"]["verdict"] is None and result["evaluation_log"]["final_score"] is None
    assert len(judge_server.requests) == 2  # the answer and one corrective retry


async def test_provider_failure_is_a_value_not_an_exception(judge_server: JudgeServer) -> None:
    judge_server.default = Reply(status=500, content="down")
    result = await fast(FailureRateMetric, max_retries=1).evaluate(CASE)
    assert (result["score"], result["success"], result["evaluation_cost"]) == (None, False, 0.0)
    assert result["evaluation_log"]["error_kind"] == "server_error" and len(judge_server.requests) == 2


async def test_cost_accumulates_over_the_corrective_retry() -> None:
    client = Scripted(("not json at all", 0.0021), (answer("stall"), 0.0034))
    result = await FailureRateMetric(model=client).evaluate(CASE)
    assert (result["score"], result["success"], result["evaluation_cost"]) == (0.4, False, 0.0055)
    assert client.calls == 2


async def test_unknown_cost_is_zero_as_in_eval_lib() -> None:
    result = await ConversationalFlowRateMetric(model=Scripted((answer("fully"), None))).evaluate(CASE)
    assert result["evaluation_cost"] == 0.0 and result["score"] == 1.0


async def test_threshold_and_model_are_read_when_judging(judge_server: JudgeServer) -> None:
    judge_server.default = verdict("partial")
    metric = fast(ConversationalFlowRateMetric)
    assert (await metric.evaluate(CASE))["success"] is True
    metric.threshold = 0.8
    stricter = await metric.evaluate(CASE)
    assert stricter["success"] is False and stricter["evaluation_log"]["judge"]["threshold"] == 0.8
    client = Scripted((answer("fully"), 0.001))
    metric.model = client
    assert (await metric.evaluate(CASE))["score"] == 1.0 and client.calls == 1
    assert len(judge_server.requests) == 2


async def test_empty_conversation_is_no_score_and_no_call(judge_server: JudgeServer) -> None:
    result = await fast(FailureRateMetric).evaluate(ConversationalEvalTestCase(turns=[]))
    assert (result["score"], result["success"]) == (None, False)
    assert result["evaluation_log"]["error_kind"] == "empty_conversation" and not judge_server.requests


def test_signatures_and_defaults_match_eval_lib() -> None:
    for metric_cls in (FailureRateMetric, ConversationalFlowRateMetric):
        parameters = inspect.signature(metric_cls).parameters
        assert list(parameters)[:3] == ["model", "threshold", "verbose"]
        assert (parameters["threshold"].default, parameters["verbose"].default) == (0.7, False)
        assert issubclass(metric_cls, ConversationalMetricPattern)
    parameters = inspect.signature(evaluate_conversations).parameters
    assert list(parameters)[:3] == ["conv_cases", "metrics", "verbose"] and parameters["verbose"].default is True
    assert [f.name for f in dataclasses.fields(MetricResult)] == [
        "name",
        "score",
        "threshold",
        "success",
        "evaluation_cost",
        "reason",
        "evaluation_model",
        "evaluation_log",
    ]
    assert [f.name for f in dataclasses.fields(ConversationalTestCaseResult)][:3] == [
        "dialogue",
        "success",
        "metrics_data",
    ]
    metric = FailureRateMetric("openai:gpt-4o-mini", 0.5, True)  # positional, as eval_lib allows
    assert (metric.model, metric.threshold, metric.verbose, metric.chatbot_role) == (
        "openai:gpt-4o-mini",
        0.5,
        True,
        None,
    )


def test_our_api_is_untouched() -> None:
    assert "compat" not in core.__all__
    assert core.FailureRateMetric is not FailureRateMetric and core.FailureRateMetric.name == "failure_rate"
    assert compat.EvalTestCase is core.EvalTestCase and issubclass(compat.CustomLLMClient, core.CustomLLMClient)
    code = "import sys, tracejudge.metrics.compat; assert 'litellm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_any_custom_llm_client_works_and_embeddings_are_not_offered() -> None:
    class Ours(core.CustomLLMClient):
        async def chat_complete(self, messages: list[dict[str, str]], temperature: float) -> tuple[str, float | None]:
            return answer("fully"), 0.001

        def get_model_name(self) -> str:
            return "ours"

    assert (await ConversationalFlowRateMetric(model=Ours()).evaluate(CASE))["score"] == 1.0
    with pytest.raises(NotImplementedError):
        await Scripted().get_embeddings(["x"])


# ---- evaluate_conversations --------------------------------------------------------------------------------------


class Foreign:
    """An eval_lib-style metric of a user's own: no base class, just the attributes and an async evaluate()."""

    name = "myMetric"

    def __init__(self, score: Any = 0.9, success: Any = True, cost: Any = 0.003) -> None:
        self.model = "my-model"
        self.threshold = 0.5
        self.verbose = "own"
        self.score, self.success, self.cost = score, success, cost
        self.seen_verbose: list[Any] = []

    async def evaluate(self, case: Any) -> Any:
        self.seen_verbose.append(self.verbose)
        return {
            "name": "ignored",
            "score": self.score,
            "success": self.success,
            "reason": "mine",
            "evaluation_cost": self.cost,
        }


async def test_pairs_dialogue_rows_name_and_role(judge_server: JudgeServer) -> None:
    judge_server.responder = judge_for_both_libraries
    other = ConversationalEvalTestCase(turns=[EvalTestCase(input="2+2?", actual_output="4")])
    failure, flow, mine = fast(FailureRateMetric), fast(ConversationalFlowRateMetric, threshold=0.95), Foreign()
    results = await evaluate_conversations([CASE, other], [failure, flow, mine], verbose=False)

    assert isinstance(results, list) and len(results) == 2
    for pair in results:
        assert isinstance(pair, tuple) and pair[0] is None and len(pair[1]) == 1
        assert isinstance(pair[1][0], ConversationalTestCaseResult)
    (_, [first]), (_, [second]) = results
    assert (first.name, first.chatbot_role, second.name, second.chatbot_role) == (
        "atlantis",
        "geography tutor",
        None,
        None,
    )
    assert first.dialogue == [
        {"role": "user", "content": "What is the population of Atlantis?"},
        {"role": "assistant", "content": "Atlantis is mythical."},
        {"role": "user", "content": "And the Mariana Trench depth?"},
        {"role": "assistant", "content": "About 10,935 m; check NOAA."},
    ]
    assert second.dialogue == [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    rows = first.metrics_data
    assert all(isinstance(row, MetricResult) for row in rows)
    assert [(r.name, r.score, r.threshold, r.success) for r in rows] == [
        ("failureRateMetric", 1.0, 0.7, True),
        ("conversationalFlowRateMetric", 0.9, 0.95, False),
        ("myMetric", 0.9, 0.5, True),  # the row takes the metric's name, not the dict's, as eval_lib does
    ]
    assert [r.evaluation_model for r in rows] == ["gpt-4o-mini", "gpt-4o-mini", "my-model"]
    assert [r.reason for r in rows] == ["pointed on", "coherent", "mine"]
    assert rows[0].evaluation_cost > 0 and rows[2].evaluation_cost == 0.003
    assert rows[0].evaluation_log["verdict"]["verdict"] == "alternative_proposed" and rows[2].evaluation_log is None
    assert first.success is False  # one row failed
    assert len(judge_server.requests) == 4


async def test_foreign_metrics_failures_are_rows_not_aborts() -> None:
    class Raises(Foreign):
        name = "raises"

        async def evaluate(self, case: Any) -> Any:
            raise RuntimeError("metric bug")

    class NotADict(Foreign):
        name = "notADict"

        async def evaluate(self, case: Any) -> Any:
            return 0.9

    class Minimal:  # no verbose attribute at all
        name, model, threshold = "minimal", "m", 0.1

        async def evaluate(self, case: Any) -> Any:
            return {"score": 0.2, "success": True, "reason": None}

    metrics = [Raises(), NotADict(), Minimal(), Foreign()]
    [(_, [result])] = await evaluate_conversations([CASE], metrics, verbose=False)
    raised, not_a_dict, minimal, fine = result.metrics_data
    assert (raised.score, raised.success, raised.name) == (None, False, "raises")
    assert "metric bug" in raised.reason and raised.evaluation_log["error_kind"] == "internal"
    assert (not_a_dict.score, not_a_dict.success) == (None, False) and "float" in not_a_dict.reason
    assert (minimal.score, minimal.success, minimal.evaluation_cost, minimal.reason) == (0.2, True, 0, None)
    assert (fine.score, fine.success) == (0.9, True)
    assert result.success is False


async def test_our_own_judges_and_a_pattern_subclass_mix_in(capsys: pytest.CaptureFixture[str]) -> None:
    class Custom(ConversationalMetricPattern):
        name = "customMetric"

        def __init__(self) -> None:
            super().__init__(model="m", threshold=0.5)

        async def evaluate(self, case: Any) -> dict[str, Any]:
            self._log_step("judging", 1)
            result = {"name": self.name, "score": 0.6, "success": True, "reason": "fine", "evaluation_cost": 0.0}
            self.print_result(result)
            return result

    ours = core.FailureRateMetric(model=Scripted((answer("mixed"), 0.001)))
    [(_, [result])] = await evaluate_conversations([CASE], [ours, Custom()], verbose=True)
    first, second = result.metrics_data
    assert (first.name, first.score, first.success, first.evaluation_cost) == ("failure_rate", 0.6, False, 0.001)
    assert first.evaluation_log["verdict"] == "mixed" and first.threshold == 0.7
    assert (second.name, second.score, second.success, second.evaluation_model) == ("customMetric", 0.6, True, "m")
    out = capsys.readouterr().out
    assert "[1] judging..." in out and "customMetric: PASSED score=0.60" in out
    assert ours.verbose is False


async def test_verbose_is_the_batchs_during_the_run_and_restored(capsys: pytest.CaptureFixture[str]) -> None:
    quiet, loud = Foreign(), Foreign()
    await evaluate_conversations([CASE, CASE], [quiet], verbose=False)
    await evaluate_conversations([CASE], [loud, loud])  # eval_lib's default: verbose=True
    assert quiet.seen_verbose == [False, False] and loud.seen_verbose == [True, True]
    assert quiet.verbose == "own" and loud.verbose == "own"
    out = capsys.readouterr().out
    assert "passed 1/1 (100.0%)" in out and "total cost $0.006000" in out


async def test_verbose_false_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    metric = FailureRateMetric(model=Scripted((answer("stall"), 0.001)))
    await evaluate_conversations([CASE], [metric], verbose=False)
    assert capsys.readouterr().out == ""
    metric = FailureRateMetric(model=Scripted((answer("stall"), 0.001)), verbose=True)
    await metric.evaluate(CASE)
    assert "failureRateMetric: FAILED score=0.40" in capsys.readouterr().out


async def test_cost_accumulates_per_row_and_in_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    first = FailureRateMetric(model=Scripted(("{}", 0.001), (answer("mixed"), 0.002)))
    second = Foreign(cost=0.0004)
    results = await evaluate_conversations([CASE], [first, second])
    rows = results[0][1][0].metrics_data
    assert [row.evaluation_cost for row in rows] == [0.003, 0.0004]
    assert "total cost $0.003400" in capsys.readouterr().out


async def test_empty_inputs() -> None:
    assert await evaluate_conversations([], [Foreign()], verbose=False) == []
    assert await evaluate_conversations([], [], verbose=True) == []
    [(_, [result])] = await evaluate_conversations([CASE], [], verbose=False)
    assert (result.success, result.metrics_data, len(result.dialogue)) == (True, [], 4)  # all([]) as in eval_lib
    scripted = Scripted()
    [(_, [empty])] = await evaluate_conversations(
        [ConversationalEvalTestCase(turns=[], name="empty")], [FailureRateMetric(model=scripted)], verbose=False
    )
    assert (empty.success, empty.dialogue, empty.name) == (False, [], "empty")
    assert (
        empty.metrics_data[0].score is None
        and empty.metrics_data[0].evaluation_log["error_kind"] == "empty_conversation"
    )
    assert scripted.calls == 0


async def test_judgements_run_concurrently_across_conversations_and_metrics(judge_server: JudgeServer) -> None:
    def slow(request: dict[str, Any]) -> Reply:
        reply = judge_for_both_libraries(request)
        reply.delay_s = 0.3
        return reply

    judge_server.responder = slow
    metrics = [fast(FailureRateMetric), fast(ConversationalFlowRateMetric)]
    cases = [ConversationalEvalTestCase(turns=[EvalTestCase(input=f"q{i}", actual_output="a")]) for i in range(6)]
    results = await evaluate_conversations(cases, metrics, verbose=False)
    assert all(result.success for _, [result] in results)
    assert judge_server.max_in_flight >= 6  # one after another (eval_lib) would never exceed 1


class ByConversation(CustomLLMClient):
    """Answers each conversation with its own label (named in its first question), after a pause, so calls overlap."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0

    async def chat_complete(self, messages: list[dict[str, str]], temperature: float) -> tuple[str, float | None]:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.02)
        self.in_flight -= 1
        label = re.search(r"label-(\w+)", messages[-1]["content"]).group(1)
        return answer(label, reason=f"for {label}"), 0.001

    def get_model_name(self) -> str:
        return "by-conversation"


LABELS = ["hallucination", "stall", "mixed", "honest_fallback", "alternative_proposed", "not_applicable"]


def labelled(label: str) -> ConversationalEvalTestCase:
    return ConversationalEvalTestCase(
        turns=[EvalTestCase(input=f"label-{label}", actual_output="a")], chatbot_role=f"role-{label}"
    )


async def test_a_shared_metric_object_keeps_each_conversation_apart() -> None:
    client = ByConversation()
    metric = FailureRateMetric(model=client)
    alone = await asyncio.gather(*(metric.evaluate(labelled(label)) for label in LABELS))
    assert [(r["score"], r["reason"]) for r in alone] == [(FAILURE_RATE_WEIGHTS[x], f"for {x}") for x in LABELS]
    assert [r["evaluation_log"]["dialogue"] for r in alone] == [f"1. User: label-{x}\n   Assistant: a" for x in LABELS]
    results = await evaluate_conversations([labelled(label) for label in LABELS], [metric], verbose=False)
    assert [result.metrics_data[0].score for _, [result] in results] == [FAILURE_RATE_WEIGHTS[x] for x in LABELS]
    assert client.max_in_flight == len(LABELS)


async def test_anyone_elses_metric_is_called_one_conversation_at_a_time_while_ours_overlap() -> None:
    """eval_lib calls a metric for one conversation after another, and metrics rely on it (its ToolCorrectnessMetric
    keeps the case's tools on `self`). Such a metric must not see another conversation's state."""

    class KeepsState(ConversationalMetricPattern):
        name = "keepsState"

        def __init__(self) -> None:
            super().__init__(model="m", threshold=0.5)
            self.in_flight = self.max_in_flight = 0
            self.order: list[str | None] = []

        async def evaluate(self, case: Any) -> dict[str, Any]:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.chatbot_role = case.chatbot_role
            self.order.append(case.chatbot_role)
            await asyncio.sleep(0.01)
            self.in_flight -= 1
            return {"score": 1.0, "success": True, "reason": self.chatbot_role}

    client = ByConversation()
    mine = KeepsState()
    cases = [labelled(label) for label in LABELS]
    results = await evaluate_conversations(cases, [FailureRateMetric(model=client), mine], verbose=False)
    assert [result.metrics_data[1].reason for _, [result] in results] == [f"role-{x}" for x in LABELS]
    assert mine.order == [f"role-{x}" for x in LABELS] and mine.max_in_flight == 1
    assert client.max_in_flight == len(LABELS)  # our judge still ran every conversation at once


async def test_overlapping_batches_give_a_shared_metric_its_own_verbose_back() -> None:
    metric = Foreign()
    await asyncio.gather(
        evaluate_conversations([CASE, CASE], [metric], verbose=False),
        evaluate_conversations([CASE], [metric], verbose=False),
    )
    assert metric.verbose == "own" and set(metric.seen_verbose) == {False}


async def test_a_foreign_metric_with_broken_attributes_or_result_gives_rows() -> None:
    class BrokenModel(Foreign):
        name = "brokenModel"

        @property
        def model(self) -> Any:
            raise RuntimeError("no model")

        @model.setter
        def model(self, value: Any) -> None:
            pass

    class NoSuccess(Foreign):
        name = "noSuccess"

        async def evaluate(self, case: Any) -> Any:
            return {"score": 0.9, "reason": "forgot success"}

    [(_, [result])] = await evaluate_conversations([CASE], [BrokenModel(), NoSuccess()], verbose=False)
    broken, no_success = result.metrics_data
    assert (broken.name, broken.score, broken.success, broken.evaluation_model) == ("brokenModel", 0.9, True, None)
    assert (no_success.score, no_success.success) == (None, False) and "'success'" in no_success.reason
    assert result.success is False


# ---- the done-when: a script written against eval_lib runs with one changed import line ------------------------


def test_the_script_differs_from_eval_lib_only_in_its_import_line() -> None:
    lines = SCRIPT.read_text().splitlines()
    mentions = [line for line in lines if "tracejudge" in line]
    assert mentions == ["from tracejudge.metrics.compat import ("]
    assert not any(line.startswith(("from eval_lib", "import eval_lib")) for line in lines)


def test_eval_lib_script_runs_unchanged_and_its_assertions_hold(judge_server: JudgeServer) -> None:
    judge_server.responder = judge_for_both_libraries
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    completed = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
    assert "model string: ok" in completed.stdout and completed.stdout.rstrip().endswith("all assertions held")
    assert len(judge_server.requests) == 2  # the model-string part went over HTTP, through LiteLLM
