"""The shadow judge through the real consumer, and `tracejudge compare` (the real CLI) reading what it wrote.

A shadow model that disagrees on a known share of the conversations: the agreement gauge says that share, the
primary's gauges do not move, the results topic holds both sides (the shadow's marked), and compare finds exactly
the conversations that flipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.judge_server import JudgeServer, Reply, conversation_text
from tests.support.pipeline import ROOT, RunningConsumer, consumer_settings, play, result_records, traced_app, wait_for
from tracejudge.consumer.cli import main
from tracejudge.consumer.cli.compare import pair_up
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.judging.pool import JudgePool
from tracejudge.metrics import FailureRateMetric

PRIMARY, SHADOW = "gpt-4o-mini", "gpt-4.1-mini"


def two_models(request: dict[str, Any]) -> Reply:
    """The primary says honest_fallback; the shadow says hallucination wherever the conversation says DISAGREE."""
    shadow = request.get("model") == SHADOW and "DISAGREE" in conversation_text(request)
    label = "hallucination" if shadow else "honest_fallback"
    return Reply(content=json.dumps({"verdict": label, "evidence": [], "reason": "scripted"}))


def test_shadow_agreement_and_compare_report_the_same_flips(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.responder = two_models
    results = f"{topic}-results"
    broker.create_topic(results, 1)
    conversations = {
        f"shadow-{i}": [(f"question {i}", f"answer {i} DISAGREE" if i % 4 == 0 else f"answer {i}")] for i in range(20)
    }
    flipped = sorted(cid for cid, turns in conversations.items() if "DISAGREE" in turns[0][1])
    settings = consumer_settings(
        broker.bootstrap_servers,
        topic,
        metrics="failure_rate",
        results_topic=results,
        shadow_judge_model=SHADOW,
        shadow_sample_rate=1.0,
    )
    started = datetime.now(UTC).isoformat()
    provider = traced_app(broker.bootstrap_servers, topic)
    with RunningConsumer(settings) as consumer:
        play(provider, conversations)
        wait_for(lambda: consumer.sessions("judged") == 20, what="20 judged conversations")
        labels = {"metric": "failure_rate", "model": PRIMARY, "shadow_model": SHADOW}
        wait_for(lambda: consumer.value("tracejudge_shadow_agreement", **labels) > 0, what="the agreement gauge")
        agreement = consumer.value("tracejudge_shadow_agreement", **labels)
        assert abs(agreement - 0.75) <= 0.02, agreement
        assert (
            consumer.value(
                "tracejudge_shadow_disagreements_total", metric="failure_rate", primary="honest_fallback",
                shadow="hallucination",
            )
            == len(flipped)
        )  # fmt: skip
        # The primary's verdicts, rates and counts are the primary's alone.
        assert consumer.value("tracejudge_hallucination_rate", agent="support") == 0.0
        assert consumer.value("tracejudge_shadow_hallucination_rate", agent="support", shadow_model=SHADOW) == 0.25
        assert (
            consumer.value("tracejudge_verdicts_total", agent="support", metric="failure_rate", verdict="hallucination")
            == 0
        )
        assert (
            consumer.value(
                "tracejudge_verdicts_total", agent="support", metric="failure_rate", verdict="honest_fallback"
            )
            == 20
        )
        cost = {
            purpose: consumer.value(
                "tracejudge_judge_cost_usd_total", metric="failure_rate", model=model, purpose=purpose
            )
            for purpose, model in (("live", PRIMARY), ("shadow", SHADOW))
        }
        assert cost["live"] > 0 and cost["shadow"] > 0, cost
        records = result_records(broker, results, expected=40)
    provider.shutdown()
    ended = datetime.now(UTC).isoformat()
    assert len(records) == 40
    shadows = [r for r in records if r["shadow"]]
    assert len(shadows) == 20 and {r["model"] for r in shadows} == {SHADOW}
    assert len({r["result_id"] for r in records}) == 40  # the shadow's results have their own ids

    output = tmp_path / "compare.json"
    command = [
        sys.executable, "-m", "tracejudge.consumer", "compare", "--bootstrap-servers", broker.bootstrap_servers,
        "--results-topic", results, "--from", started, "--to", ended, "--output", str(output),
    ]  # fmt: skip
    completed = subprocess.run(
        [*command, "--min-agreement", "0.9"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "below --min-agreement" in completed.stdout
    report = json.loads(output.read_text())["metrics"]["failure_rate"]
    assert report["pairs"] == 20 and report["agreement"] == pytest.approx(agreement, abs=1e-9)
    assert sorted(f["conversation_id"] for f in report["flipped"]) == flipped
    assert all(f["trace_id"] and (f["a"], f["b"]) == ("honest_fallback", "hallucination") for f in report["flipped"])
    assert report["confusion_matrix"][report["labels"].index("honest_fallback")][0] == len(flipped)
    rates = report["hallucination_rate"]
    assert rates["a"]["rate"] == 0.0 and rates["b"]["rate"] == 0.25
    assert rates["b"]["lower"] < 0.25 < rates["b"]["upper"]
    passed = subprocess.run([*command, "--min-agreement", "0.7"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    by_model = pair_up(records, by="model", a=PRIMARY, b=SHADOW)  # the same pairs, told apart by model
    assert len(by_model["failure_rate"]) == 20


def test_compare_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [
        (["--results-topic", "r", "--from", "yesterday", "--to", "2026-12-02"], "invalid time"),
        (["--results-topic", "r", "--from", "2026-12-02", "--to", "2026-12-01"], "must be before"),
        (["--results-topic", "r", "--from", "2026-12-01", "--to", "2026-12-02", "--by", "model"], "--a and --b"),
    ]
    for args, needle in cases:
        assert main(["compare", *args]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, err
    # Without --results-topic it reads `<group>-results`; only TRACEJUDGE_NO_RESULTS leaves it nothing to read.
    monkeypatch.setenv("TRACEJUDGE_NO_RESULTS", "true")
    assert main(["compare", "--from", "2026-12-01", "--to", "2026-12-02"]) == 2
    err = capsys.readouterr().err
    assert "TRACEJUDGE_NO_RESULTS is set" in err and len(err.strip().splitlines()) == 1, err


def test_shadow_has_its_own_budget_share(judge_server: JudgeServer) -> None:
    """Once the shadow's share is spent, its calls are refused (counted as errors) while the primary goes on."""
    judge_server.responder = two_models
    done: list = []
    pool = JudgePool(
        [FailureRateMetric(PRIMARY)],
        done.append,
        max_cost_per_hour=1.0,
        shadow_judges=[FailureRateMetric(SHADOW)],
        shadow_sample_rate=1.0,
        shadow_budget_share=1e-4,  # the shadow's share (1e-4 USD) pays for its first call only
    ).start()
    assert pool.shadow_budget.max_per_hour == pytest.approx(1e-4) and pool.budget.max_per_hour == pytest.approx(
        1 - 1e-4
    )
    from tests.consumer.test_outputs import job

    try:
        for i in range(4):
            pool.submit(job(f"budget-{i}"))
            deadline = time.monotonic() + 30
            while len(done) <= i and time.monotonic() < deadline:
                time.sleep(0.02)
    finally:
        pool.stop(5)
    assert [j.outcome for j in done] == ["judged"] * 4
    shadow = [j.shadow_results[0] for j in done]
    assert shadow[0].error is None and shadow[0].cost_usd
    assert [r.error_kind for r in shadow[1:]] == ["budget"] * 3
    assert 0 < pool.shadow_budget.spent() <= 1e-4 + shadow[0].cost_usd


def test_compare_pairs_a_rubric_file_judges_verdicts_with_its_labels_and_unweighted_kappa(tmp_path: Path) -> None:
    """`compare --judge-file F`: a file judge's verdicts pair up with its own labels (file order), kappa unweighted;
    without its file they are not paired (their labels unknown)."""
    from tracejudge.consumer.cli.compare import compare_metric
    from tracejudge.consumer.judging.gold import labels_with

    rubric = tmp_path / "refund_policy.yaml"
    rubric.write_text(
        "name: refund_policy\nversion: 1\ninstructions: Refunds by the policy?\nlabels:\n"
        "  - {name: compliant, weight: 1.0}\n  - {name: minor_deviation, weight: 0.5}\n"
        "  - {name: violation, weight: 0.0}\n",
        encoding="utf-8",
    )
    # (primary, shadow) per conversation: 3 agree compliant, 1 agree violation, 1 compliant → violation.
    script = [("compliant", "compliant")] * 3 + [("violation", "violation"), ("compliant", "violation")]
    records = [
        {
            "result_id": f"{n}-{shadow}", "conversation_id": f"c{n}", "content_id": f"c{n}-1", "agent": "refunds",
            "metric": "refund_policy", "verdict": pair[shadow], "model": "m", "rubric_version": "refund_policy@1",
            "shadow": bool(shadow), "error": None, "trace_id": f"t{n}", "judged_at": "2026-12-01T00:00:00+00:00",
        }
        for n, pair in enumerate(script)
        for shadow in (0, 1)
    ]  # fmt: skip
    assert pair_up(records) == {}
    labels = labels_with([str(rubric)])
    pairs = pair_up(records, labels=labels, metrics=["refund_policy"])
    assert len(pairs["refund_policy"]) == 5
    report = compare_metric("refund_policy", pairs["refund_policy"], labels["refund_policy"])
    assert report["labels"] == ["compliant", "minor_deviation", "violation"]
    assert report["confusion_matrix"] == [[3, 0, 1], [0, 0, 0], [0, 0, 1]]
    assert report["agreement"] == pytest.approx(4 / 5) and report["kappa_weighting"] == "unweighted"
    # p_o 0.8; rows 4, 0, 1 × columns 3, 0, 2 / 25: p_e = 14/25 = 0.56; kappa = 0.24 / 0.44.
    assert report["kappa"] == pytest.approx(0.24 / 0.44)
    assert [f["conversation_id"] for f in report["flipped"]] == ["c4"]
