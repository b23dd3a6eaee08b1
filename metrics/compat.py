"""A drop-in for the seeds' library (`eval_lib`, PyPI `eval-ai-library` 0.8.2): its names and its result shapes.

A script written against `eval_lib` runs unchanged once `from eval_lib import ...` becomes
`from tracejudge.metrics.compat import ...`: `await metric.evaluate(case)` returns eval_lib's dict, and
`evaluate_conversations` returns its `(None, [ConversationalTestCaseResult])` pairs, with `metrics_data` rows of its
`MetricResult` shape. Underneath run our judges (`tracejudge.metrics`): strict labels, a corrective retry, bounded
retries with timeouts, and the judge calls of a batch concurrent.

Where eval_lib guesses, this module does not: a judgement that could not be made (unknown label, unparseable answer,
timeout, provider error, a conversation without turns, a metric that raised) is `score=None`, `success=False` with
the reason, never a made-up score. eval_lib would have scored an unknown Failure Rate label as `not_applicable`
(1.0, a pass), an unknown Flow label as 0.0, judged an empty conversation anyway, and aborted the whole batch on the
first exception.

The names repeat `tracejudge.metrics`' on purpose: `MetricResult`, `FailureRateMetric`, `ConversationalFlowRateMetric`,
`CustomLLMClient` and `evaluate_conversations` here are eval_lib's (its shapes, its return values), not ours, because a
drop-in must be importable under the library's own names. Where this module uses ours, it imports them under other names
(`_Judgement`, `_FailureJudge`, `_FlowJudge`, `_JudgeClient`) so that each name means one thing in this file.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ._backends import resolve_backend
from ._cases import ConversationalEvalTestCase, EvalTestCase
from ._client import CustomLLMClient as _JudgeClient
from ._judge import HolisticJudgeMetric
from ._results import ERROR_INTERNAL
from ._results import MetricResult as _Judgement
from .conversational_flow import ConversationalFlowRateMetric as _FlowJudge
from .failure_rate import FailureRateMetric as _FailureJudge
from .runner import JudgeRunner

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
    def threshold(self) -> float:
        return self._judge.threshold

    @threshold.setter
    def threshold(self, value: float) -> None:
        """Kept on the judge too, so `evaluation_log["judge"]` agrees with the result after a change."""
        self._judge.threshold = value

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


def _attr(metric: Any, name: str, default: Any) -> Any:
    """Read a metric's attribute; a property of a foreign metric that raises must not abort the batch."""
    try:
        return getattr(metric, name, default)
    except Exception:
        return default


def _failed_row(metric: Any, reason: str, error_kind: str) -> MetricResult:
    return MetricResult(
        name=_attr(metric, "name", type(metric).__name__),
        score=None,
        threshold=_attr(metric, "threshold", None),
        success=False,
        evaluation_cost=0.0,
        reason=reason,
        evaluation_model=_attr(metric, "model", None),
        evaluation_log={"error": reason, "error_kind": error_kind},
    )


def _row(metric: Any, payload: Any) -> MetricResult:
    """A metrics_data row as eval_lib builds it: name, threshold, model read from the metric right after its
    `evaluate` returned; the rest from its dict."""
    name = _attr(metric, "name", type(metric).__name__)
    threshold = _attr(metric, "threshold", None)
    model = _attr(metric, "model", None)
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
    if isinstance(payload, Mapping):
        missing = " and ".join(repr(key) for key in ("score", "success") if key not in payload)
        return _failed_row(metric, f"metric returned a dict without {missing}", ERROR_INTERNAL)
    return _failed_row(metric, f"metric returned {type(payload).__name__}, not a dict", ERROR_INTERNAL)


def _concurrency_safe(metric: Any) -> bool:
    """Our judges keep no per-call state. Anyone else's metric may (eval_lib's ToolCorrectnessMetric sets
    `self.tools_called` from the case) and was written for eval_lib, which calls it one conversation at a time; so
    may a subclass of ours that overrides `evaluate`."""
    for base in (_HolisticMetric, HolisticJudgeMetric):
        if isinstance(metric, base):
            return getattr(type(metric), "evaluate", None) is base.evaluate
    return False


async def _judge_one(metric: Any, case: Any) -> MetricResult:
    try:
        payload = await metric.evaluate(case)
    except Exception as exc:
        return _failed_row(metric, f"metric raised {exc!r}", ERROR_INTERNAL)
    try:
        return _row(metric, payload)
    except Exception as exc:  # e.g. a Mapping whose lookups raise
        return _failed_row(metric, f"metric result unreadable: {exc!r}", ERROR_INTERNAL)


def _dialogue(case: Any) -> list[dict[str, Any]]:
    dialogue: list[dict[str, Any]] = []
    for turn in getattr(case, "turns", None) or []:
        dialogue.append({"role": "user", "content": getattr(turn, "input", None)})
        dialogue.append({"role": "assistant", "content": getattr(turn, "actual_output", None)})
    return dialogue


# id(metric) -> [metric, its own verbose, batches running it]. Batches may overlap (asyncio.gather, threads): the
# metric's own value is taken by the first and put back by the last, never a value another batch set meanwhile.
_verbose_overrides: dict[int, list[Any]] = {}
_verbose_lock = threading.Lock()


def _override_verbose(metrics: Sequence[Any], verbose: bool) -> list[Any]:
    """eval_lib runs every metric with the batch's `verbose` and restores the metric's own afterwards."""
    entered: list[Any] = []
    with _verbose_lock:
        for metric in {id(m): m for m in metrics}.values():
            entry = _verbose_overrides.get(id(metric))
            original = entry[1] if entry else _attr(metric, "verbose", True)
            try:
                metric.verbose = verbose
            except Exception:  # a frozen or slotted foreign metric: leave it as it is
                continue
            if entry:
                entry[2] += 1
            else:
                _verbose_overrides[id(metric)] = [metric, original, 1]
            entered.append(metric)
    return entered


def _restore_verbose(entered: list[Any]) -> None:
    with _verbose_lock:
        for metric in entered:
            entry = _verbose_overrides[id(metric)]
            entry[2] -= 1
            if entry[2] == 0:
                del _verbose_overrides[id(metric)]
                try:
                    metric.verbose = entry[1]
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

    `metrics` may be ours or any eval_lib-style metric object. Our judges run concurrently across conversations and
    metrics (at most `max_concurrency` calls at once) instead of one after another; a metric object of anyone else's
    is called for one conversation at a time, in order, as eval_lib does (it may keep per-call state on itself), while
    the rest runs alongside. A metric that raises or returns something other than eval_lib's dict gives a row with
    `score` None and `success` False instead of aborting the batch. A conversation passes when all its rows pass (so
    with no metrics it passes, as in eval_lib).
    """
    runner = JudgeRunner(max_concurrency)  # no rate limit, no budget
    started = time.perf_counter()
    cases = list(conv_cases)
    metric_list = list(metrics)
    if verbose:
        print(f"tracejudge.metrics.compat: {len(cases)} conversation(s) × {len(metric_list)} metric(s)", flush=True)
    serial = {id(m) for m in metric_list if not _concurrency_safe(m)}

    async def run(metric: Any, case: Any) -> MetricResult:
        row = await runner.call(
            metric,
            case,
            lambda: _judge_one(metric, case),
            serial=id(metric) in serial,  # someone else's metric: one conversation at a time, as eval_lib calls it
        )
        assert row is not None  # no budget cap: never refused
        return row

    entered = _override_verbose(metric_list, verbose)
    try:
        flat = await asyncio.gather(*(run(metric, case) for case in cases for metric in metric_list))
    finally:
        _restore_verbose(entered)
    width = len(metric_list)
    results: list[tuple[None, list[ConversationalTestCaseResult]]] = []
    for index, case in enumerate(cases):
        rows = list(flat[index * width : (index + 1) * width])
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
