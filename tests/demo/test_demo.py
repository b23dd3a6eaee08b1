"""`tracejudge demo` as a new user runs it: one command, exit 0, summary matching the scenario labels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tracejudge.consumer.demo import SCENARIOS, SCRIPTED_NOTICE, expected_summary

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_end_to_end_offline(tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    env = {
        k: v for k, v in os.environ.items() if k not in ("TRACEJUDGE_JUDGE_MODEL", "TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS")
    }
    env.update({"TRACEJUDGE_DEMO_SUMMARY": str(summary_path), "COLUMNS": "160", "PYTHONPATH": str(ROOT)})
    completed = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert SCRIPTED_NOTICE in completed.stdout
    assert "/metrics" in completed.stdout and "tracejudge demo: per agent" in completed.stdout
    summary = json.loads(summary_path.read_text())
    assert summary["scripted"] is True
    expected = expected_summary()
    for agent, row in summary["agents"].items():
        assert row["conversations"] == expected[agent]["conversations"], agent
        assert row["failed"] == 0
        assert abs(row["hallucination_rate"] - expected[agent]["hallucination_rate"]) < 1e-9
        assert abs(row["flow_score"] - expected[agent]["flow_score"]) < 1e-9
    verdicts = sum(sum(row["verdicts"].values()) for row in summary["agents"].values())
    assert verdicts == 2 * len(SCENARIOS)
