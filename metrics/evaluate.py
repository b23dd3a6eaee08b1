"""Run many judges over many conversations concurrently; one failing metric never aborts the batch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ._cases import ConversationalEvalTestCase
from ._judge import HolisticJudgeMetric
from ._printing import print_results_table
from ._results import ERROR_INTERNAL, ConversationResult, MetricResult
from .runner import JudgeRunner


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
    runner = JudgeRunner(max_concurrency)  # no rate limit, no budget; a metric's exception is its failed result

    async def run(metric: HolisticJudgeMetric, conversation: ConversationalEvalTestCase) -> MetricResult:
        result = await runner.call(metric, conversation, lambda: _guarded(metric, conversation))
        assert result is not None  # no budget cap: never refused
        return result

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
