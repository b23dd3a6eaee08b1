"""A team's rubric file judges through the real consumer like a built-in (issue 44).

One in-process consumer on the embedded broker, a judge server scripted per conversation and per judge: 30
conversations, 6 of them a refund_policy `violation`, judged by a three-label rubric file beside the two built-ins.
Counters, results topic, `explain`, `export` and notifications all carry the file's judge; the built-ins answer as
scripted. A backfill over the same range with the file unchanged calls no judge; with its instructions edited it
re-judges refund_policy (only) under new result ids. And a bad file is one line and exit 2 before any connection.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.judge_server import JudgeServer, Reply, conversation_text, metric_of
from tests.support.pipeline import ROOT, RunningConsumer, consumer_settings, play, read_all, traced_app, wait_for
from tests.support.webhook_receiver import WebhookReceiver
from tracejudge.consumer.cli import main
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit.prometheus import family_total

COUNT, VIOLATIONS = 30, (2, 5, 11, 16, 23, 27)
REFUND: dict[str, Any] = {
    "name": "refund_policy",
    "version": 1,
    "description": "Did the agent keep to the refund policy?",
    "instructions": "Refunds are allowed within 30 days with a receipt. Judge whether the agent kept to this.",
    "labels": [
        {"name": "compliant", "weight": 1.0, "description": "kept to the policy"},
        {"name": "minor_deviation", "weight": 0.5, "description": "small slip, no harm"},
        {"name": "violation", "weight": 0.0, "description": "promised a refund the policy forbids"},
    ],
}


def conversations() -> dict[str, list[tuple[str, str]]]:
    return {
        f"rp-{i:02d}": [
            (f"rp-{i:02d}: can I return this after {20 + i} days?", f"Answer {i} about returns."),
            (f"rp-{i:02d}: and the refund?", "Refunds take 5 days."),
        ]
        for i in range(COUNT)
    }


def expected(metric: str, conversation: str) -> str:
    """What the judge server answers each judge for each conversation."""
    i = int(conversation[-2:])
    if metric == "refund_policy":
        return "violation" if i in VIOLATIONS else ("minor_deviation" if i % 3 == 0 else "compliant")
    if metric == "failure_rate":
        return "hallucination" if i % 7 == 0 else "honest_fallback"
    return "partial" if i % 2 else "fully"


def conversation_of(request: dict[str, Any]) -> str:
    match = re.search(r"rp-\d\d", conversation_text(request))
    assert match, "a judge request without a conversation id"
    return match.group(0)


def respond(request: dict[str, Any]) -> Reply:
    metric, conversation = metric_of(request), conversation_of(request)
    label = expected(metric, conversation)
    evidence_key = "key_issues" if metric == "conversational_flow" else "evidence"
    reason = f"scripted {metric} reason for {conversation}"
    return Reply(content=json.dumps({"verdict": label, evidence_key: [], "reason": reason}))


def calls(server: JudgeServer) -> Counter[str]:
    return Counter(metric_of(r) for r in server.requests)


def backfill(argv: list[str], summary: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACEJUDGE_BACKFILL_SUMMARY": str(summary)}
    done = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "backfill", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(summary.read_text())


@pytest.mark.timeout(600)
def test_a_rubric_file_judges_counts_explains_exports_notifies_and_versions_its_results(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path, capsys: Any
) -> None:
    judge_server.responder = respond
    rubric = tmp_path / "refund_policy.yaml"
    rubric.write_text(yaml.safe_dump(REFUND, sort_keys=False), encoding="utf-8")
    results = f"{topic}-results"
    broker.create_topic(results, 1)
    start_s = time.time() - 60
    violations = {f"rp-{i:02d}" for i in VIOLATIONS}
    with WebhookReceiver() as receiver:
        settings = consumer_settings(
            broker.bootstrap_servers,
            topic,
            judge_timeout=30.0,
            judge_files=[str(rubric)],
            results_topic=results,
            results_transcript=True,
            notify_url=[receiver.url],
            notify_on=["refund_policy=violation"],
        )
        assert settings.metrics == ["failure_rate", "conversational_flow", "refund_policy"]
        with RunningConsumer(settings) as consumer:
            play(traced_app(broker.bootstrap_servers, topic), conversations())
            wait_for(lambda: consumer.sessions("judged") == COUNT, what="30 judged conversations", timeout=180)
            wait_for(
                lambda: consumer.value("tracejudge_notifications_total", outcome="delivered") == len(violations),
                what="6 notifications delivered",
            )
            counted = {
                label: family_total(consumer.app.registry, "tracejudge_verdicts", metric="refund_policy", verdict=label)
                for label in ("compliant", "minor_deviation", "violation")
            }
        end_s = time.time() + 1
    assert counted["violation"] == 6 and counted["compliant"] + counted["minor_deviation"] == 24, counted
    assert counted["minor_deviation"] == sum(1 for i in range(COUNT) if i % 3 == 0 and i not in VIOLATIONS)
    assert calls(judge_server) == {"failure_rate": COUNT, "conversational_flow": COUNT, "refund_policy": COUNT}

    # The results topic: one record per conversation and judge, the scripted verdicts (built-ins unchanged).
    records = [json.loads(r.value) for r in read_all(broker.bootstrap_servers, results)]
    judged = [r for r in records if r.get("verdict")]
    assert Counter((r["metric"], r["conversation_id"]) for r in judged) == Counter(
        {(m, c): 1 for m in ("failure_rate", "conversational_flow", "refund_policy") for c in conversations()}
    )
    by_metric: dict[str, dict[str, dict[str, Any]]] = {}
    for record in judged:
        by_metric.setdefault(record["metric"], {})[record["conversation_id"]] = record
    assert set(by_metric) == {"failure_rate", "conversational_flow", "refund_policy"}
    for metric, per_conversation in by_metric.items():
        assert set(per_conversation) == set(conversations()), metric
        for conversation, record in per_conversation.items():
            assert record["verdict"] == expected(metric, conversation), (metric, conversation)
    refund = by_metric["refund_policy"]
    for conversation in violations:
        assert refund[conversation]["reason"] == f"scripted refund_policy reason for {conversation}"
    version = refund["rp-02"]["rubric_version"]
    assert version.startswith("refund_policy@1.") and len({r["rubric_version"] for r in refund.values()}) == 1

    # Notifications: exactly the 6 violations' result ids.
    ids = [json.loads(d.body)["id"] for d in receiver.accepted()]
    assert sorted(ids) == sorted(refund[c]["result_id"] for c in violations)

    # explain: the file's judge, its verdict and reason.
    env = {
        "TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "TRACEJUDGE_GROUP_ID": settings.group_id,
        "TRACEJUDGE_RESULTS_TOPIC": results,
        "TRACEJUDGE_JUDGE_FILES": str(rubric),
    }
    done = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "explain", "rp-05"],
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    story = done.stdout
    assert f"refund_policy: judged violation (score 0.0) by gpt-4o-mini {version}," in story, story
    assert refund["rp-05"]["result_id"] in story and "reason: scripted refund_policy reason for rp-05" in story, story

    # export: exactly the 6 violations.
    dataset = tmp_path / "violations.jsonl"
    argv = ["export", "--bootstrap-servers", broker.bootstrap_servers, "--results-topic", results]
    capsys.readouterr()
    code = main(
        [
            *argv,
            "--judge-file",
            str(rubric),
            "--metric",
            "refund_policy",
            "--verdict",
            "violation",
            "--output",
            str(dataset),
        ]
    )
    assert code == 0, capsys.readouterr().err
    lines = [json.loads(line) for line in dataset.read_text().splitlines()]
    assert sorted(line["conversation_id"] for line in lines) == sorted(violations)
    assert all(line["verdict"] == "violation" and line["rubric_version"] == version for line in lines)

    # Replay through backfill: the file unchanged, every result id is found and no judge is called.
    range_argv = [
        "--from", str(start_s), "--to", str(end_s), "--bootstrap-servers", broker.bootstrap_servers,
        "--topic", topic, "--results-topic", results, "--judge-file", str(rubric),
        "--session-idle-timeout", "30",
    ]  # fmt: skip
    before = calls(judge_server)
    again = backfill(range_argv, tmp_path / "again.json")
    assert again["judged"] == 0 and again["skipped_existing"] == COUNT and calls(judge_server) == before, again

    # The instructions edited: refund_policy re-judges under a new rubric version and new result ids; the built-ins,
    # unchanged, are not asked again.
    rubric.write_text(
        yaml.safe_dump(
            {**REFUND, "instructions": REFUND["instructions"] + " A receipt photo counts."}, sort_keys=False
        ),
        encoding="utf-8",
    )
    edited = backfill(range_argv, tmp_path / "edited.json")
    after = calls(judge_server)
    # Backfill selects per conversation: one judge's missing result id judges the conversation with every judge, so
    # the built-ins are asked again too, under their unchanged result ids (same verdicts, nothing new to count).
    assert edited["judged"] == COUNT and (after - before)["refund_policy"] == COUNT, (after - before, edited)
    everything = [json.loads(r.value) for r in read_all(broker.bootstrap_servers, results)]
    for record in everything:
        if record.get("verdict") and record["metric"] != "refund_policy":
            assert record["result_id"] == by_metric[record["metric"]][record["conversation_id"]]["result_id"]
            assert record["verdict"] == expected(record["metric"], record["conversation_id"])
    rejudged = [r for r in everything if r.get("metric") == "refund_policy" and r.get("verdict")]
    new = {r["conversation_id"]: r for r in rejudged if r["rubric_version"] != version}
    assert set(new) == set(conversations())
    assert all(r["rubric_version"].startswith("refund_policy@1.") for r in new.values())
    assert not {r["result_id"] for r in new.values()} & {r["result_id"] for r in refund.values()}
    assert all(r["verdict"] == expected("refund_policy", c) for c, r in new.items())


def _bad(tmp: Path, data: Any) -> Path:
    path = tmp / "bad.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _labels(**change: Any) -> list[dict[str, Any]]:
    labels = [dict(label) for label in REFUND["labels"]]
    labels[1].update(change)
    return labels


BAD_FILES = [
    ("no labels", {k: v for k, v in REFUND.items() if k != "labels"}, "labels"),
    ("one label", {**REFUND, "labels": REFUND["labels"][:1]}, "labels"),
    ("duplicate label", {**REFUND, "labels": [*REFUND["labels"], REFUND["labels"][0]]}, "labels"),
    ("weight above 1", {**REFUND, "labels": _labels(weight=1.5)}, "labels[1].weight"),
    ("weight a boolean", {**REFUND, "labels": _labels(weight=True)}, "labels[1].weight"),
    ("bad name", {**REFUND, "name": "Refund-Policy"}, "name"),
    ("empty instructions", {**REFUND, "instructions": " "}, "instructions"),
    ("unknown field", {**REFUND, "instruction": "typo"}, "instruction"),
    ("version a float", {**REFUND, "version": 1.5}, "version"),
    ("a built-in's name", {**REFUND, "name": "failure_rate"}, "name"),
    (
        "example verdict not a label",
        {**REFUND, "examples": [{"turns": [{"user": "u", "assistant": "a"}], "verdict": "great"}]},
        "examples[0].verdict",
    ),
    ("key given twice", "name: refund_policy\ninstructions: a\ninstructions: b\n", "instructions"),
]


@pytest.mark.parametrize(("case", "data", "field"), BAD_FILES, ids=[case[0] for case in BAD_FILES])
def test_consume_with_a_bad_rubric_file_is_one_line_and_exit_2_before_connecting(
    tmp_path: Path, case: str, data: Any, field: str
) -> None:
    path = _bad(tmp_path, data)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEJUDGE_") and not k.startswith("OPENAI_")}
    done = subprocess.run(
        # a port nothing listens on: reaching it would show as a Kafka error (69), not 2
        [sys.executable, "-m", "tracejudge.consumer", "consume", "--judge-file", str(path),
         "--bootstrap-servers", "127.0.0.1:9", "--topic", "spans"],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{path}: {field}: " in lines[0], lines[0]
