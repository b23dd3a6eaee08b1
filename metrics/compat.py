"""A drop-in for the seeds' library (`eval_lib`, PyPI `eval-ai-library` 0.8.2): its names and its result shapes.

A script written against `eval_lib` runs unchanged once `from eval_lib import ...` becomes
`from tracejudge.metrics.compat import ...`: `await metric.evaluate(case)` returns eval_lib's dict, and
`evaluate_conversations` returns its `(None, [ConversationalTestCaseResult])` pairs, with `metrics_data` rows of its
`MetricResult` shape. Underneath run our judges (`tracejudge.metrics`): strict labels, a corrective retry, bounded
retries with timeouts, and every judge call of a batch concurrent.

Where eval_lib guesses, this module does not: a judgement that could not be made (unknown label, unparseable answer,
timeout, provider error, a conversation without turns, a metric that raised) is `score=None`, `success=False` with
the reason, never a made-up score. eval_lib would have scored an unknown Failure Rate label as `not_applicable`
(1.0, a pass), an unknown Flow label as 0.0, judged an empty conversation anyway, and aborted the whole batch on the
first exception.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ._cases import ConversationalEvalTestCase, EvalTestCase
from ._judge import HolisticJudgeMetric
from ._llm import CustomLLMClient as _JudgeClient
from ._llm import resolve_backend
from ._results import ERROR_INTERNAL
from ._results import MetricResult as _Judgement
from .conversational_flow import ConversationalFlowRateMetric as _FlowJudge
from .evaluate import evaluate_conversations as _evaluate_all
from .failure_rate import FailureRateMetric as _FailureJudge

__all__ = [
    "ConversationalEvalTestCase",
    "ConversationalFlowRateMetric",
    "ConversationalMetricPattern",
    "ConversationalTestCaseResult",
    "CustomLLMClient",
    "EvalTestCase",
    "FailureRateMetric",
    "MetricResult",
    "evaluate_conversations",
]


@dataclass
class MetricResult:
    """One row of `metrics_data`: eval_lib's dataclass, field for field and in its order."""

    name: str
    score: float | None
    threshold: float
    success: bool
    evaluation_cost: float | None
    reason: str | None
    # eval_lib stores the metric's `model` as given: a model string, or the CustomLLMClient object itself.
    evaluation_model: Any
    evaluation_log: Any | None = None


@dataclass
class ConversationalTestCaseResult:
    """One conversation's result. eval_lib's dataclass plus the `chatbot_role` and `name` its docstring promises."""

    dialogue: list[dict[str, Any]]
    success: bool
    metrics_data: list[MetricResult]
    chatbot_role: str | None = None
    name: str | None = None


class CustomLLMClient(_JudgeClient):
    """A judge model of your own: `async chat_complete(messages, temperature) -> (text, cost_usd)`, `get_model_name()`.

    Any subclass of `tracejudge.metrics.CustomLLMClient` works too; this one adds eval_lib's optional embeddings hook.
    """

    async def get_embeddings(
        self, texts: list[str], model: str = "text-embedding-3-small"
    ) -> tuple[list[list[float]], float | None]:
        raise NotImplementedError(f"{type(self).__name__} does not support embeddings (the judges do not need them)")


class ConversationalMetricPattern:
    """eval_lib's base for whole-conversation metrics; subclass it for a metric of your own.

    `evaluate_conversations` accepts any object with `name`, `model`, `threshold`, `verbose` and an async
    `evaluate(case)` returning eval_lib's dict; this base is optional.
    """

    name: str

    def __init__(self, model: Any, threshold: float, verbose: bool = False) -> None:
        self.model = model
        self.threshold = threshold
        self.verbose = verbose
        self.chatbot_role: str | None = None

    def print_result(self, result: Mapping[str, Any]) -> None:
        """Print the result when `verbose`; quiet otherwise (eval_lib prints the raw dict even then)."""
        if self.verbose:
            print(_format_metric(result, getattr(self, "name", type(self).__name__)), flush=True)

    def _log(self, message: str, color: str = "") -> None:
        """eval_lib's progress helpers, kept for metrics that subclass this base; they print only when `verbose`."""
        if self.verbose:
            print(message, flush=True)

    def _log_step(self, step_name: str, step_num: int | None = None) -> None:
        if self.verbose:
            print(f"  {f'[{step_num}] ' if step_num else ''}{step_name}...", flush=True)


class _HolisticMetric(ConversationalMetricPattern):
    """One of our judges behind eval_lib's interface: `evaluate` returns eval_lib's result dict."""

    judge_class: ClassVar[type[HolisticJudgeMetric]]
    issues_key: ClassVar[str]
    comment_verdict: ClassVar[str]

    def __init__(self, model: Any, threshold: float = 0.7, verbose: bool = False, **judge_options: Any) -> None:
        """`judge_options`: our judges' keyword options (`timeout`, `max_retries`, `transcript_budget_tokens`, ...)."""
        self._judge = self.judge_class(model, threshold, **judge_options)  # validates model and threshold
        super().__init__(model, threshold, verbose)

    @property
    def model(self) -> Any:
        return self._judge.model

    @model.setter
    def model(self, value: Any) -> None:
        if value is self._judge.model:
            return
        self._judge.backend = resolve_backend(value)
        self._judge.model = value

    @property
    def judge(self) -> HolisticJudgeMetric:
        """The `tracejudge.metrics` judge doing the work (its `evaluate` returns a structured `MetricResult`)."""
        return self._judge

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self._judge.model_name!r}, threshold={self.threshold})"

    async def evaluate(self, test_case: ConversationalEvalTestCase) -> dict[str, Any]:
        """eval_lib's dict: name, score, success, reason, evaluation_cost, evaluation_log. Never raises.

        A failed judgement has `score` None, `success` False, the failure in `reason` and `evaluation_log["error"]`.
        """
        judged = await self._judge.evaluate(test_case)
        result = self._as_dict(judged, test_case)
        self.print_result(result)
        return result

    def _as_dict(self, judged: _Judgement, test_case: Any) -> dict[str, Any]:
        turns = list(getattr(test_case, "turns", None) or [])
        score = None if judged.score is None else round(judged.score, 4)
        success = score is not None and score >= self.threshold
        issues = list(judged.evidence)
        verdict = (
            None
            if judged.verdict is None
            else {"verdict": judged.verdict, self.issues_key: issues, "reason": judged.reason}
        )
        weights = ", ".join(f"{label}={weight}" for label, weight in self._judge.weights.items())
        log: dict[str, Any] = {
            "dialogue": _render_dialogue(turns),
            "number_of_turns": len(turns),
            "verdict": verdict,
            "comment_verdict": self.comment_verdict,
            self.issues_key: issues,
            "final_score": score,
            "comment_final_score": f"Weight of the verdict label ({weights}); None when no valid verdict was given.",
            "threshold": self.threshold,
            "success": success,
            "final_reason": judged.reason,
            "error": judged.error,
            "error_kind": judged.error_kind,
            "judge": judged.model_dump(mode="json"),
        }
        return {
            "name": self.name,
            "score": score,
            "success": success,
            "reason": judged.reason,
            "evaluation_cost": round(judged.cost_usd or 0.0, 6),  # eval_lib: 0.0 when the cost is unknown
            "evaluation_log": log,
        }


class FailureRateMetric(_HolisticMetric):
    """Does the agent hallucinate, stall, or admit it does not know? One fabrication forces `hallucination` (0.0)."""

    name = "failureRateMetric"
    judge_class = _FailureJudge
    issues_key = "evidence"
    comment_verdict = (
        "One holistic verdict on how the agent handled uncertainty; a single hallucination decides it, and "
        "not_applicable means no uncertainty arose."
    )


class ConversationalFlowRateMetric(_HolisticMetric):
    """Is the dialogue natural and coherent as a whole? Later turns weigh more when they diverge."""

    name = "conversationalFlowRateMetric"
    judge_class = _FlowJudge
    issues_key = "key_issues"
    comment_verdict = "One holistic verdict on the flow of the whole dialogue, judged against a rubric with examples."


def _render_dialogue(turns: Iterable[Any]) -> str:
    return "\n".join(
        f"{i}. User: {getattr(turn, 'input', None)}\n   Assistant: {getattr(turn, 'actual_output', None)}"
        for i, turn in enumerate(turns, 1)
    )


class _Outcome(_Judgement):
    """What a metric's `evaluate` returned, carried through our batch runner untouched."""

    payload: Any = None


class _Adapter:
    """Presents an eval_lib-style metric to `tracejudge.metrics.evaluate_conversations` (concurrency, isolation).

    Its own name, threshold and model are only what the runner needs to report a raised exception; the rows take
    them from the wrapped metric, as eval_lib does.
    """

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self.name = str(getattr(metric, "name", type(metric).__name__))
        self.threshold = 0.0
        self.model_name = ""

    async def evaluate(self, conversation: Any) -> _Outcome:
        payload = await self.metric.evaluate(conversation)
        return _Outcome.model_construct(name=self.name, threshold=0.0, model="", payload=payload)


def _row(metric: Any, outcome: _Judgement) -> MetricResult:
    """A metrics_data row as eval_lib builds it: name, threshold, model from the metric; the rest from its dict."""
    name = getattr(metric, "name", type(metric).__name__)
    threshold = getattr(metric, "threshold", None)
    model = getattr(metric, "model", None)
    payload = outcome.payload if isinstance(outcome, _Outcome) else None
    if isinstance(payload, Mapping) and "score" in payload and "success" in payload:
        return MetricResult(
            name=name,
            score=payload["score"],
            threshold=threshold,
            success=payload["success"],
            evaluation_cost=payload.get("evaluation_cost", 0) or 0,
            reason=payload.get("reason"),
            evaluation_model=model,
            evaluation_log=payload.get("evaluation_log"),
        )
    if isinstance(payload, _Judgement):  # one of our own judges, given to this runner directly
        return MetricResult(
            name=name,
            score=payload.score,
            threshold=threshold,
            success=payload.success,
            evaluation_cost=round(payload.cost_usd or 0.0, 6),
            reason=payload.reason,
            evaluation_model=model,
            evaluation_log=payload.model_dump(mode="json"),
        )
    if isinstance(outcome, _Outcome):
        reason = f"metric returned {type(payload).__name__}, not a dict with 'score' and 'success'"
        error_kind = ERROR_INTERNAL
    else:  # the metric raised: our runner turned it into a failure value
        reason = outcome.reason or outcome.error or "metric failed"
        error_kind = outcome.error_kind or ERROR_INTERNAL
    return MetricResult(
        name=name,
        score=None,
        threshold=threshold,
        success=False,
        evaluation_cost=0.0,
        reason=reason,
        evaluation_model=model,
        evaluation_log={"error": reason, "error_kind": error_kind},
    )


def _dialogue(case: Any) -> list[dict[str, Any]]:
    dialogue: list[dict[str, Any]] = []
    for turn in getattr(case, "turns", None) or []:
        dialogue.append({"role": "user", "content": getattr(turn, "input", None)})
        dialogue.append({"role": "assistant", "content": getattr(turn, "actual_output", None)})
    return dialogue


def _override_verbose(metrics: Sequence[Any], verbose: bool) -> list[tuple[Any, Any]]:
    """eval_lib runs every metric with the batch's `verbose` and restores the metric's own afterwards."""
    saved: list[tuple[Any, Any]] = []
    seen: set[int] = set()
    for metric in metrics:
        if id(metric) in seen:
            continue
        seen.add(id(metric))
        original = getattr(metric, "verbose", True)
        try:
            metric.verbose = verbose
        except Exception:  # a frozen or slotted foreign metric: leave it as it is
            continue
        saved.append((metric, original))
    return saved


def _restore_verbose(saved: list[tuple[Any, Any]]) -> None:
    for metric, original in saved:
        try:
            metric.verbose = original
        except Exception:
            pass


async def evaluate_conversations(
    conv_cases: Sequence[ConversationalEvalTestCase],
    metrics: Sequence[Any],
    verbose: bool = True,
    *,
    max_concurrency: int = 16,
) -> list[tuple[None, list[ConversationalTestCaseResult]]]:
    """eval_lib's `evaluate_conversations`: one `(None, [ConversationalTestCaseResult])` per case, in input order.

    `metrics` may be ours or any eval_lib-style metric object. Every (conversation, metric) judgement runs
    concurrently (at most `max_concurrency` at once) instead of one after another; a metric that raises or returns
    something other than eval_lib's dict gives a row with `score` None and `success` False instead of aborting the
    batch. A conversation passes when all its rows pass (so with no metrics it passes, as in eval_lib).
    """
    started = time.perf_counter()
    cases = list(conv_cases)
    metric_list = list(metrics)
    if verbose:
        print(f"tracejudge.metrics.compat: {len(cases)} conversation(s) × {len(metric_list)} metric(s)", flush=True)
    saved = _override_verbose(metric_list, verbose)
    try:
        judged = await _evaluate_all(cases, [_Adapter(m) for m in metric_list], max_concurrency=max_concurrency)
    finally:
        _restore_verbose(saved)
    results: list[tuple[None, list[ConversationalTestCaseResult]]] = []
    for case, conversation in zip(cases, judged, strict=True):
        rows = [_row(metric, outcome) for metric, outcome in zip(metric_list, conversation.metrics, strict=True)]
        result = ConversationalTestCaseResult(
            dialogue=_dialogue(case),
            success=all(row.success for row in rows),
            metrics_data=rows,
            chatbot_role=getattr(case, "chatbot_role", None),
            name=getattr(case, "name", None),
        )
        results.append((None, [result]))
    if verbose:
        _print_summary(results, time.perf_counter() - started)
    return results


def _number(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, int | float) and not isinstance(value, bool) else "—"


def _format_metric(result: Mapping[str, Any], default_name: str) -> str:
    success = bool(result.get("success"))
    score = result.get("score")
    status = "PASSED" if success else ("ERROR" if score is None else "FAILED")
    return (
        f"{result.get('name', default_name)}: {status} score={_number(score, '.2f')} "
        f"cost=${_number(result.get('evaluation_cost'), '.6f')}\n  reason: {result.get('reason') or ''}"
    )


def _print_summary(results: list[tuple[None, list[ConversationalTestCaseResult]]], elapsed: float) -> None:
    total_cost = 0.0
    passed = 0
    lines: list[str] = []
    for index, (_, (result,)) in enumerate(results, 1):
        cost = sum(row.evaluation_cost for row in result.metrics_data if isinstance(row.evaluation_cost, int | float))
        total_cost += cost
        passed += bool(result.success)
        label = f" {result.name}" if result.name else ""
        lines.append(
            f"conversation {index}/{len(results)}{label}: {'PASSED' if result.success else 'FAILED'} cost=${cost:.6f}"
        )
        for row in result.metrics_data:
            mark = "ok " if row.success else ("ERR" if row.score is None else "no ")
            lines.append(f"  {mark} {row.name}: {_number(row.score, '.2f')}  {(row.reason or '')[:120]}")
    total = len(results)
    rate = passed / total * 100 if total else 0.0
    lines.append(
        f"passed {passed}/{total} ({rate:.1f}%), total cost ${total_cost:.6f}, {elapsed:.2f}s "
        f"({elapsed / total if total else 0.0:.2f}s per conversation)"
    )
    print("\n".join(lines), flush=True)
