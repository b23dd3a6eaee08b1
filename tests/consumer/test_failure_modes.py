"""Failure modes counted live, through a real `tracejudge consume` process and a judge server scripted per conversation.

40 conversations, judged by the built-in Failure Rate judge with a taxonomy given by `--failure-modes FILE` and by a
rubric file's judge with `failure_modes:` inside the file. 13 hallucinations: 12 name one of three modes (5, 4, 3) and
one names a mode outside the taxonomy (the shipped default's `invented_facts`, which the file replaced); the rest are
verdicts that are not failing, one of them naming a mode anyway. The counter has exactly 5/4/3 and 1 `other`, no label
value outside the taxonomy appears anywhere on /metrics, the results topic agrees record by record, and so do
`explain` and `export --mode`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.judge_server import JudgeServer, Reply, conversation_text, metric_of
from tests.support.pipeline import ROOT, play, result_records, scrape_logged, traced_app, wait_for
from tracejudge.consumer.cli import main
from tracejudge.consumer.embedded_broker import EmbeddedBroker

COUNT = 40
FAILURE_RATE_MODES = ("invented_refund_rules", "wrong_order_dates", "made_up_urls")
OUTSIDE = "invented_facts"  # in failure_rate's shipped taxonomy, not in the file that replaces it
# conversation index → (verdict, what the judge answers as failure_mode, the mode it counts under)
FAILURE_RATE: dict[int, tuple[str, str | None, str | None]] = {
    **{i: ("hallucination", "invented_refund_rules", "invented_refund_rules") for i in (0, 3, 6, 9, 12)},
    **{i: ("hallucination", "wrong_order_dates", "wrong_order_dates") for i in (15, 18, 21, 24)},
    **{i: ("hallucination", "made_up_urls", "made_up_urls") for i in (27, 30, 33)},
    36: ("hallucination", OUTSIDE, "other"),
    37: ("stall", "made_up_urls", None),  # not failing: never counted under a mode, whatever the answer says
}
RUBRIC_MODES = ("wrong_amount", "wrong_deadline")
REFUNDS: dict[int, tuple[str, str | None, str | None]] = {
    **{i: ("wrong_refund", "wrong_amount", "wrong_amount") for i in (1, 4, 7)},
    **{i: ("wrong_refund", "wrong_deadline", "wrong_deadline") for i in (10, 13)},
    16: ("wrong_refund", None, "other"),  # a failing verdict without a mode still counts
}
NOT_FAILING = {
    "failure_rate": ("honest_fallback", "not_applicable", "alternative_proposed"),
    "refunds": ("correct_refund", "no_refund_topic"),
}
ALLOWED = {"failure_rate": (*FAILURE_RATE_MODES, "other"), "refunds": (*RUBRIC_MODES, "other")}


def scripted(metric: str, index: int) -> tuple[str, str | None, str | None]:
    script = FAILURE_RATE if metric == "failure_rate" else REFUNDS
    return script.get(index, (NOT_FAILING[metric][index % len(NOT_FAILING[metric])], None, None))


def expected(metric: str, mode: str) -> set[str]:
    return {f"conv-{i:02d}" for i in range(COUNT) if scripted(metric, i)[2] == mode}


def conversations() -> dict[str, list[tuple[str, str]]]:
    return {
        f"conv-{i:02d}": [
            (f"conv-{i:02d}: where is order {i}?", f"Order {i} ships tomorrow."),
            (f"conv-{i:02d}: and the refund?", "Refunds within 120 days, see refunds.example.com/policy."),
        ]
        for i in range(COUNT)
    }


def respond(request: dict[str, Any]) -> Reply:
    match = re.search(r"conv-(\d\d)", conversation_text(request))
    assert match, "a judge request without a conversation id"
    metric = metric_of(request)
    verdict, mode, _ = scripted(metric, int(match.group(1)))
    evidence = "evidence" if metric == "failure_rate" else "quotes"
    answer = {"verdict": verdict, evidence: ["120 days"], "reason": f"scripted {verdict}", "failure_mode": mode}
    return Reply(content=json.dumps(answer))


def write_files(tmp_path: Path) -> tuple[Path, Path]:
    taxonomy = tmp_path / "modes.yaml"
    taxonomy.write_text(
        yaml.safe_dump({"failure_rate": [{"name": n, "description": f"the agent's {n}"} for n in FAILURE_RATE_MODES]})
    )
    rubric = tmp_path / "refunds.yaml"
    rubric.write_text(
        yaml.safe_dump(
            {
                "name": "refunds",
                "instructions": "Did the agent state the refund rules as the policy gives them?",
                "labels": [
                    {"name": "wrong_refund", "weight": 0.0, "description": "misstated the refund rules"},
                    {"name": "correct_refund", "weight": 1.0},
                    {"name": "no_refund_topic", "weight": 1.0},
                ],
                "evidence_key": "quotes",
                "failure_modes": [
                    {"name": "wrong_amount", "description": "a refund amount or fee the policy does not give"},
                    {"name": "wrong_deadline", "description": "a refund deadline the policy does not give"},
                ],
            }
        )
    )
    return taxonomy, rubric


def mode_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample on /metrics that carries a `mode` label, from any family: (name, labels, value)."""
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "mode" in sample.labels
    ]


def counted(text: str | None) -> dict[tuple[str, str], float]:
    """tracejudge_failure_modes_total by (metric, mode), the failing verdicts of agent `support`, zeros left out."""
    totals: dict[tuple[str, str], float] = {}
    for name, labels, value in mode_samples(text or ""):
        if name == "tracejudge_failure_modes_total" and value and labels.get("agent") == "support":
            key = (labels["metric"], labels["mode"])
            totals[key] = totals.get(key, 0.0) + value
    return totals


@pytest.mark.timeout(300)  # one `tracejudge consume` process; about 15 s here
def test_failure_modes_are_counted_live_and_agree_everywhere(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    judge_server.responder = respond
    taxonomy, rubric = write_files(tmp_path)
    results, group = f"{topic}-results", f"modes-{uuid.uuid4().hex[:6]}"
    broker.create_topic(results, 1)
    log = tmp_path / "consume.log"
    argv = ["--failure-modes", str(taxonomy), "--judge-file", str(rubric), "--metrics", "failure_rate,refunds"]
    environment = {
        **os.environ,
        "TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "TRACEJUDGE_TOPIC": topic,
        "TRACEJUDGE_GROUP_ID": group,
        "TRACEJUDGE_START_FROM": "earliest",
        "TRACEJUDGE_RESULTS_TOPIC": results,
        "TRACEJUDGE_RESULTS_TRANSCRIPT": "true",
        "TRACEJUDGE_METRICS_HOST": "127.0.0.1",
        "TRACEJUDGE_METRICS_PORT": "0",
        "TRACEJUDGE_COMMIT_INTERVAL": "0.3",
        "TRACEJUDGE_JUDGE_TIMEOUT": "20",
        "TRACEJUDGE_KAFKA_CONFIG": "session_timeout_ms=6000,heartbeat_interval_ms=1000",
        "PYTHONPATH": str(ROOT),
    }
    want = {(metric, mode): float(len(expected(metric, mode))) for metric, modes in ALLOWED.items() for mode in modes}
    assert [want["failure_rate", mode] for mode in (*FAILURE_RATE_MODES, "other")] == [5, 4, 3, 1]
    assert [want["refunds", mode] for mode in (*RUBRIC_MODES, "other")] == [3, 2, 1]
    with log.open("a") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "tracejudge.consumer", "consume", *argv],
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        play(traced_app(broker.bootstrap_servers, topic), conversations())
        records = result_records(broker, results, 2 * COUNT, timeout_s=180)
        assert len(records) == 2 * COUNT, f"{len(records)} results; the log:\n{log.read_text()[-3000:]}"
        scraped: list[str | None] = [None]

        def counts_reached() -> bool:
            scraped[0] = scrape_logged(log)
            return counted(scraped[0]) == want

        wait_for(counts_reached, timeout=30, what="the failure-mode counts on /metrics")
        text = scraped[0]
        assert text is not None
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 0, log.read_text()[-3000:]

    # /metrics: the counter per judge, verdict and mode; every `mode` label value anywhere is the judge's taxonomy or
    # `other` (the series are pre-created at 0 for each failing verdict), the answer outside it nowhere.
    samples = mode_samples(text)
    assert samples and all(labels["mode"] in ALLOWED[labels["metric"]] for _, labels, _ in samples), samples
    assert {labels["verdict"] for _, labels, _ in samples} == {"hallucination", "wrong_refund"}
    assert {labels["mode"] for _, labels, _ in samples} == {*ALLOWED["failure_rate"], *ALLOWED["refunds"]}
    assert OUTSIDE not in text and "invented_policies" not in text  # the default taxonomy was replaced, not added to
    assert sum(value for name, _, value in samples if name == "tracejudge_failure_modes_total") == 13 + 6
    verdicts = {
        (s.labels["metric"], s.labels["verdict"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "tracejudge_verdicts_total" and s.labels.get("agent") == "support"
    }
    assert verdicts[("failure_rate", "hallucination")] == 13 and verdicts[("refunds", "wrong_refund")] == 6

    # The results topic, record by record: the mode it counted under, None for every verdict that is not failing.
    by_key = {(r["conversation_id"], r["metric"]): r for r in records}
    assert len(by_key) == 2 * COUNT
    for (conversation, metric), record in by_key.items():
        verdict, _, mode = scripted(metric, int(conversation[-2:]))
        assert record["outcome"] == "judged", record
        assert (record["verdict"], record["failure_mode"]) == (verdict, mode), (conversation, metric)
        assert record["evidence"] == ["120 days"], record  # the rubric's own evidence key (`quotes`) read too

    # The judges asked for the mode in the same call, under a strict enum of their taxonomy.
    assert len(judge_server.requests) == 2 * COUNT and judge_server.schema_problems == []  # both strict, checked
    enums = {
        metric_of(r): r["response_format"]["json_schema"]["schema"]["properties"]["failure_mode"]["enum"]
        for r in judge_server.requests
    }
    assert enums == {
        "failure_rate": [*FAILURE_RATE_MODES, "other", None],
        "refunds": [*RUBRIC_MODES, "other", None],
    }

    check_explain_and_export(broker, group, results, tmp_path, capsys)


def check_explain_and_export(
    broker: EmbeddedBroker, group: str, results: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`explain` shows the mode a conversation's failing verdict counted under; `export --mode` writes exactly the
    conversations counted under it."""
    where = ["--bootstrap-servers", broker.bootstrap_servers, "--group-id", group, "--results-topic", results]
    capsys.readouterr()
    for metric, modes in (("failure_rate", FAILURE_RATE_MODES), ("refunds", RUBRIC_MODES)):
        for mode in (*modes, "other"):
            dataset = tmp_path / f"{metric}-{mode}.jsonl"
            argv = ["export", *where, "--metric", metric, "--mode", mode, "--output", str(dataset)]
            assert main(argv) == 0, capsys.readouterr()
            lines = [json.loads(line) for line in dataset.read_text().splitlines()]
            assert {line["conversation_id"] for line in lines} == expected(metric, mode), (metric, mode)
            assert len(lines) == len(expected(metric, mode))
            assert all(result["failure_mode"] == mode for line in lines for result in line["results"]), lines

    capsys.readouterr()
    said: dict[str, str] = {}
    for conversation in ("conv-15", "conv-16", "conv-36", "conv-37"):
        assert main(["explain", conversation, *where]) == 0
        said[conversation] = capsys.readouterr().out
    assert "failure_rate: judged hallucination about wrong_order_dates (score" in said["conv-15"], said["conv-15"]
    assert "refunds: judged wrong_refund about other (score" in said["conv-16"], said["conv-16"]
    assert "failure_rate: judged hallucination about other (score" in said["conv-36"], said["conv-36"]
    assert OUTSIDE not in said["conv-36"]
    assert "failure_rate: judged stall (score" in said["conv-37"] and "made_up_urls" not in said["conv-37"]
    assert main(["explain", "conv-07", *where, "--json"]) == 0  # for scripts: the mode beside the verdict
    story = json.loads(capsys.readouterr().out)
    (attempt,) = story["judgements"][-1]["metrics"]["refunds"]
    assert (attempt["verdict"], attempt["failure_mode"]) == ("wrong_refund", "wrong_amount")
