"""The canary: a fixed labelled set judged through the live judges every `--canary-interval`.

Providers reroute a model name to a new snapshot without notice; a rubric edit changes every verdict at once. The
canary measures the instrument on the same inputs each time: accuracy and kappa against the labels, and flips
(verdicts that differ from the previous run with the same rubric version). Its calls go through the judge pool (the
same concurrency, rate limit and budget) but never through `Delivery`: no canary verdict reaches the results topic,
a production gauge or an alert of any agent.

Runs are aligned to wall-clock slots (multiples of the interval since the epoch) and made only by the replica that
owns judge-queue partition 0, so with several replicas exactly one runs each slot, and a new owner waits for the
next slot instead of running one its predecessor already ran.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tracejudge._shared.rate_limited_log import RateLimitedLog
from tracejudge.metrics import HolisticJudgeMetric, MetricResult
from tracejudge.metrics.calibration import accuracy, cohen_kappa, confusion_matrix

from .gold import KAPPA_WEIGHTING, LABELS, DatasetError, GoldItem, labels_with, load_dataset
from .judgement import PURPOSE_CANARY
from .pool import JudgePool


class CanaryRecorder(Protocol):
    """Where the canary's figures go (emit.prometheus.ConsumerInstruments): its instruments and the side cost."""

    canary: Any

    def record_side_cost(self, results: Iterable[MetricResult], purpose: str) -> None: ...


logger = logging.getLogger("tracejudge.consumer.judging.canary")
RUN_TIMEOUT_S = 600.0  # a run's calls answered interactively
BATCH_RUN_TIMEOUT_S = 25 * 3600.0  # at --judge-tier batch a run waits for its batch: the provider's 24 h window
PER_LABEL = 4  # the default set: 4 conversations of each Failure Rate label of the built-in gold set (6 × 4 = 24)
BALANCED_BY = "failure_rate"


def default_items(items: Sequence[GoldItem]) -> list[GoldItem]:
    """A fixed, balanced subset: the first PER_LABEL ids (sorted) of each Failure Rate label, in label order."""
    by_label: dict[str, list[GoldItem]] = defaultdict(list)
    for item in sorted(items, key=lambda i: i.id):
        label = item.labels.get(BALANCED_BY)
        if label is not None and len(by_label[label]) < PER_LABEL:
            by_label[label].append(item)
    return [item for label in LABELS[BALANCED_BY] for item in by_label[label]]


def load_canary_items(path: str | None, judge_files: Sequence[str] = ()) -> list[GoldItem]:
    """The canary set: a user file in the calibrate format, or the default subset; DatasetError: one line.
    `judge_files`: rubric files whose judges' labels a user file may carry."""
    dataset = load_dataset(path, labels_with(tuple(judge_files)))
    return default_items(dataset.items) if path is None else dataset.items


def calibration_accuracies(path: str | None) -> dict[str, float]:
    """Per metric, the accuracy a `tracejudge calibrate --output` report measured (empty without one)."""
    if not path:
        return {}
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
        return {
            name: float(m["accuracy"]) for name, m in report.get("metrics", {}).items() if m.get("accuracy") is not None
        }
    except (OSError, ValueError, AttributeError, TypeError):
        return {}  # --calibration itself was validated at startup; a report without accuracies has no floor


@dataclass
class CanaryRun:
    slot: int
    finished_at: float
    figures: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)


class Canary:
    """A thread started with the judge worker; `owns()` says whether this replica runs the canary now."""

    def __init__(
        self,
        interval_s: float,
        items: Sequence[GoldItem],
        judges: Sequence[HolisticJudgeMetric],
        pool: JudgePool,
        prometheus: CanaryRecorder,
        owns: Callable[[], bool],
        *,
        floors: dict[str, float] | None = None,
        margin: float = 0.1,
        timeout_s: float = RUN_TIMEOUT_S,
    ) -> None:
        self.interval_s = interval_s
        self.items = list(items)
        self.judges = [j for j in judges if any(j.name in item.labels for item in self.items)]
        self.pool = pool
        self.instruments = prometheus.canary
        self.prometheus = prometheus
        self.owns = owns
        self.timeout_s = timeout_s
        self.runs: list[CanaryRun] = []  # this process's runs (tests, logs)
        # The previous run's verdicts per (metric, model, rubric version): what a flip is measured against.
        self._previous: dict[tuple[str, str, str], dict[str, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tracejudge-canary", daemon=True)
        self._log = RateLimitedLog(logger, interval_s=60.0)
        self._owner = False
        for name in {j.name for j in self.judges}:
            floor = (floors or {}).get(name)
            if floor is not None:
                self.instruments.floor.labels(metric=name).set(max(0.0, floor - margin))

    def start(self) -> Canary:
        logger.info(
            "canary: %d conversations every %gs (%s), run by the owner of judge-queue partition 0",
            len(self.items),
            self.interval_s,
            ", ".join(j.name for j in self.judges),
        )
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            slot = int(now // self.interval_s) + 1
            if self._stop.wait(max(0.0, slot * self.interval_s - now)):
                return
            owner = self.owns()
            if not owner:
                if self._owner:
                    self.instruments.forget_runs()  # the new owner reports from its next run
                self._owner = False
                continue
            self._owner = True
            try:
                self.run(slot)
            except Exception:  # the canary never takes the consumer down; every failed run is counted and heard
                if self._stop.is_set():
                    return  # the pool stopped under a run at shutdown
                self.instruments.errors.labels(metric="all", reason="run_failed").inc()
                logger.exception("the canary run failed (it runs again at the next interval)")

    def run(self, slot: int = 0) -> CanaryRun:
        """Judge every labelled item once with each judge; export the figures. Blocks until done."""
        calls = [(item, judge) for item in self.items for judge in self.judges if judge.name in item.labels]
        future = self.pool.evaluate_side([(judge, item.case()) for item, judge in calls])
        try:
            results = future.result(self.timeout_s)
        except (concurrent.futures.CancelledError, concurrent.futures.TimeoutError):
            future.cancel()
            self.instruments.errors.labels(metric="all", reason="cancelled").inc()
            raise
        self.instruments.runs.inc()
        run = CanaryRun(slot, time.time())
        by_judge: dict[str, list[tuple[GoldItem, MetricResult]]] = defaultdict(list)
        for (item, judge), result in zip(calls, results, strict=True):
            if result is None:
                self.instruments.errors.labels(metric=judge.name, reason="budget").inc()
                continue
            by_judge[judge.name].append((item, result))
        self.prometheus.record_side_cost([r for pairs in by_judge.values() for _, r in pairs], PURPOSE_CANARY)
        for judge in self.judges:
            run.figures[(judge.name, judge.model_name, judge.rubric_version)] = self._figures(
                judge, by_judge.get(judge.name, [])
            )
        self.runs.append(run)
        return run

    def _figures(self, judge: HolisticJudgeMetric, pairs: list[tuple[GoldItem, MetricResult]]) -> dict[str, Any]:
        labels = LABELS.get(judge.name) or tuple(judge.weights)  # a built-in's in its rubric order (Flow's kappa)
        verdicts: dict[str, str] = {}
        for item, result in pairs:
            if result.error is not None or result.verdict not in labels:
                self.instruments.errors.labels(metric=judge.name, reason=result.error_kind or "unknown").inc()
                continue
            verdicts[item.id] = result.verdict
        failed = len(pairs) - len(verdicts)
        if failed:
            self._log.warning(
                "canary: %d of %d %s calls gave no verdict (tracejudge_canary_errors_total says why); "
                "check the judge model and --max-cost-per-hour",
                failed,
                len(pairs),
                judge.name,
            )
        gold = {item.id: item.labels[judge.name] for item, _ in pairs}
        matrix = confusion_matrix(((gold[i], v) for i, v in verdicts.items()), labels)
        key = (judge.name, judge.model_name, judge.rubric_version)
        previous = self._previous.get(key, {})
        flipped = sorted(i for i, v in verdicts.items() if i in previous and previous[i] != v)
        self._previous[key] = {**previous, **verdicts}
        figures = {
            "n": len(verdicts),
            "failed": failed,
            "accuracy": accuracy(matrix),
            "kappa": cohen_kappa(matrix, KAPPA_WEIGHTING.get(judge.name, "unweighted")),
            "flips": len(flipped),
            "flipped": flipped,
        }
        self.instruments.record_run(*key, figures["accuracy"], figures["kappa"], len(flipped))
        if flipped:
            logger.warning(
                "canary: %d %s verdicts flipped since the last run on unchanged inputs (%s, rubric %s): %s",
                len(flipped),
                judge.name,
                judge.model_name,
                judge.rubric_version,
                ", ".join(flipped[:10]),
            )
        return figures


__all__ = ["Canary", "CanaryRun", "DatasetError", "default_items", "load_canary_items"]
