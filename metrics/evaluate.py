"""Run many judges over many conversations concurrently; one failing metric never aborts the batch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ._cases import ConversationalEvalTestCase
from ._judge import HolisticJudgeMetric
from ._results import ERROR_INTERNAL, ConversationResult, MetricResult


async def _guarded(metric: HolisticJudgeMetric, conversation: ConversationalEvalTestCase) -> MetricResult:
    try:
        return await metric.evaluate(conversation)
    except Exception as exc:  # evaluate() already returns failures as values; this catches a foreign metric's bug
        return MetricResult(
            name=getattr(metric, "name", type(metric).__name__),
            threshold=getattr(metric, "threshold", 0.0),
            model=str(getattr(metric, "model_name", "")),
            error=f"metric raised {exc!r}",
            error_kind=ERROR_INTERNAL,
            reason=f"metric raised {exc!r}",
        )


async def evaluate_conversations(
    conversations: Sequence[ConversationalEvalTestCase],
    metrics: Sequence[HolisticJudgeMetric],
    *,
    max_concurrency: int = 16,
    verbose: bool = False,
) -> list[ConversationResult]:
    """One ConversationResult per conversation, in input order, each with one MetricResult per metric in order."""
    if max_concurrency < 1:
        raise ValueError("max_concurrency must be at least 1")
    slots = asyncio.Semaphore(max_concurrency)

    async def run(metric: HolisticJudgeMetric, conversation: ConversationalEvalTestCase) -> MetricResult:
        async with slots:
            return await _guarded(metric, conversation)

    tasks = [run(metric, conversation) for conversation in conversations for metric in metrics]
    flat = await asyncio.gather(*tasks)
    width = len(metrics)
    results = [
        ConversationResult(index=i, name=conversation.name, metrics=list(flat[i * width : (i + 1) * width]))
        for i, conversation in enumerate(conversations)
    ]
    if verbose:
        print_results_table(results)
    return results


def _colour(result: MetricResult) -> str:
    if result.error is not None:
        return "red"
    return "green" if result.success else "yellow"


def print_metric_result(result: MetricResult) -> None:
    from rich.console import Console

    colour = _colour(result)
    score = "error" if result.score is None else f"{result.score:.2f}"
    Console().print(
        f"[bold]{result.name}[/bold] [{colour}]{result.verdict or result.error_kind} score={score}[/{colour}] "
        f"threshold={result.threshold} model={result.model}\n  {result.reason}"
    )


def print_results_table(results: Sequence[ConversationResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tracejudge evaluation")
    for column in ("#", "conversation", "metric", "verdict", "score", "pass", "cost $", "reason"):
        table.add_column(column)
    for conversation in results:
        for result in conversation.metrics:
            colour = _colour(result)
            table.add_row(
                str(conversation.index),
                conversation.name or "",
                result.name,
                f"[{colour}]{result.verdict or result.error_kind}[/{colour}]",
                "—" if result.score is None else f"{result.score:.2f}",
                f"[{colour}]{'yes' if result.success else 'no'}[/{colour}]",
                "—" if result.cost_usd is None else f"{result.cost_usd:.5f}",
                (result.reason or "")[:120],
            )
    Console().print(table)
