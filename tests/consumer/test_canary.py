"""The canary through the real consumer: Tansu, the judge worker, LiteLLM over HTTP to the scripted judge server.

The server answers each canary conversation with its gold label until a "silent snapshot change" makes it answer
`hallucination` for every `stall` conversation: flips are counted, accuracy drops, and TracejudgeCanaryRegressed
fires in promtool on exactly the series the consumer exported. Three replicas run one canary per interval.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require_binary
from tests.support.judge_server import JudgeServer, Reply, conversation_text
from tests.support.pipeline import RunningConsumer, consumer_settings, read_all, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit.prometheus import family_total
from tracejudge.consumer.judging.canary import PER_LABEL, default_items, load_canary_items
from tracejudge.consumer.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CANARY_FAMILIES = ("tracejudge_canary_accuracy", "tracejudge_canary_accuracy_floor", "tracejudge_canary_flips_total")


class GoldJudge:
    """Answers a canary conversation with its gold Failure Rate label; `changed` labels answer otherwise."""

    def __init__(self) -> None:
        self.items = load_canary_items(None)
        self.changed: dict[str, str] = {}
        self.lock = threading.Lock()

    def label_of(self, text: str) -> str:
        for item in self.items:
            if item.turns[-1][1] in text and item.turns[0][0] in text:
                return item.labels["failure_rate"]
        return "not_applicable"

    def __call__(self, request: dict[str, Any]) -> Reply:
        label = self.label_of(conversation_text(request))
        with self.lock:
            label = self.changed.get(label, label)
        return Reply(content=json.dumps({"verdict": label, "evidence": [], "reason": "scripted"}))


def canary_settings(broker: EmbeddedBroker, topic: str, **overrides: Any) -> Settings:
    options: dict[str, Any] = {
        "metrics": "failure_rate",
        "redact": False,  # the scripted judge finds each gold conversation by its text
        "canary_interval": "2s",
        "canary_accuracy_floor": 0.95,
        "canary_margin": 0.05,
        "max_concurrency": 24,
        **overrides,
    }
    return consumer_settings(broker.bootstrap_servers, topic, **options)


def canary_samples(consumer: RunningConsumer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in consumer.app.registry.collect()
        for sample in family.samples
        if sample.name in CANARY_FAMILIES
    }


def test_default_canary_set_is_a_fixed_balanced_subset_of_the_gold_set() -> None:
    items = load_canary_items(None)
    assert len(items) == 24
    labels = [item.labels["failure_rate"] for item in items]
    assert {labels.count(label) for label in set(labels)} == {PER_LABEL} and len(set(labels)) == 6
    assert [i.id for i in default_items(list(reversed(items)))] == [i.id for i in items]  # order-independent


def test_canary_counts_flips_and_fires_the_alert_from_its_exported_series(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    promtool = require_binary("promtool")
    gold = GoldJudge()
    judge_server.responder = gold
    results = f"{topic}-results"
    broker.create_topic(results, 1)
    snapshots: list[dict] = []
    with RunningConsumer(canary_settings(broker, topic, results_topic=results)) as consumer:
        canary = consumer.app.service.canary
        assert canary is not None

        def runs(n: int) -> bool:
            if len(canary.runs) > len(snapshots):
                snapshots.append(canary_samples(consumer))
            return len(snapshots) >= n

        worker = consumer.app.service.judge_worker
        assert worker is not None
        wait_for(lambda: 0 in worker.assigned, timeout=60, what="judge-queue partition 0 assigned")
        wait_for(lambda: runs(2), timeout=30, what="two canary runs")
        steady = canary.runs[-1].figures
        ((metric, model, rubric), figures) = next(iter(steady.items()))
        assert metric == "failure_rate" and figures["accuracy"] == 1.0 and figures["flips"] == 0
        with gold.lock:
            gold.changed = {"stall": "hallucination"}  # the provider silently rerouted the model name
        wait_for(lambda: runs(4), timeout=30, what="two canary runs after the change")
        labels = {"metric": metric, "model": model, "rubric_version": rubric}
        assert consumer.value("tracejudge_canary_flips_total", **labels) == PER_LABEL
        assert consumer.value("tracejudge_canary_accuracy", **labels) == 20 / 24
        assert consumer.value("tracejudge_canary_kappa", **labels) < 0.9
        assert consumer.value("tracejudge_canary_last_run_timestamp_seconds", **labels) > 0
        assert canary.runs[-2].figures[(metric, model, rubric)]["flips"] == PER_LABEL  # the run after the change
        assert canary.runs[-1].figures[(metric, model, rubric)]["flips"] == 0  # unchanged since
        # Counted against the budget and reported apart; never a production verdict, gauge or result.
        assert consumer.value("tracejudge_judge_cost_usd_total", metric=metric, model=model, purpose="canary") > 0
        assert consumer.value("tracejudge_judge_cost_usd_total", metric=metric, model=model, purpose="live") == 0
        assert consumer.app.service.pool.budget.spent() > 0
        assert family_total(consumer.app.registry, "tracejudge_verdicts") == 0
        assert family_total(consumer.app.registry, "tracejudge_sessions") == 0
        assert consumer.app.registry.get_sample_value("tracejudge_hallucination_rate", {"agent": "support"}) is None
    assert read_all(broker.bootstrap_servers, results, timeout_s=10) == []
    assert len(judge_server.requests) >= 4 * 24

    # promtool: one exported snapshot per canary run, each held for a 10-minute interval.
    step_minutes = 10
    keys = sorted({key for snapshot in snapshots for key in snapshot})
    series = {
        name + "{" + ",".join(f'{k}="{v}"' for k, v in label_items) + "}": [
            value for snapshot in snapshots for value in [snapshot.get((name, label_items))] * step_minutes
        ]
        for name, label_items in keys
    }
    assert f'tracejudge_canary_accuracy_floor{{metric="{metric}"}}' in series
    before, after = 2 * step_minutes - 1, 4 * step_minutes - 1  # the last minute of run 2 (steady) and of run 4
    alert = {
        "severity": "ticket",
        "metric": metric,
        "model": model,
        "rubric_version": rubric,
    }
    annotations = {
        "summary": f"The {metric} judge changed on the canary set",
        "description": (
            f"The {metric} judge ({model}, rubric {rubric}) judged the canary set below its accuracy floor or "
            "flipped verdicts on unchanged inputs: the provider may have changed the model behind its name."
        ),
        "runbook_url": "docs/runbook.md#tracejudgecanaryregressed",
    }
    test = {
        "rule_files": [str(ROOT / "deploy" / "prometheus" / "alerts.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": selector, "values": " ".join("_" if v is None else repr(v) for v in values)}
                    for selector, values in series.items()
                ],
                "alert_rule_test": [
                    {"eval_time": f"{before}m", "alertname": "TracejudgeCanaryRegressed", "exp_alerts": []},
                    {
                        "eval_time": f"{after}m",
                        "alertname": "TracejudgeCanaryRegressed",
                        "exp_alerts": [{"exp_labels": alert, "exp_annotations": annotations}],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "canary_test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    completed = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stdout + completed.stderr + path.read_text()


def test_three_replicas_run_one_canary_per_interval(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    judge_server.responder = GoldJudge()
    group = f"tj-canary-{topic}"
    settings = canary_settings(broker, topic, group_id=group, canary_interval="2.5s", canary_dataset=None)
    replicas = [RunningConsumer(settings) for _ in range(3)]
    try:
        for replica in replicas:
            replica.__enter__()

        def canaries() -> list:
            return [r.app.service.canary for r in replicas]

        def owners() -> list[int]:
            workers = [r.app.service.judge_worker for r in replicas]
            return [i for i, w in enumerate(workers) if w is not None and 0 in w.assigned]

        def spread() -> bool:
            workers = [r.app.service.judge_worker for r in replicas]
            return all(w is not None and len(w.assigned) == 1 for w in workers)

        wait_for(spread, timeout=60, what="one judge-queue partition per replica")
        owner = owners()
        assert len(owner) == 1
        before = [len(c.runs) for c in canaries()]
        # The first run pays LiteLLM's warm-up (a run longer than the interval skips the slots it overlaps).
        wait_for(lambda: len(canaries()[owner[0]].runs) >= before[owner[0]] + 4, timeout=40, what="4 canary runs")
        assert owners() == owner  # no rebalance meanwhile
        made = [len(c.runs) - b for c, b in zip(canaries(), before, strict=True)]
        assert made[owner[0]] >= 4 and sum(made) == made[owner[0]], made  # only the owner of partition 0 ran
        slots = [run.slot for c in canaries() for run in c.runs]
        assert len(slots) == len(set(slots)), f"a slot ran twice: {sorted(slots)}"
        recent = sorted(run.slot for run in canaries()[owner[0]].runs)[-3:]
        detail = [(r.slot, round(r.finished_at - r.slot * 2.5, 2)) for c in canaries() for r in c.runs]
        assert recent == list(range(recent[0], recent[0] + 3)), f"an interval was skipped: {recent} {detail} {before}"
        assert sum(r.value("tracejudge_canary_runs_total") for r in replicas) == len(slots)
    finally:
        for replica in replicas:
            replica.stop()


def test_canary_respects_the_budget_and_takes_its_floor_from_the_calibration_report(
    judge_server: JudgeServer, tmp_path: Path
) -> None:
    """Canary calls pass the pool's budget like live calls: past it they are refused and counted, never judged."""
    from prometheus_client import CollectorRegistry

    from tracejudge.consumer.emit.prometheus import ConsumerInstruments
    from tracejudge.consumer.judging.canary import Canary, calibration_accuracies
    from tracejudge.consumer.judging.pool import JudgePool
    from tracejudge.metrics import FailureRateMetric

    judge_server.responder = GoldJudge()
    report = tmp_path / "calibration.json"
    report.write_text(json.dumps({"metrics": {"failure_rate": {"accuracy": 0.9}}}))
    registry = CollectorRegistry()
    prometheus = ConsumerInstruments(registry)
    judge = FailureRateMetric("gpt-4o-mini", redactor=None)
    pool = JudgePool([judge], lambda _j: None, max_concurrency=1, max_cost_per_hour=1e-6).start()
    try:
        canary = Canary(
            3600, load_canary_items(None), [judge], pool, prometheus, lambda: True,
            floors=calibration_accuracies(str(report)), margin=0.1,
        )  # fmt: skip
        run = canary.run()
    finally:
        pool.stop(5)
    figures = run.figures[("failure_rate", judge.model_name, judge.rubric_version)]
    assert figures["n"] == 1  # the first call is admitted before any cost is known; its cost spends the budget
    assert (
        registry.get_sample_value("tracejudge_canary_errors_total", {"metric": "failure_rate", "reason": "budget"})
        == 23
    )
    assert len(judge_server.requests) == 1
    floor = registry.get_sample_value("tracejudge_canary_accuracy_floor", {"metric": "failure_rate"})
    assert floor == pytest.approx(0.8)
    assert pool.budget.spent() > 1e-6


def test_bad_canary_and_shadow_options_are_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from tracejudge.consumer.cli import main

    cases = [
        (["--canary-interval", "1h", "--canary-dataset", "/nonexistent.jsonl"], "--canary-dataset", "cannot read"),
        (["--canary-interval", "soon"], "--canary-interval", "not a duration"),
        (["--shadow-sample-rate", "2"], "--shadow-sample-rate", "within 0..1"),
    ]
    for args, flag, why in cases:
        try:
            code = main(["consume", "--no-judge-check", *args])
        except SystemExit as exc:  # invalid settings exit from the parser, as for every flag
            code = exc.code
        assert code == 2
        err = capsys.readouterr().err
        assert f"invalid configuration: {flag}" in err and why in err and len(err.strip().splitlines()) == 1, err
    assert Settings.from_options(canary_interval="1h30m").canary_interval == 5400.0
    assert Settings.from_options(canary_interval="5s").canary_interval == 5.0
    assert Settings.from_options().canary_interval is None  # off by default


def test_a_user_canary_set_and_a_replica_that_stops_owning_the_canary(
    judge_server: JudgeServer, tmp_path: Path
) -> None:
    """--canary-dataset in the calibrate format; when partition 0 moves away the old owner's gauges go (the new owner
    reports), its counters stay."""
    from prometheus_client import CollectorRegistry

    from tracejudge.consumer.emit.prometheus import ConsumerInstruments
    from tracejudge.consumer.judging.canary import Canary
    from tracejudge.consumer.judging.pool import JudgePool
    from tracejudge.metrics import FailureRateMetric

    gold = GoldJudge()
    mine = gold.items[:2]
    dataset = tmp_path / "canary.jsonl"
    dataset.write_text(
        "\n".join(
            json.dumps({"id": i.id, "turns": [{"user": u, "assistant": a} for u, a in i.turns], "labels": i.labels})
            for i in mine
        )
    )
    items = load_canary_items(str(dataset))
    assert [i.id for i in items] == [i.id for i in mine]
    judge_server.responder = gold
    registry = CollectorRegistry()
    judge = FailureRateMetric("gpt-4o-mini", redactor=None)
    pool = JudgePool([judge], lambda _j: None).start()
    owner = threading.Event()
    owner.set()
    canary = Canary(0.5, items, [judge], pool, ConsumerInstruments(registry), owner.is_set).start()
    labels = {"metric": "failure_rate", "model": judge.model_name, "rubric_version": judge.rubric_version}
    try:
        wait_for(lambda: len(canary.runs) >= 2, timeout=20, what="two runs")
        assert registry.get_sample_value("tracejudge_canary_accuracy", labels) == 1.0
        owner.clear()
        wait_for(
            lambda: registry.get_sample_value("tracejudge_canary_accuracy", labels) is None, timeout=5, what="forgotten"
        )
        runs = len(canary.runs)
        assert registry.get_sample_value("tracejudge_canary_last_run_timestamp_seconds", labels) is None
        assert registry.get_sample_value("tracejudge_canary_flips_total", labels) == 0
        assert registry.get_sample_value("tracejudge_canary_runs_total", {}) == runs
    finally:
        canary.stop()
        pool.stop(5)
    assert len(judge_server.requests) == 2 * runs


def test_a_rubric_file_judge_runs_in_the_canary_on_items_labelled_for_it(
    judge_server: JudgeServer, tmp_path: Path
) -> None:
    """A canary set labelled for a rubric file's judge: loaded with its file, judged with the file's own labels
    (kappa unweighted); the set without the file is one line naming the unknown judge."""
    from prometheus_client import CollectorRegistry

    from tracejudge.consumer.emit.prometheus import ConsumerInstruments
    from tracejudge.consumer.judging.canary import Canary, DatasetError
    from tracejudge.consumer.judging.pool import JudgePool
    from tracejudge.metrics import RubricMetric

    rubric = tmp_path / "refund_policy.yaml"
    rubric.write_text(
        "name: refund_policy\nversion: 1\ninstructions: Refunds by the policy?\nlabels:\n"
        "  - {name: compliant, weight: 1.0}\n  - {name: minor_deviation, weight: 0.5}\n"
        "  - {name: violation, weight: 0.0}\n",
        encoding="utf-8",
    )
    # gold → the judge's answer: 3 of 4 right.
    script = {"r0": ("compliant", "compliant"), "r1": ("violation", "violation"), "r2": ("violation", "compliant")}
    script["r3"] = ("minor_deviation", "minor_deviation")
    dataset = tmp_path / "canary.jsonl"
    dataset.write_text(
        "".join(
            json.dumps(
                {
                    "id": key,
                    "turns": [{"user": f"[{key}] refund?", "assistant": "ok"}],
                    "labels": {"refund_policy": gold},
                }
            )
            + "\n"
            for key, (gold, _) in script.items()
        ),
        encoding="utf-8",
    )
    with pytest.raises(DatasetError, match="unknown metric 'refund_policy'"):
        load_canary_items(str(dataset))
    items = load_canary_items(str(dataset), [str(rubric)])

    def respond(request: dict[str, Any]) -> Reply:
        key = next(k for k in script if f"[{k}]" in conversation_text(request))
        return Reply(content=json.dumps({"verdict": script[key][1], "evidence": [], "reason": "scripted"}))

    judge_server.responder = respond
    judge = RubricMetric.from_file(rubric, "gpt-4o-mini", redactor=None)
    registry = CollectorRegistry()
    pool = JudgePool([judge], lambda _j: None, max_concurrency=2).start()
    try:
        run = Canary(3600, items, [judge], pool, ConsumerInstruments(registry), lambda: True).run()
    finally:
        pool.stop(5)
    figures = run.figures[("refund_policy", judge.model_name, judge.rubric_version)]
    assert (figures["n"], figures["failed"]) == (4, 0)
    assert figures["accuracy"] == pytest.approx(3 / 4)
    # rows 1, 1, 2 × columns 2, 1, 1 over 16: p_e = 5/16; kappa = (0.75 − 0.3125) / 0.6875.
    assert figures["kappa"] == pytest.approx(0.4375 / 0.6875)
    assert len(judge_server.requests) == 4
