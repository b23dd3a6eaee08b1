"""Prometheus metrics on the consumer's own CollectorRegistry. The names are a contract (dashboard, alerts, users)."""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tracejudge.metrics import MetricResult
from tracejudge.metrics.calibration import HallucinationCalibration, corrected_rate
from tracejudge.metrics.conversational_flow import CONVERSATIONAL_FLOW_WEIGHTS
from tracejudge.metrics.failure_rate import FAILURE_RATE_WEIGHTS

from ..judging.feedback import Agreement
from ..judging.judgement import OUTCOME_RETRYING, OUTCOME_SAMPLED_OUT, OUTCOMES, Judgement
from .judge_watch import PURPOSE_LIVE, PURPOSE_SHADOW, CanaryInstruments, ShadowInstruments
from .notify import NotificationInstruments

OTHER_AGENT = "_other"
FAILURE_RATE = "failure_rate"
CONVERSATIONAL_FLOW = "conversational_flow"
VERDICTS = {FAILURE_RATE: tuple(FAILURE_RATE_WEIGHTS), CONVERSATIONAL_FLOW: tuple(CONVERSATIONAL_FLOW_WEIGHTS)}
SCORE_BUCKETS = (0.0, 0.3, 0.4, 0.6, 0.7, 0.9, 1.0)
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0)
# Completion to delivered verdict: seconds (standard), minutes (flex, batch usually), up to a day (a batch's window).
DELAY_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)


class AgentLabels:
    """Cardinality guard: the first `max_agents` distinct names keep their label, later ones become `_other`."""

    def __init__(self, max_agents: int) -> None:
        self.max_agents = max_agents
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, agent: str) -> str:
        if agent in self._known:
            return agent
        with self._lock:
            if agent in self._known:
                return agent
            if len(self._known) < self.max_agents:
                self._known.add(agent)
                return agent
        return OTHER_AGENT


class _Windows(Collector):
    """tracejudge_hallucination_rate and tracejudge_flow_score: per agent, the last N judged conversations,
    limited to the last T seconds, computed at scrape time so an idle agent's window still ages out.

    Each process's own window: with several judge workers each shows its share of the verdicts. The deployment's
    rates come from counters summed across replicas (the recording rules in deploy/prometheus/alerts.yml)."""

    def __init__(self, window_sessions: int, window_seconds: float) -> None:
        self.window_sessions = window_sessions
        self.window_seconds = window_seconds
        self._hallucinations: dict[str, deque[tuple[float, float]]] = {}
        self._flow: dict[str, deque[tuple[float, float]]] = {}
        self._agreement: dict[tuple[str, str], deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()

    def add(self, metric: str, agent: str, score: float, verdict: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            if metric == FAILURE_RATE:
                windows, value = self._hallucinations, 1.0 if verdict == "hallucination" else 0.0
            elif metric == CONVERSATIONAL_FLOW:
                windows, value = self._flow, score
            else:
                return
            window = windows.get(agent)
            if window is None:
                window = windows[agent] = deque(maxlen=self.window_sessions)
            window.append((now, value))

    def add_agreement(self, agent: str, metric: str, agrees: bool, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            window = self._agreement.get((agent, metric))
            if window is None:
                window = self._agreement[(agent, metric)] = deque(maxlen=self.window_sessions)
            window.append((now, 1.0 if agrees else 0.0))

    def agreement(self, now: float | None = None) -> dict[tuple[str, ...], float]:
        now = time.monotonic() if now is None else now
        cutoff = now - self.window_seconds
        out: dict[tuple[str, ...], float] = {}
        with self._lock:
            for key, window in self._agreement.items():
                while window and window[0][0] < cutoff:
                    window.popleft()
                if window:
                    out[key] = sum(v for _, v in window) / len(window)
        return out

    def hallucination_counts(self, now: float | None = None) -> dict[str, tuple[int, int]]:
        """Per agent (hallucination verdicts, judged conversations) over the same window as the rate."""
        now = time.monotonic() if now is None else now
        cutoff = now - self.window_seconds
        out: dict[str, tuple[int, int]] = {}
        with self._lock:
            for agent, window in self._hallucinations.items():
                while window and window[0][0] < cutoff:
                    window.popleft()
                if window:
                    out[agent] = (int(sum(v for _, v in window)), len(window))
        return out

    def values(self, now: float | None = None) -> tuple[dict[str, float], dict[str, float]]:
        now = time.monotonic() if now is None else now
        cutoff = now - self.window_seconds
        out: list[dict[str, float]] = []
        with self._lock:
            for windows in (self._hallucinations, self._flow):
                means: dict[str, float] = {}
                for agent, window in windows.items():
                    while window and window[0][0] < cutoff:
                        window.popleft()
                    if window:
                        means[agent] = sum(v for _, v in window) / len(window)
                out.append(means)
        return out[0], out[1]

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("tracejudge_hallucination_rate", "", labels=["agent"])
        yield GaugeMetricFamily("tracejudge_flow_score", "", labels=["agent"])
        yield GaugeMetricFamily("tracejudge_judge_human_agreement", "", labels=["agent", "metric"])

    def collect(self) -> Iterator[Metric]:
        hallucination, flow = self.values()
        yield _gauge(
            "tracejudge_hallucination_rate",
            "This process's share of Failure Rate verdicts that are hallucination over the agent's recent judged "
            "conversations (per process; across replicas: agent:tracejudge_hallucination_share:ratio10m)",
            ["agent"],
            {(agent,): value for agent, value in hallucination.items()},
        )
        yield _gauge(
            "tracejudge_flow_score",
            "This process's mean Conversational Flow score over the agent's recent judged conversations (per "
            "process; across replicas: agent:tracejudge_flow_score:mean15m)",
            ["agent"],
            {(agent,): value for agent, value in flow.items()},
        )
        yield _gauge(
            "tracejudge_judge_human_agreement",
            "This process's share of conversations with feedback where the judge's pass/fail agrees with the "
            "human's up/down (per process; across replicas: agent_metric:tracejudge_judge_human_agreement:ratio1h)",
            ["agent", "metric"],
            self.agreement(),
        )


class _CorrectedHallucinationRates(Collector):
    """tracejudge_hallucination_rate_corrected{,_lower,_upper}: the window's hallucination share corrected for the
    judge's measured sensitivity and specificity (Rogan–Gladen), with a 95 % interval; only with --calibration."""

    NAMES = (
        "tracejudge_hallucination_rate_corrected",
        "tracejudge_hallucination_rate_corrected_lower",
        "tracejudge_hallucination_rate_corrected_upper",
    )

    def __init__(self, windows: _Windows, calibration: HallucinationCalibration) -> None:
        self.windows = windows
        self.calibration = calibration

    def describe(self) -> Iterator[Metric]:
        for name in self.NAMES:
            yield GaugeMetricFamily(name, "", labels=["agent"])

    def collect(self) -> Iterator[Metric]:
        rates = {
            agent: corrected_rate(positives, n, self.calibration)
            for agent, (positives, n) in self.windows.hallucination_counts().items()
        }
        helps = (
            "This process's hallucination share corrected for judge error (Rogan-Gladen) over the same window as "
            "its raw rate (per process)",
            "Lower end of this process's corrected hallucination share's 95% interval (per process)",
            "Upper end of this process's corrected hallucination share's 95% interval (per process)",
        )
        for name, documentation, field in zip(self.NAMES, helps, ("estimate", "lower", "upper"), strict=True):
            yield _gauge(name, documentation, ["agent"], {(agent,): getattr(r, field) for agent, r in rates.items()})


def _gauge(name: str, documentation: str, labels: list[str], values: Mapping[tuple[str, ...], float]) -> Metric:
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for label_values, value in values.items():
        family.add_metric(list(label_values), value)
    return family


_TRACE_ID = re.compile(r"[0-9a-f]{1,32}")
_SPAN_ID = re.compile(r"[0-9a-f]{1,16}")


def trace_exemplar(trace_id: str, span_id: str) -> dict[str, str] | None:
    """OpenMetrics exemplar labels pointing at the judged conversation's last turn span, exactly the ids the
    `evaluate {metric}` span gets as its parent (a short id left-padded with zeros, as OpenTelemetry does); None for
    ids that are not valid W3C ids (an adapter without them must not break the metric)."""
    trace_id, span_id = (trace_id or "").lower(), (span_id or "").lower()
    if not _TRACE_ID.fullmatch(trace_id) or not _SPAN_ID.fullmatch(span_id):
        return None
    trace_id, span_id = trace_id.zfill(32), span_id.zfill(16)
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return {"trace_id": trace_id, "span_id": span_id}


def family_total(registry: CollectorRegistry, family: str, suffix: str = "_total", **labels: str) -> float:
    """Sum of a metric family's samples ending in `suffix` whose labels include `labels` (e.g. all agents)."""
    return sum(
        sample.value
        for metric in registry.collect()
        if metric.name == family
        for sample in metric.samples
        if sample.name.endswith(suffix) and all(sample.labels.get(k) == v for k, v in labels.items())
    )


class ConsumerInstruments:
    """Every metric the consumer exports; call the `record_*` methods from any thread."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        max_agents: int = 200,
        window_sessions: int = 100,
        window_seconds: float = 900.0,
        calibration: HallucinationCalibration | None = None,
    ) -> None:
        self.registry = registry
        self.agent_label = AgentLabels(max_agents)
        self.windows = _Windows(window_sessions, window_seconds)
        registry.register(self.windows)
        if calibration is not None:
            registry.register(_CorrectedHallucinationRates(self.windows, calibration))
        self.verdicts = Counter(
            "tracejudge_verdicts_total", "Every verdict", ["agent", "metric", "verdict"], registry=registry
        )
        self.score = Histogram(
            "tracejudge_score", "Judge scores", ["agent", "metric"], buckets=SCORE_BUCKETS, registry=registry
        )
        self.failure_modes = Counter(  # the label values are each judge's taxonomy and `other`: bounded per judge
            "tracejudge_failure_modes",
            "Failing verdicts by what they are about: the failure mode the judge named in the same call",
            ["agent", "metric", "verdict", "mode"],
            registry=registry,
        )
        self.conversations = Counter(  # the pinned metric name says sessions; it counts conversations
            "tracejudge_sessions_total", "Conversations by outcome", ["agent", "outcome"], registry=registry
        )
        self.judge_errors = Counter(
            "tracejudge_judge_errors_total", "Failed judge calls by reason", ["metric", "reason"], registry=registry
        )
        self.judge_latency = Histogram(
            "tracejudge_judge_latency_seconds",
            "Judge call latency",
            ["metric"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.judge_cost = Counter(
            "tracejudge_judge_cost_usd_total",
            "Judge spend in USD, by purpose: live (production verdicts), canary, shadow",
            ["metric", "model", "purpose"],
            registry=registry,
        )
        self.judge_tokens = Counter(
            "tracejudge_judge_tokens_total",
            "Judge tokens: input (neither read from nor written to a cache), cached_input, cache_write, output",
            ["metric", "model", "direction"],
            registry=registry,
        )
        self.verdict_delay = Histogram(
            "tracejudge_verdict_delay_seconds",
            "From the conversation's completion (its record time) to its verdict delivered to every output",
            ["metric"],
            buckets=DELAY_BUCKETS,
            registry=registry,
        )
        self.tier_fallbacks = Counter(
            "tracejudge_judge_tier_fallbacks_total",
            "Flex judge calls the provider refused for capacity, made again at the standard tier (full price)",
            ["metric", "model"],
            registry=registry,
        )
        self.judge_batches = Counter(
            "tracejudge_judge_batches_total",
            "Batch-tier batches by event: submitted, resumed (polled again after a restart), resubmitted (expired or "
            "cancelled once), expired (again: its judgements fail), failed_items (a batch with failed lines)",
            ["event"],
            registry=registry,
        )
        self.sessions_open = Gauge("tracejudge_sessions_open", "Conversations being assembled", registry=registry)
        self.in_flight = Gauge("tracejudge_judgements_in_flight", "Judge calls under way", registry=registry)
        self.retrying = Gauge(
            "tracejudge_judgements_retrying",
            "Conversations whose judgement failed for a reason that can pass, waiting in the retry topic for their "
            "next attempt (this replica's retry-topic partitions)",
            registry=registry,
        )
        self.records = Counter("tracejudge_records_total", "Kafka records by outcome", ["outcome"], registry=registry)
        self.lag = Gauge(
            "tracejudge_consumer_lag",
            "Records behind the log end: high watermark minus the consumer's position",
            ["partition"],
            registry=registry,
        )
        self.output_errors = Counter(
            "tracejudge_output_errors_total",
            "Failed writes to an output (each retried; a result not written keeps its offset uncommitted)",
            ["output"],
            registry=registry,
        )
        self.submitted = Counter(
            "tracejudge_conversations_submitted_total",
            "Complete conversations sent to the judges (after sampling); each ends in verdicts, judge errors or a "
            "budget skip, so a rise without those means the judges have stalled",
            registry=registry,
        )
        self.feedback = Counter(
            "tracejudge_feedback_total", "Human feedback by polarity", ["agent", "feedback"], registry=registry
        )
        self.comparisons = Counter(
            "tracejudge_judge_human_comparisons_total",
            "Conversations with human feedback whose judge pass/fail was compared with it (agreement across "
            "replicas: 1 - disagreements / comparisons, summed)",
            ["agent", "metric"],
            registry=registry,
        )
        self.disagreements = Counter(
            "tracejudge_judge_human_disagreements_total",
            "Conversations where the judge's pass/fail and the human's feedback disagree",
            ["agent", "metric", "judge", "human"],
            registry=registry,
        )
        self.judge_info = Gauge(
            "tracejudge_judge_info",
            "1 for every judge this consumer runs: its model and rubric version (join on it; a change is a new judge)",
            ["metric", "model", "rubric_version"],
            registry=registry,
        )
        self.verdict_alert_share = Gauge(
            "tracejudge_verdict_alert_share",
            "A rubric label's alert_share: TracejudgeRubricVerdictShareHigh fires when this verdict's share of an "
            "agent's verdicts of the judge goes above it (only labels that set one)",
            ["metric", "verdict"],
            registry=registry,
        )
        self.mode_alert_share = Gauge(
            "tracejudge_failure_mode_alert_share",
            "A failure mode's alert_share (opt-in, in its taxonomy): TracejudgeFailureModeShareHigh fires when this "
            "mode's share of an agent's failing verdicts of the judge goes above it (only modes that set one)",
            ["metric", "mode"],
            registry=registry,
        )
        self.textless_spans = Counter(
            "tracejudge_textless_llm_spans_total",
            "Spans that look like a model call or an agent run but carry no text, by convention and outcome "
            "(counted_as_turn: their conversation fails empty_conversation unless other spans have text; "
            "no_conversation_id: no conversation to count them in)",
            ["convention", "outcome"],
            registry=registry,
        )
        for outcome in ("ok", "malformed"):
            self.records.labels(outcome=outcome)
        for output in ("results_topic", "dead_letter", "otlp", "sink", "notify"):
            self.output_errors.labels(output=output)
        self._seen_agents: set[str] = set()
        self._verdicts = dict(VERDICTS)  # each judge's verdict labels, pre-created per agent; record_judges adds files'
        self._modes: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}  # judge → (failing verdicts, modes)
        # (agent label, outcome) → its tracejudge_sessions_total series: counted once per conversation, and
        # `labels()` (a lock and a label check) costs more than the increment
        self._sessions: dict[tuple[str, str], Any] = {}
        self.canary = CanaryInstruments(registry)
        self.shadow = ShadowInstruments(registry, window_sessions=window_sessions, window_seconds=window_seconds)
        self.notifications = NotificationInstruments(registry)

    def _agent(self, agent: str) -> str:
        label = self.agent_label(agent)
        if label not in self._seen_agents:
            # Pre-create the agent's series at zero so rate() and increase() see the first verdict.
            self._seen_agents.add(label)
            for metric, verdicts in list(self._verdicts.items()):
                for verdict in verdicts:
                    self.verdicts.labels(agent=label, metric=metric, verdict=verdict)
            for metric, (failing, modes) in list(self._modes.items()):
                for verdict in failing:
                    for mode in modes:
                        self.failure_modes.labels(agent=label, metric=metric, verdict=verdict, mode=mode)
            for outcome in OUTCOMES:
                self.conversations.labels(agent=label, outcome=outcome)
            for polarity in ("positive", "negative"):
                self.feedback.labels(agent=label, feedback=polarity)
            for metric in VERDICTS:  # 0 until compared: the pooled agreement's ratio has both sides
                self.comparisons.labels(agent=label, metric=metric)
                for judge, human in (("pass", "fail"), ("fail", "pass")):
                    self.disagreements.labels(agent=label, metric=metric, judge=judge, human=human)
        return label

    def _sessions_of(self, agent: str, outcome: str) -> Any:
        series = self._sessions.get((agent, outcome))
        if series is None:  # two threads may both look it up: `labels()` gives both the same series
            series = self._sessions[(agent, outcome)] = self.conversations.labels(agent=agent, outcome=outcome)
        return series

    def record_judges(self, judges: Iterable[Any]) -> None:
        """tracejudge_judge_info = 1 for each judge (anything with `name`, `model_name` and `rubric_version`)."""
        for judge in judges:
            labels = {"metric": judge.name, "model": judge.model_name, "rubric_version": judge.rubric_version}
            self.judge_info.labels(**labels).set(1)
            rubric = getattr(judge, "rubric", None)  # a judge from a rubric file; others have no thresholds
            for verdict, share in (getattr(rubric, "alert_shares", None) or {}).items():
                self.verdict_alert_share.labels(metric=judge.name, verdict=verdict).set(share)
            weights = getattr(judge, "weights", None)
            if isinstance(weights, dict) and judge.name not in self._verdicts:  # a rubric file's judge
                self._verdicts[judge.name] = tuple(weights)
            modes = tuple(getattr(judge, "failure_modes", ()) or ())
            if modes:
                self._modes[judge.name] = (tuple(getattr(judge, "failing_verdicts", ())), modes)
                for mode, share in (getattr(judge, "mode_alert_shares", None) or {}).items():
                    if mode in modes:
                        self.mode_alert_share.labels(metric=judge.name, mode=mode).set(share)
            self.tier_fallbacks.labels(metric=judge.name, model=judge.model_name)  # 0 until one: rate() is 0, not empty

    def record_judgement(self, judgement: Judgement) -> None:
        agent = self._agent(judgement.job.agent)
        if judgement.outcome != OUTCOME_RETRYING:  # a conversation counts once, at its final outcome
            self._sessions_of(agent, judgement.outcome).inc()
        for result in judgement.results:  # every attempt's calls: their errors, latency and spend
            self.judge_latency.labels(metric=result.name).observe(result.latency_s)
            if result.cost_usd:
                self.judge_cost.labels(metric=result.name, model=result.model, purpose=PURPOSE_LIVE).inc(
                    result.cost_usd
                )
            self._record_tokens(result)
            if result.tier_fallbacks:
                self.tier_fallbacks.labels(metric=result.name, model=result.model).inc(result.tier_fallbacks)
            if result.error is not None or result.score is None or result.verdict is None:
                self.judge_errors.labels(metric=result.name, reason=result.error_kind or "unknown").inc()
                continue
            if judgement.outcome == OUTCOME_RETRYING:  # the retry judges it again: counted then, once
                continue
            exemplar = trace_exemplar(judgement.job.last_exchange.trace_id, judgement.job.last_exchange.span_id)
            self.verdicts.labels(agent=agent, metric=result.name, verdict=result.verdict).inc(exemplar=exemplar)
            self.score.labels(agent=agent, metric=result.name).observe(result.score, exemplar=exemplar)
            if result.failure_mode is not None:
                self.failure_modes.labels(
                    agent=agent, metric=result.name, verdict=result.verdict, mode=result.failure_mode
                ).inc(exemplar=exemplar)
            self.windows.add(result.name, agent, result.score, result.verdict)
        if judgement.shadow_results:
            self.record_side_cost(judgement.shadow_results, PURPOSE_SHADOW)
            self.shadow.record(agent, judgement.results, judgement.shadow_results)

    def record_side_cost(self, results: Iterable[MetricResult], purpose: str) -> None:
        """Spend of calls that make no production verdict (canary, shadow): counted apart by `purpose`."""
        for result in results:
            if result.cost_usd:
                self.judge_cost.labels(metric=result.name, model=result.model, purpose=purpose).inc(result.cost_usd)

    def _record_tokens(self, result: MetricResult) -> None:
        """`input_tokens` holds every prompt token; cache reads and cache writes are parts of it, each counted once."""
        cached = result.cached_input_tokens or 0
        written = result.cache_write_input_tokens or 0
        counts = {
            "input": max(0, (result.input_tokens or 0) - cached - written),
            "cached_input": cached,
            "cache_write": written,
            "output": result.output_tokens or 0,
        }
        for direction, count in counts.items():
            if count:
                self.judge_tokens.labels(metric=result.name, model=result.model, direction=direction).inc(count)

    def record_batch_event(self, event: str) -> None:
        self.judge_batches.labels(event=event).inc()

    def record_verdict_delay(self, judgement: Judgement, now: float | None = None) -> None:
        """A judged conversation's verdicts are delivered: how long after the conversation completed."""
        completed_ms = judgement.job.completed_ms
        if completed_ms is None or judgement.outcome in (OUTCOME_SAMPLED_OUT, OUTCOME_RETRYING):
            return
        delay = max(0.0, (time.time() if now is None else now) - completed_ms / 1000.0)
        for result in judgement.results:
            self.verdict_delay.labels(metric=result.name).observe(delay)

    def record_feedback(self, agent: str, *, negative: bool) -> None:
        label = self._agent(agent)
        self.feedback.labels(agent=label, feedback="negative" if negative else "positive").inc()

    def record_agreement(self, agreement: Agreement) -> None:
        agent = self._agent(agreement.agent)
        self.windows.add_agreement(agent, agreement.metric, agreement.agrees)
        self.comparisons.labels(agent=agent, metric=agreement.metric).inc()
        if not agreement.agrees:
            self.disagreements.labels(
                agent=agent,
                metric=agreement.metric,
                judge="pass" if agreement.judge_passed else "fail",
                human="pass" if agreement.human_positive else "fail",
            ).inc()

    def record_records(self, outcome: str, count: int = 1) -> None:
        self.records.labels(outcome=outcome).inc(count)

    def record_textless_span(self, convention: str, outcome: str) -> None:
        self.textless_spans.labels(convention=convention, outcome=outcome).inc()

    def record_submitted(self) -> None:
        self.submitted.inc()

    def record_output_error(self, output: str) -> None:
        self.output_errors.labels(output=output).inc()

    def set_lag(self, partition: int, behind: int) -> None:
        self.lag.labels(partition=str(partition)).set(max(0, behind))

    def forget_partitions(self, partitions: set[int]) -> None:
        """Revoked partitions: their lag series go (another consumer reports them now)."""
        for partition in partitions:
            try:
                self.lag.remove(str(partition))
            except KeyError:
                pass
