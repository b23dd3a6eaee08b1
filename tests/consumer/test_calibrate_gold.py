"""`tracejudge calibrate` on the built-in gold set, to the end, against the local judge over real HTTP, redaction on.

The installed command in its own process with a deadline: a redactor that loops (as it once did on tools-007's
20-digit tracking number) fails this test by its timeout instead of hanging `make test`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.judge_server import JudgeServer, Reply, conversation_text, metric_of, verdict
from tracejudge.consumer.cli.calibrate import load_dataset

ROOT = Path(__file__).resolve().parents[2]
TRACKING = "JD014600006281735520"


def test_builtin_gold_set_calibrates_to_the_end(judge_server: JudgeServer, tmp_path: Path) -> None:
    def respond(request: dict[str, Any]) -> Reply:
        return verdict("mostly" if metric_of(request) == "conversational_flow" else "not_applicable")

    judge_server.responder = respond
    dataset = load_dataset(None)
    expected = {(item.id, metric) for item in dataset.items for metric in item.labels}
    assert any(item.id == "tools-007" for item in dataset.items)
    out = tmp_path / "report.json"
    completed = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "calibrate", "--redact", "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TRACEJUDGE_JUDGE_RETRIES": "0"},
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "Traceback" not in completed.stderr
    report = json.loads(out.read_text())
    assert report["dataset"]["builtin"] is True and report["dataset"]["conversations"] == len(dataset.items)
    assert {(item["id"], item["metric"]) for item in report["items"]} == expected
    for name, metric in report["metrics"].items():
        assert metric["judge_failures"] == 0, (name, metric["judge_failure_kinds"])
        assert metric["n"] == metric["labelled"] == sum(1 for _, m in expected if m == name)
    assert len(judge_server.requests) == len(expected) and len(judge_server.checks) == 1
    tools_007 = [r for r in judge_server.requests if TRACKING in conversation_text(r)]
    assert len(tools_007) == 2  # both metrics judged it; a tracking number is not PII, it stays
    # Redaction was on: the gold set's e-mail addresses never reach the judge, in prose or quoted in a call
    # (tools-001's `reset_password('sam.ortiz@example.com')`).
    sent = "\n".join(conversation_text(r) for r in judge_server.requests)
    for prose in ("sam.ortiz@example.com, as I wrote", "lena.k@example.org", "new@example.com. OK", "('sam.ortiz@"):
        assert any(prose in u + a for item in dataset.items for u, a in item.turns), prose
        assert prose not in sent, prose
    assert "[EMAIL]" in sent
