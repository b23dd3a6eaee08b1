"""The notifier and the export's selection without Kafka: rules, rate limit with its held-back count, duplicates,
give-up on a 4xx, Slack bodies, signatures; one line per conversation, dedupe by result id, shadow excluded."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.support.pipeline import ROOT, wait_for
from tests.support.webhook_receiver import WebhookReceiver
from tracejudge.consumer.adapters import Turn
from tracejudge.consumer.cli.export import Selection, select
from tracejudge.consumer.conversation.job import JudgeJob
from tracejudge.consumer.emit.notify import NotificationInstruments, Notifier, Rule, signature, verify
from tracejudge.consumer.judging.judgement import OUTCOME_JUDGED, Judgement
from tracejudge.metrics import MetricResult


def judgement(conversation_id: str, verdict: str, *, agent: str = "support", metric: str = "failure_rate") -> Judgement:
    turn = Turn(span_id="s1", trace_id="t" * 32, parent_span_id="", start_ns=1, end_ns=2, input="q", output="a")
    job = JudgeJob(
        key=conversation_id, conversation_id=conversation_id, agent=agent, partition=0, version=1,
        exchanges=(turn,), has_error=False, negative_feedback=False, truncated=False, completed_by="end_marker",
        content_id=f"content-{conversation_id}",
    )  # fmt: skip
    result = MetricResult(name=metric, verdict=verdict, score=0.0, threshold=0.7, model="m", reason="r")
    return Judgement(job, OUTCOME_JUDGED, [result])


def test_rules() -> None:
    assert Rule.parse("failure_rate=hallucination").matches("failure_rate", "hallucination")
    assert not Rule.parse("failure_rate=hallucination").matches("conversational_flow", "hallucination")
    assert Rule.parse("stall").matches("failure_rate", "stall")
    assert Rule.parse("conversational_flow=*").matches("conversational_flow", "none")


def test_rate_limit_holds_back_counts_and_says_how_many_then_duplicates_are_skipped() -> None:
    now = [0.0]
    instruments = NotificationInstruments(CollectorRegistry())
    with WebhookReceiver() as receiver:
        notifier = Notifier(
            [receiver.url], rate_per_minute=2, instruments=instruments, clock=lambda: now[0], base_backoff_s=0.01
        ).start()
        try:
            done = [e for i in range(5) for e in notifier.emit(judgement(f"c{i}", "hallucination"))]
            assert len(done) == 2  # a burst of 2, then 3 held back
            # The same result id: never twice (its commit waits for the first post, if that is still under way).
            assert set(notifier.emit(judgement("c0", "hallucination"))) <= {done[0]}
            assert notifier.emit(judgement("other", "honest_fallback")) == []  # not a rule's verdict
            now[0] = 30.0  # one token back
            done += notifier.emit(judgement("c9", "hallucination"))
            wait_for(lambda: all(e.is_set() for e in done), 10, "delivered")
        finally:
            notifier.close()
    bodies = [json.loads(d.body) for d in receiver.accepted()]
    assert [b["subject"] for b in bodies] == ["c0", "c1", "c9"]
    assert [b["data"]["held_back"] for b in bodies] == [0, 0, 3]
    value = instruments.notifications.labels
    assert [value(outcome=o)._value.get() for o in ("delivered", "held_back", "duplicate")] == [3, 3, 1]


def test_a_4xx_is_given_up_at_once_and_its_event_set() -> None:
    instruments = NotificationInstruments(CollectorRegistry())
    errors: list[int] = []
    with WebhookReceiver(status=404) as receiver:
        notifier = Notifier([receiver.url], instruments=instruments, on_error=lambda: errors.append(1)).start()
        try:
            (done,) = notifier.emit(judgement("c1", "hallucination"))
            assert done.wait(10)
        finally:
            notifier.close()
    assert len(receiver.deliveries) == 1 and errors == [1]
    assert instruments.notifications.labels(outcome="given_up")._value.get() == 1


def test_slack_body_and_signature() -> None:
    notifier = Notifier(["http://127.0.0.1:9/x"], body_format="slack", trace_url_template="http://t/{trace_id}")
    body, content_type = notifier.body(
        {"result_id": "r1", "conversation_id": "c1", "agent": "support", "metric": "failure_rate",
         "verdict": "hallucination", "reason": "made up a refund", "evidence": ["$1M"], "trace_id": "abc"},
        held_back=2,
    )  # fmt: skip
    text = json.loads(body)["text"]
    assert content_type == "application/json"
    assert "<http://t/abc|c1>" in text and "made up a refund" in text and "2 more notifications" in text
    assert verify("k", body, signature("k", body)) and not verify("k", body + b" ", signature("k", body))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRACEJUDGE_NOTIFY_URL": "hooks.example.com"}, "--notify-url / TRACEJUDGE_NOTIFY_URL: 'hooks.example.com'"),
        ({"TRACEJUDGE_NOTIFY_ON": "failure_rate=halucination"}, "unknown verdict 'halucination'"),
        ({"TRACEJUDGE_TRACE_URL_TEMPLATE": "http://t/{trace}"}, "unknown field 'trace'"),
        ({"TRACEJUDGE_NOTIFY_RETRY_FOR": "nan"}, "must be a finite number of seconds"),  # nan once passed `<= 0`
        ({"TRACEJUDGE_NOTIFY_RETRY_FOR": "inf"}, "must be a finite number of seconds"),
        ({"TRACEJUDGE_NOTIFY_RETRY_FOR": "700000"}, "at most 7 days"),
    ],
)
def test_bad_notify_settings_are_one_line_and_exit_2(env: dict[str, str], message: str) -> None:
    import os

    process = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "consume"],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 2, process.stderr
    lines = process.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def record(cid: str, rid: str, verdict: str, *, version: int = 2, shadow: bool = False, **extra: Any) -> dict:
    return {
        "result_id": rid, "conversation_id": cid, "content_id": f"{cid}-{version}", "agent": "support",
        "metric": "failure_rate", "version": version, "verdict": verdict, "reason": "r", "evidence": [], "model": "m",
        "rubric_version": "failure_rate@x", "shadow": shadow, "error": None, "trace_id": "t",
        "judged_at": f"2026-12-01T00:00:0{version}+00:00",
        "transcript": [{"turn": 1, "user": "q", "assistant": "a"}, {"omitted": "[3 turns omitted]"},
                       {"turn": 5, "user": f"q{version}", "assistant": "a5"}],
        **extra,
    }  # fmt: skip


def test_one_line_per_conversation_its_latest_transcript_deduped_and_no_shadow() -> None:
    records = [
        record("a", "r1", "hallucination", version=1),
        record("a", "r2", "hallucination", version=2),  # a continuation: the newer transcript wins
        record("a", "r2", "hallucination", version=2),  # replayed: the same result id
        record("b", "r3", "hallucination", shadow=True),  # the shadow judge's: left out
        record("c", "r4", "honest_fallback"),
        record("d", "r5", "hallucination", transcript=None),  # without --results-transcript
    ]
    export = select(records, Selection(verdicts={"hallucination"}))
    assert [line["result_id"] for line in export.lines] == ["r2"]
    line = export.lines[0]
    assert line["turns"] == [{"input": "q", "actual_output": "a"}, {"input": "q2", "actual_output": "a5"}]
    assert line["turns_omitted"] == 3 and (export.matched, export.without_transcript) == (3, 1)
    assert [x["result_id"] for x in select(records, Selection({"hallucination"}, include_shadow=True)).lines] == [
        "r2", "r3"
    ]  # fmt: skip
    assert select(records, Selection({"hallucination"}, limit=1, include_shadow=True)).lines[0]["result_id"] == "r2"


def test_the_newest_copy_of_a_result_id_wins() -> None:
    """A replay re-judged differently: the latest verdict for a result id is the one exported (or none, when the
    newest no longer matches the selection)."""
    older = record("a", "r1", "honest_fallback")
    newer = record("a", "r1", "hallucination", reason="the newest verdict")
    export = select([older, newer], Selection(verdicts={"hallucination"}))
    assert [line["reason"] for line in export.lines] == ["the newest verdict"] and export.matched == 1
    assert select([newer, older], Selection(verdicts={"hallucination"})).lines == []
    (line,) = select([newer, older], Selection()).lines
    assert line["verdict"] == "honest_fallback" and line["reason"] == "r"


def test_a_replay_whose_judge_call_failed_does_not_erase_the_verdict() -> None:
    """The same result id written again without a verdict (its re-judgement failed) once became the newest copy and
    dropped the conversation from `export --verdict hallucination`."""
    judged = record("c1", "r1", "hallucination")
    failed = {**judged, "verdict": None, "error": "judge timed out", "judged_at": "2026-12-01T01:00:00+00:00"}
    export = select([judged, failed], Selection(verdicts={"hallucination"}))
    assert [line["conversation_id"] for line in export.lines] == ["c1"]
    assert export.lines[0]["verdict"] == "hallucination"


@pytest.mark.parametrize("horizon", [float("nan"), float("inf"), 0.0])
def test_a_notifier_refuses_a_horizon_that_is_not_a_finite_positive_number(horizon: float) -> None:
    with pytest.raises(ValueError, match="retry_for_s must be a finite number of seconds"):
        Notifier(["http://127.0.0.1:9/hook"], retry_for_s=horizon)


REFUND_RUBRIC = (
    "name: refund_policy\nversion: 1\ninstructions: Did the agent keep to the refund policy?\nlabels:\n"
    "  - {name: compliant, weight: 1.0}\n  - {name: minor_deviation, weight: 0.5}\n  - {name: violation, weight: 0.0}\n"
)


def test_export_selects_a_rubric_file_judges_verdicts_and_its_regression_file_needs_the_file(tmp_path: Any) -> None:
    """`export --metric refund_policy --verdict violation`: exactly that judge's violations; a judge no order knows
    comes after the built-ins, by name; the regression file re-judges it from its --judge-file, and without one
    export refuses in one line naming the flag."""
    from pathlib import Path

    from tracejudge.consumer.cli.export import ExportError, regression_suite, selection_from
    from tracejudge.consumer.cli.parser import build_parser
    from tracejudge.consumer.judging.gold import labels_with

    rubric = Path(tmp_path) / "refund_policy.yaml"
    rubric.write_text(REFUND_RUBRIC, encoding="utf-8")
    records = [
        record("a", "r1", "hallucination"),
        record("a", "r2", "violation", metric="refund_policy", rubric_version="refund_policy@1-abc"),
        record("a", "r3", "violation", metric="zz_policy"),
        record("b", "r4", "compliant", metric="refund_policy"),
        record("c", "r5", "violation", metric="refund_policy"),
        record("d", "r6", "violation", metric="refund_policy", shadow=True),
    ]

    def namespace(*args: str) -> Any:
        return build_parser().parse_args(["export", "--output", str(Path(tmp_path) / "out.jsonl"), *args])

    chosen = selection_from(
        namespace("--metric", "refund_policy", "--verdict", "violation"), labels_with([str(rubric)])
    )
    export = select(records, chosen)
    assert [(line["conversation_id"], [r["result_id"] for r in line["results"]]) for line in export.lines] == [
        ("a", ["r2"]),
        ("c", ["r5"]),
    ]
    assert all(line["metric"] == "refund_policy" and line["verdict"] == "violation" for line in export.lines)
    # Without its file the judge's name still selects it: any label-like verdict may be asked for.
    assert selection_from(namespace("--metric", "refund_policy", "--verdict", "violation")).metrics == ["refund_policy"]
    with pytest.raises(ExportError, match=r"^--verdict: unknown violation; known: "):
        selection_from(namespace("--metric", "failure_rate", "--verdict", "violation"), labels_with([str(rubric)]))
    # Every judge of conversation a: the built-ins first, then the others sorted by name.
    (line,) = [x for x in select(records, Selection(verdicts={"hallucination", "violation"})).lines if x["name"] == "a"]
    assert [r["metric"] for r in line["results"]] == ["failure_rate", "refund_policy", "zz_policy"]

    test_file = Path(tmp_path) / "test_refunds.py"
    with pytest.raises(ExportError, match=r"refund_policy.*--judge-file PATH; nothing written"):
        regression_suite(Path(tmp_path) / "out.jsonl", test_file, export, "violation")
    source = regression_suite(Path(tmp_path) / "out.jsonl", test_file, export, "violation", [str(rubric)])
    compile(source, str(test_file), "exec")
    assert "'refund_policy'" in source and "Did the agent keep to the refund policy?" in source
