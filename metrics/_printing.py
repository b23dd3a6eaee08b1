"""Verdicts on the terminal (rich): one result, or a table of a batch. Below both the judges and evaluate()."""

from __future__ import annotations

from collections.abc import Sequence

from ._results import ConversationResult, MetricResult


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
