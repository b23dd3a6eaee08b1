"""`tracejudge calibrate`: run the judges over a labelled gold set and measure how often their label is right.

The dataset is validated whole before the first judge call; judge failures are counted apart from the confusion
matrix; the report (JSON) carries the hallucination counts `consume --calibration` corrects live rates with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from tracejudge._shared.text import counted
from tracejudge.metrics import (
    CustomLLMClient,
    HolisticJudgeMetric,
    MetricResult,
)
from tracejudge.metrics.calibration import (
    accuracy,
    binary_stats,
    cohen_kappa,
    confusion_matrix,
)

from ..judging.gold import (  # the dataset format lives in gold.py (the canary reads it too); names kept here
    KAPPA_WEIGHTING,
    LABELS,
    Dataset,
    DatasetError,
    GoldItem,
    labels_with,
    load_dataset,
)

EXIT_OK, EXIT_GATE, EXIT_USAGE = 0, 1, 2
POSITIVE_LABEL = {"failure_rate": "hallucination"}
# The consumer options that mean something here; the rest (Kafka, outputs, windows) are not offered.
CALIBRATE_OPTIONS = frozenset(
    {
        "judge_model",
        "metrics",
        "max_concurrency",
        "max_requests_per_minute",
        "max_cost_per_hour",
        "judge_timeout",
        "judge_retries",
        "judge_check",
        "threshold",
        "redact",
        "log_format",
        "log_level",
        "judge_files",
    }
)
SKIPPED_BUDGET = "skipped_budget"


@dataclass(slots=True)
class Outcome:
    item: GoldItem
    metric: str
    result: MetricResult


async def judge_items(
    items: list[GoldItem],
    judges: list[HolisticJudgeMetric],
    *,
    max_concurrency: int = 16,
    max_requests_per_minute: float | None = None,
    max_cost_per_hour: float | None = None,
    on_done: Callable[[], None] | None = None,
) -> list[Outcome]:
    """Judge each item with each judge whose metric it has a gold label for; order follows the input."""
    from tracejudge.metrics.runner import JudgeRunner

    runner = JudgeRunner(max_concurrency, max_requests_per_minute, max_cost_per_hour)  # the limits `consume` uses
    jobs = [(item, judge) for item in items for judge in judges if judge.name in item.labels]

    async def run(item: GoldItem, judge: HolisticJudgeMetric) -> Outcome:
        result = await runner.run(judge, item.case())
        if result is None:
            result = MetricResult(name=judge.name, threshold=judge.threshold, model=judge.model_name)
            result.error, result.error_kind = "skipped: --max-cost-per-hour reached", SKIPPED_BUDGET
        if on_done is not None:
            on_done()
        return Outcome(item, judge.name, result)

    return list(await asyncio.gather(*(run(item, judge) for item, judge in jobs)))


def _sum(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _per_label(labels: tuple[str, ...], matrix: list[list[int]]) -> dict[str, dict[str, Any]]:
    """Each label's agreement: gold items (row), judge verdicts (column), both (diagonal); recall and precision
    (None where undefined) say which label the judge confuses, for any judge's labels."""
    figures: dict[str, dict[str, Any]] = {}
    for i, label in enumerate(labels):
        gold, judged, agreed = sum(matrix[i]), sum(row[i] for row in matrix), matrix[i][i]
        figures[label] = {
            "gold": gold,
            "judge": judged,
            "agreed": agreed,
            "recall": agreed / gold if gold else None,
            "precision": agreed / judged if judged else None,
        }
    return figures


def metric_report(
    metric: str, outcomes: list[Outcome], rubric_version: Any = None, labels: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """`labels`: the judge's (default a built-in's); a rubric file's judge's kappa is unweighted."""
    labels = LABELS[metric] if labels is None else labels
    judged = [o for o in outcomes if o.result.error is None and o.result.verdict in labels]
    failed = [o for o in outcomes if o not in judged]
    matrix = confusion_matrix(((o.item.labels[metric], o.result.verdict or "") for o in judged), labels)
    report: dict[str, Any] = {
        "rubric_version": rubric_version,
        "labelled": len(outcomes),
        "n": len(judged),
        "judge_failures": len(failed),
        "judge_failure_kinds": dict(Counter(o.result.error_kind or "unknown" for o in failed)),
        "accuracy": accuracy(matrix),
        "kappa": cohen_kappa(matrix, KAPPA_WEIGHTING.get(metric, "unweighted")),
        "kappa_weighting": KAPPA_WEIGHTING.get(metric, "unweighted"),
        "labels": list(labels),
        "confusion_matrix": matrix,
        "per_label": _per_label(labels, matrix),
        "cost_usd": _sum([o.result.cost_usd for o in outcomes]),
        "input_tokens": _sum([o.result.input_tokens for o in outcomes]),
        "output_tokens": _sum([o.result.output_tokens for o in outcomes]),
        "cached_input_tokens": _sum([o.result.cached_input_tokens for o in outcomes]),
        "cache_write_input_tokens": _sum([o.result.cache_write_input_tokens for o in outcomes]),
    }
    positive = POSITIVE_LABEL.get(metric)
    if positive is not None:
        report[positive] = binary_stats(matrix, labels, positive)
    return report


def build_report(
    dataset: Dataset, judges: list[HolisticJudgeMetric], outcomes: list[Outcome], judge_model: str
) -> dict[str, Any]:
    metrics = {
        judge.name: metric_report(
            judge.name,
            [o for o in outcomes if o.metric == judge.name],
            getattr(judge, "rubric_version", None),
            LABELS.get(judge.name) or tuple(judge.weights),  # a built-in's in its rubric order (Flow's kappa)
        )
        for judge in judges
    }
    try:
        version = metadata.version("tracejudge")
    except metadata.PackageNotFoundError:
        version = None
    return {
        "tracejudge_version": version,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "judge_model": judge_model,
        "dataset": {
            "source": dataset.source,
            "builtin": dataset.builtin,
            "sha256": dataset.sha256,
            "conversations": len(dataset.items),
        },
        "metrics": metrics,
        "cost_usd": _sum([m["cost_usd"] for m in metrics.values()]),
        "input_tokens": _sum([m["input_tokens"] for m in metrics.values()]),
        "output_tokens": _sum([m["output_tokens"] for m in metrics.values()]),
        "cached_input_tokens": _sum([m["cached_input_tokens"] for m in metrics.values()]),
        "cache_write_input_tokens": _sum([m["cache_write_input_tokens"] for m in metrics.values()]),
        "items": [
            {
                "id": o.item.id,
                "metric": o.metric,
                "gold": o.item.labels[o.metric],
                "judge": o.result.verdict,
                "error": o.result.error_kind,
            }
            for o in outcomes
        ],
    }


def gate(report: dict[str, Any], min_accuracy: float | None, min_kappa: float | None) -> list[str]:
    """What the CI gate misses; an undefined figure (no verdicts, kappa undefined) counts as missed."""
    missed: list[str] = []
    for name, metric in report["metrics"].items():
        for key, minimum in (("accuracy", min_accuracy), ("kappa", min_kappa)):
            if minimum is None:
                continue
            value = metric[key]
            if value is None or value < minimum:
                shown = "undefined" if value is None else f"{value:.3f}"
                missed.append(f"{name} {key} {shown} < {minimum:g}")
    return missed


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


# Column headers short enough for an 80-column terminal; rows keep the full label.
_SHORT = {
    "hallucination": "halluc.",
    "honest_fallback": "honest",
    "alternative_proposed": "altern.",
    "not_applicable": "n/a",
}


def print_report(report: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    for name, metric in report["metrics"].items():
        console.print(
            f"\n[bold]{name}[/bold]  n={metric['n']}  accuracy={_fmt(metric['accuracy'])}  "
            f"kappa={_fmt(metric['kappa'])} ({metric['kappa_weighting']})  judge failures={metric['judge_failures']}"
            + (f" {metric['judge_failure_kinds']}" if metric["judge_failures"] else "")
        )
        table = Table(title=f"{name}: gold (rows) × judge (columns)", title_justify="left")
        table.add_column("gold \\ judge")
        for label in metric["labels"]:
            table.add_column(_SHORT.get(label, label), justify="right")
        for i, (label, row) in enumerate(zip(metric["labels"], metric["confusion_matrix"], strict=True)):
            table.add_row(label, *(f"[bold]{c}[/bold]" if i == j else str(c) for j, c in enumerate(row)))
        console.print(table)
        stats = metric.get("hallucination")
        if stats is not None:
            console.print(
                "hallucination: "
                + "  ".join(f"{key}={_fmt(stats[key])}" for key in ("precision", "recall", "f1", "sensitivity"))
                + f"  specificity={_fmt(stats['specificity'])}  (tp={stats['tp']} fp={stats['fp']} "
                f"fn={stats['fn']} tn={stats['tn']})"
            )
    cost = report["cost_usd"]
    console.print(
        f"\njudge {report['judge_model']}: cost {'unknown' if cost is None else f'${cost:.4f}'}, "
        f"tokens in {report['input_tokens'] or 0} (cache read {report['cached_input_tokens'] or 0}, "
        f"cache write {report['cache_write_input_tokens'] or 0}), out {report['output_tokens'] or 0}"
    )


def _usage(message: str) -> int:
    print(f"tracejudge calibrate: {message}", file=sys.stderr)
    return EXIT_USAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dataset", default=None, metavar="PATH.jsonl", help="labelled conversations (default: built-in)"
    )
    parser.add_argument(
        "--output", default=None, metavar="report.json", help="write the report as JSON (default: not written)"
    )
    parser.add_argument(
        "--min-accuracy", type=float, default=None, metavar="X", help="exit 1 below this accuracy (default: no gate)"
    )
    parser.add_argument(
        "--min-kappa", type=float, default=None, metavar="K", help="exit 1 below this kappa (default: no gate)"
    )


def run_calibrate(namespace: argparse.Namespace, judge: str | CustomLLMClient | None = None) -> int:
    """The command: 0, 1 when a --min-* gate is missed, 2 for bad arguments or data (before any judge call)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .._logging import configure_logging
    from ..app import build_judges
    from .options import settings_from_args

    settings = settings_from_args(namespace)
    if namespace.min_accuracy is not None and not 0.0 <= namespace.min_accuracy <= 1.0:
        return _usage(f"--min-accuracy must be within 0..1, got {namespace.min_accuracy:g}")
    if namespace.min_kappa is not None and not -1.0 <= namespace.min_kappa <= 1.0:
        return _usage(f"--min-kappa must be within -1..1, got {namespace.min_kappa:g}")
    if namespace.output is not None:
        parent = Path(namespace.output).resolve().parent
        if not parent.is_dir():
            return _usage(f"--output: directory {parent} does not exist")
        if Path(namespace.output).is_dir():
            return _usage(f"--output: {namespace.output} is a directory")
    try:
        dataset = load_dataset(namespace.dataset, labels_with(settings.judge_files))
    except DatasetError as exc:
        return _usage(str(exc))
    configure_logging(settings.log_level, settings.log_format)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if judge is None:  # a model string: checked (and LiteLLM imported) before the first item is judged
        from .judge_check import refuse_judge

        refused = refuse_judge(settings)
        if refused is not None:
            return refused
    try:
        judges = build_judges(settings, judge)
    except ValueError as exc:  # e.g. an empty judge model name
        return _usage(str(exc))
    jobs = sum(1 for item in dataset.items for j in judges if j.name in item.labels)
    if jobs == 0:
        return _usage(f"{dataset.source}: no conversation has a label for {', '.join(settings.metrics)}")
    console = Console()
    judge_model = judges[0].model_name
    console.print(
        f"calibrating {judge_model} on {dataset.source}: {counted(len(dataset.items), 'conversation')}, "
        f"{jobs} judge calls ({', '.join(j.name for j in judges)})"
    )
    with Progress(
        TextColumn("judging"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True)
    ) as progress:
        task = progress.add_task("judging", total=jobs)
        outcomes = asyncio.run(
            judge_items(
                dataset.items,
                judges,
                max_concurrency=settings.judge_concurrency(len(judges)),
                max_requests_per_minute=settings.max_requests_per_minute,
                max_cost_per_hour=settings.max_cost_per_hour,
                on_done=lambda: progress.advance(task),
            )
        )
    report = build_report(dataset, judges, outcomes, judge_model)
    missed = gate(report, namespace.min_accuracy, namespace.min_kappa)
    report["gate"] = {"min_accuracy": namespace.min_accuracy, "min_kappa": namespace.min_kappa, "missed": missed}
    print_report(report, console)
    if namespace.output is not None:
        try:
            Path(namespace.output).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        except OSError as exc:
            return _usage(f"--output: cannot write {namespace.output}: {exc.strerror or exc}")
        console.print(f"report written to {namespace.output}")
    if missed:
        console.print(f"[red]gate missed: {'; '.join(missed)}[/red]")
        return EXIT_GATE
    return EXIT_OK
