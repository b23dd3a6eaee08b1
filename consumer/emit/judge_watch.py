"""Prometheus series that watch the judge itself: the canary (a fixed labelled set judged on a schedule) and the
shadow judge (a second model on a sample of live conversations). Kept apart from the production series: nothing
here changes a verdict count, a rate or an alert of any agent."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tracejudge.metrics import MetricResult

from ..judging.judgement import PURPOSE_CANARY, PURPOSE_LIVE, PURPOSE_SHADOW

__all__ = ["PURPOSE_CANARY", "PURPOSE_LIVE", "PURPOSE_SHADOW", "CanaryInstruments", "ShadowInstruments"]


class CanaryInstruments:
    """tracejudge_canary_*: one run's figures per metric, model and rubric version, set by the replica running it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["metric", "model", "rubric_version"]
        self.accuracy = Gauge(
            "tracejudge_canary_accuracy",
            "Share of canary conversations judged as labelled (last run)",
            labels,
            registry=registry,
        )
        self.kappa = Gauge(
            "tracejudge_canary_kappa",
            "Cohen's kappa of the last canary run against its labels (linearly weighted for conversational_flow)",
            labels,
            registry=registry,
        )
        self.flips = Counter(
            "tracejudge_canary_flips_total",
            "Canary conversations whose verdict differs from the previous run with the same rubric version",
            labels,
            registry=registry,
        )
        self.last_run = Gauge(
            "tracejudge_canary_last_run_timestamp_seconds",
            "When the last canary run finished (Unix seconds)",
            labels,
            registry=registry,
        )
        self.floor = Gauge(
            "tracejudge_canary_accuracy_floor",
            "The accuracy TracejudgeCanaryRegressed compares with: the calibration report's (or the configured) "
            "accuracy minus --canary-margin",
            ["metric"],
            registry=registry,
        )
        self.runs = Counter("tracejudge_canary_runs_total", "Canary runs made by this replica", registry=registry)
        self.errors = Counter(
            "tracejudge_canary_errors_total",
            "Canary judge calls without a verdict, by reason (budget: refused by --max-cost-per-hour)",
            ["metric", "reason"],
            registry=registry,
        )
        self._shown: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def record_run(
        self, metric: str, model: str, rubric_version: str, accuracy: float | None, kappa: float | None, flips: int
    ) -> None:
        labels = (metric, model, rubric_version)
        with self._lock:
            self._shown.add(labels)
        if accuracy is not None:
            self.accuracy.labels(*labels).set(accuracy)
        if kappa is not None:
            self.kappa.labels(*labels).set(kappa)
        self.flips.labels(*labels).inc(flips)  # created at 0 on the first run, so increase() sees the first flip
        self.last_run.labels(*labels).set(time.time())

    def forget_runs(self) -> None:
        """This replica no longer runs the canary: its last figures go (the new owner reports); counters stay."""
        with self._lock:
            shown, self._shown = self._shown, set()
        for labels in shown:
            for gauge in (self.accuracy, self.kappa, self.last_run):
                try:
                    gauge.remove(*labels)
                except KeyError:
                    pass


class _ShadowWindows(Collector):
    """tracejudge_shadow_agreement and tracejudge_shadow_hallucination_rate over the same window as the primary's
    rates (the last N shadowed conversations within T seconds), computed at scrape time."""

    def __init__(self, window_sessions: int, window_seconds: float) -> None:
        self.window_sessions = window_sessions
        self.window_seconds = window_seconds
        self._agreement: dict[tuple[str, str, str], deque[tuple[float, float]]] = {}
        self._hallucination: dict[tuple[str, str], deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()

    def _add(self, windows: dict, key: tuple[str, ...], value: float, now: float) -> None:
        window = windows.get(key)
        if window is None:
            window = windows[key] = deque(maxlen=self.window_sessions)
        window.append((now, value))

    def add(self, metric: str, model: str, shadow_model: str, agrees: bool, now: float | None = None) -> None:
        with self._lock:
            self._add(self._agreement, (metric, model, shadow_model), 1.0 if agrees else 0.0, now or time.monotonic())

    def add_hallucination(self, agent: str, shadow_model: str, hallucination: bool, now: float | None = None) -> None:
        with self._lock:
            self._add(self._hallucination, (agent, shadow_model), float(hallucination), now or time.monotonic())

    def _means(self, windows: dict, now: float) -> dict[tuple[str, ...], float]:
        cutoff = now - self.window_seconds
        out = {}
        for key, window in windows.items():
            while window and window[0][0] < cutoff:
                window.popleft()
            if window:
                out[key] = sum(v for _, v in window) / len(window)
        return out

    def agreement(self, now: float | None = None) -> dict[tuple[str, ...], float]:
        with self._lock:
            return self._means(self._agreement, now or time.monotonic())

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("tracejudge_shadow_agreement", "", labels=["metric", "model", "shadow_model"])
        yield GaugeMetricFamily("tracejudge_shadow_hallucination_rate", "", labels=["agent", "shadow_model"])

    def collect(self) -> Iterator[Metric]:
        now = time.monotonic()
        with self._lock:
            agreement = self._means(self._agreement, now)
            hallucination = self._means(self._hallucination, now)
        family = GaugeMetricFamily(
            "tracejudge_shadow_agreement",
            "Share of shadowed conversations where the shadow judge's verdict equals the primary's (recent window)",
            labels=["metric", "model", "shadow_model"],
        )
        for key, value in agreement.items():
            family.add_metric(list(key), value)
        yield family
        family = GaugeMetricFamily(
            "tracejudge_shadow_hallucination_rate",
            "The shadow judge's hallucination share over the agent's recent shadowed conversations",
            labels=["agent", "shadow_model"],
        )
        for key, value in hallucination.items():
            family.add_metric(list(key), value)
        yield family


class ShadowInstruments:
    """The shadow judge's series: agreement with the primary, disagreements by verdict pair, its own rates."""

    def __init__(self, registry: CollectorRegistry, *, window_sessions: int, window_seconds: float) -> None:
        self.windows = _ShadowWindows(window_sessions, window_seconds)
        registry.register(self.windows)
        self.disagreements = Counter(
            "tracejudge_shadow_disagreements_total",
            "Shadowed conversations where the shadow's verdict differs from the primary's, by the two verdicts",
            ["metric", "primary", "shadow"],
            registry=registry,
        )
        self.errors = Counter(
            "tracejudge_shadow_errors_total",
            "Shadow judge calls without a verdict, by reason (budget: its share of --max-cost-per-hour is spent)",
            ["metric", "reason"],
            registry=registry,
        )

    def record(self, agent: str, primary: list[MetricResult], shadow: list[MetricResult]) -> None:
        """Compare each shadow verdict with the primary verdict of the same metric (both valid), per agent label."""
        by_metric = {r.name: r for r in primary if r.error is None and r.verdict is not None}
        for result in shadow:
            if result.error is not None or result.verdict is None:
                self.errors.labels(metric=result.name, reason=result.error_kind or "unknown").inc()
                continue
            if result.name == "failure_rate":
                self.windows.add_hallucination(agent, result.model, result.verdict == "hallucination")
            mine = by_metric.get(result.name)
            if mine is None:
                continue
            agrees = mine.verdict == result.verdict
            self.windows.add(result.name, mine.model, result.model, agrees)
            if not agrees:
                self.disagreements.labels(metric=result.name, primary=mine.verdict, shadow=result.verdict).inc()
