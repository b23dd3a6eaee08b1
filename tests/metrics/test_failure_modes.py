"""Failure modes at the judge: the strict schema carries the mode enum only where the judge has a taxonomy, the mode a
verdict counts under is always in the taxonomy or `other` (never a new label value, never on a verdict that is not
failing), and a taxonomy file that cannot be one stops `tracejudge consume` in one line, exit 2, before it connects.
The judge's calls go over real HTTP to the scripted OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.judge_server import JudgeServer, Reply
from tests.support.pipeline import ROOT
from tracejudge.metrics import (
    ConversationalEvalTestCase,
    ConversationalFlowRateMetric,
    EvalTestCase,
    FailureRateMetric,
)
from tracejudge.metrics._judge import OTHER_MODE
from tracejudge.metrics.judges import judge_classes
from tracejudge.metrics.rubric import MAX_FAILURE_MODES, RubricError, RubricMetric, load_failure_modes

CONVERSATION = ConversationalEvalTestCase(
    turns=[EvalTestCase(input="Can I get a refund after 90 days?", actual_output="Yes, our 120-day policy covers it.")]
)
TAXONOMY = (("invented_policies", "made-up policies"), ("wrong_dates", "made-up dates"))
DEFAULT_MODES = ("invented_facts", "invented_policies", "invented_sources", "invented_features")


def answer(verdict: str, **extra: Any) -> Reply:
    return Reply(content=json.dumps({"verdict": verdict, "evidence": ["120-day"], "reason": "scripted", **extra}))


def schema_of(request: dict[str, Any]) -> dict[str, Any]:
    return request["response_format"]["json_schema"]["schema"]


def rubric_file(path: Path, modes: list[dict[str, str]] | None) -> Path:
    data: dict[str, Any] = {
        "name": "refunds",
        "instructions": "Did the agent state the refund rules as the policy gives them?",
        "labels": [
            {"name": "wrong_refund", "weight": 0.0},
            {"name": "correct_refund", "weight": 1.0},
            {"name": "no_refund_topic", "weight": 1.0},
        ],
    }
    if modes is not None:
        data["failure_modes"] = modes
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_strict_schema_has_the_mode_enum_only_where_the_judge_has_a_taxonomy(
    judge_server: JudgeServer, tmp_path: Path
) -> None:
    judge_server.enqueue(*(answer("not_applicable") for _ in range(3)))
    judge_server.enqueue(Reply(content=json.dumps({"verdict": "fully", "key_issues": [], "reason": "ok"})))
    builtin = FailureRateMetric("gpt-4o-mini")  # its shipped taxonomy
    replaced = FailureRateMetric("gpt-4o-mini", failure_modes=TAXONOMY)  # --failure-modes
    without = FailureRateMetric("gpt-4o-mini", failure_modes=())
    for metric in (builtin, replaced, without, ConversationalFlowRateMetric("gpt-4o-mini")):
        result = asyncio.run(metric.evaluate(CONVERSATION))
        assert result.error is None, result.error
    sent = [schema_of(r) for r in judge_server.requests]
    assert judge_server.schema_problems == []
    default = sent[0]["properties"]["failure_mode"]
    assert default["type"] == ["string", "null"]
    assert default["enum"][-2:] == [OTHER_MODE, None] and set(DEFAULT_MODES) <= set(default["enum"])
    assert len(default["enum"]) == len(set(default["enum"])) and "failure_mode" in sent[0]["required"]
    assert sent[1]["properties"]["failure_mode"]["enum"] == ["invented_policies", "wrong_dates", OTHER_MODE, None]
    assert sorted(sent[1]["required"]) == sorted(sent[1]["properties"]) and not sent[1]["additionalProperties"]
    for schema in sent[2:]:  # no taxonomy: the schema as before, no mode asked for
        assert "failure_mode" not in schema["properties"] and "failure_mode" not in schema["required"]
    # The prompt names the same modes, and nothing of them where there is no taxonomy.
    prompts = [r["messages"][0]["content"] for r in judge_server.requests]
    assert '"wrong_dates"' in prompts[1] and f'"{OTHER_MODE}"' in prompts[1] and '"invented_facts"' not in prompts[1]
    assert all('"failure_mode"' not in prompt for prompt in prompts[2:])
    # The class's own schema (what versions the rubric) agrees with what an instance sends.
    assert FailureRateMetric.response_format()["json_schema"]["schema"] == sent[0]
    assert "failure_mode" not in ConversationalFlowRateMetric.response_format()["json_schema"]["schema"]["properties"]

    # A rubric file's judge: the enum from its own `failure_modes:`, none without them.
    with_modes = RubricMetric.from_file(rubric_file(tmp_path / "a.yaml", [{"name": "wrong_amount"}]), "gpt-4o-mini")
    bare = RubricMetric.from_file(rubric_file(tmp_path / "b.yaml", None), "gpt-4o-mini")
    assert with_modes.response_format(with_modes.failure_modes)["json_schema"]["schema"]["properties"]["failure_mode"][
        "enum"
    ] == ["wrong_amount", OTHER_MODE, None]
    assert with_modes.failing_verdicts == ("wrong_refund",)  # by default: the labels weighted below 0.5
    assert (
        bare.failure_modes == ()
        and "failure_mode" not in bare.response_format(())["json_schema"]["schema"]["properties"]
    )


@pytest.mark.parametrize(
    ("verdict", "named", "expected"),
    [
        ("hallucination", "wrong_dates", "wrong_dates"),
        ("hallucination", "  Wrong_Dates ", "wrong_dates"),  # the name as a label value, whatever the case
        ("hallucination", "invented_facts", OTHER_MODE),  # the default's, not in the taxonomy that replaced it
        ("hallucination", "refund rules {x}", OTHER_MODE),  # never a new label value
        ("hallucination", None, OTHER_MODE),  # a failing verdict without a mode still counts
        ("hallucination", "", OTHER_MODE),
        ("stall", "wrong_dates", None),  # not failing: never a mode, whatever the answer says
        ("honest_fallback", "invented_policies", None),
        ("not_applicable", OTHER_MODE, None),
    ],
)
def test_the_mode_a_verdict_counts_under(
    judge_server: JudgeServer, verdict: str, named: str | None, expected: str | None
) -> None:
    extra = {} if named is None else {"failure_mode": named}
    judge_server.enqueue(answer(verdict, **extra))
    metric = FailureRateMetric("gpt-4o-mini", failure_modes=TAXONOMY)
    result = asyncio.run(metric.evaluate(CONVERSATION))
    assert (result.verdict, result.failure_mode) == (verdict, expected)
    assert metric.mode_of(verdict, named.strip().lower() if named else None) == expected


def test_a_judge_without_a_taxonomy_names_no_mode(judge_server: JudgeServer) -> None:
    judge_server.enqueue(answer("hallucination", failure_mode="wrong_dates"))
    result = asyncio.run(FailureRateMetric("gpt-4o-mini", failure_modes=()).evaluate(CONVERSATION))
    assert (result.verdict, result.failure_mode) == ("hallucination", None)


def test_a_rubric_judge_names_its_mode_and_keeps_its_evidence_under_its_own_key(
    judge_server: JudgeServer, tmp_path: Path
) -> None:
    """A rubric file's `evidence_key` names the list in the answer; the evidence is read from it, not dropped."""
    path = rubric_file(tmp_path / "refunds.yaml", [{"name": "wrong_amount"}, {"name": "wrong_deadline"}])
    path.write_text(path.read_text() + "evidence_key: quotes\n")
    metric = RubricMetric.from_file(path, "gpt-4o-mini")
    said = {"verdict": "wrong_refund", "quotes": ["120-day"], "reason": "r", "failure_mode": "wrong_deadline"}
    judge_server.enqueue(Reply(content=json.dumps(said)))
    result = asyncio.run(metric.evaluate(CONVERSATION))
    assert judge_server.schema_problems == [] and "quotes" in schema_of(judge_server.requests[0])["required"]
    assert (result.verdict, result.failure_mode, result.evidence) == ("wrong_refund", "wrong_deadline", ["120-day"])


def test_a_taxonomy_file_replaces_the_judges_own(tmp_path: Path) -> None:
    path = tmp_path / "modes.yaml"
    modes = [{"name": f"mode_{i}", "description": f"mode {i}"} for i in range(MAX_FAILURE_MODES)]
    path.write_text(yaml.safe_dump({"failure_rate": [*modes, {"name": OTHER_MODE}]}))  # 20, `other` not counted
    taxonomies = load_failure_modes(path, judge_classes())
    assert [name for name, _ in taxonomies["failure_rate"]] == [m["name"] for m in modes]
    metric = FailureRateMetric("gpt-4o-mini", failure_modes=taxonomies["failure_rate"])
    assert metric.failure_modes == (*(m["name"] for m in modes), OTHER_MODE)
    # A rubric file's judge is a known name once its file is given.
    rubric = rubric_file(tmp_path / "refunds.yaml", [{"name": "wrong_amount"}])
    path.write_text(yaml.safe_dump({"refunds": [{"name": "wrong_deadline"}]}))
    assert load_failure_modes(path, judge_classes([str(rubric)])) == {"refunds": (("wrong_deadline", ""),)}
    with pytest.raises(RubricError, match="unknown judge"):
        load_failure_modes(path, judge_classes())


# Nothing listens there: a command that got past its options would fail differently (and later).
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
MALFORMED = {
    "duplicate": ("failure_rate:\n  - {name: wrong_dates}\n  - {name: wrong_dates}\n", "duplicate mode 'wrong_dates'"),
    "too_many": (
        yaml.safe_dump({"failure_rate": [{"name": f"mode_{i}"} for i in range(MAX_FAILURE_MODES + 1)]}),
        "21 modes; at most 20",
    ),
    "unknown_judge": ("support_bot:\n  - {name: wrong_dates}\n", "support_bot: unknown judge"),
    "not_yaml": ("failure_rate: [\n  {name: wrong_dates\n", "is not YAML"),
    "not_a_label_value": ("failure_rate:\n  - {name: Wrong Dates!}\n", "must match"),
    "not_a_mapping": ("- {name: wrong_dates}\n", "expected a mapping"),
    "unknown_field": ("failure_rate:\n  - {name: wrong_dates, colour: red}\n", "unknown field"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_taxonomy_is_one_line_and_exit_2_before_connecting(tmp_path: Path, case: str) -> None:
    text, problem = MALFORMED[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "consume", "--failure-modes", str(path)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert str(path) in line and problem in line and "--failure-modes" in line, line


def test_a_rubric_files_own_malformed_taxonomy_is_one_line_and_exit_2(tmp_path: Path) -> None:
    rubric = rubric_file(tmp_path / "refunds.yaml", [{"name": "wrong_amount"}, {"name": "wrong_amount"}])
    done = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "consume", "--judge-file", str(rubric)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert str(rubric) in line and "duplicate mode 'wrong_amount'" in line, line
