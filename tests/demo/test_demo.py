"""`tracejudge demo` as a new user runs it: one command, exit 0, summary matching the scenario labels."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tracejudge.consumer.cli.demo import (
    SCENARIOS,
    SCRIPTED_NOTICE,
    SUMMARY_COLUMNS,
    TRY_NEXT,
    WHAT_THE_NUMBERS_MEAN,
    closing_text,
    expected_summary,
)
from tracejudge.consumer.cli.parser import build_parser

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
    # It ends by saying what the numbers mean and what to try next, after the numbers themselves.
    out = completed.stdout
    table, meaning, next_steps = (
        out.index("tracejudge demo: per agent"),
        out.index("What the numbers mean"),
        out.index("What to try next"),
    )
    assert table < meaning < next_steps
    for name, _ in WHAT_THE_NUMBERS_MEAN:
        assert f"{name}: " in out[meaning:next_steps], name
    for command in ("tracejudge broker", "tracejudge consume", "tracejudge demo --serve", "tracejudge calibrate"):
        assert command in out[next_steps:], command
    assert "scripted judge the verdicts are each scenario's intended label" in out[meaning:next_steps]
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


def test_closing_text_explains_every_number_the_demo_prints() -> None:
    explained = {name for name, _ in WHAT_THE_NUMBERS_MEAN}
    assert set(SUMMARY_COLUMNS) - {"agent"} <= explained
    assert {"verdicts", "judge calls / cost"} <= explained  # the verdict table and the judge line
    assert "intended label" not in closing_text(scripted=False)  # a real judge's verdicts are not called scripted
    # The rubric weights quoted are the judges' own.
    from tracejudge.metrics.conversational_flow import CONVERSATIONAL_FLOW_WEIGHTS

    flow = dict(WHAT_THE_NUMBERS_MEAN)["flow score"]
    for label, weight in CONVERSATIONAL_FLOW_WEIGHTS.items():
        assert f"{label} {weight}" in flow, label


def test_suggested_commands_parse_with_the_real_cli() -> None:
    """Each `tracejudge SUB ...` it suggests is accepted by the CLI's parser (`broker` once that command is merged)."""
    parser = build_parser()
    subcommands = next(a for a in parser._actions if a.dest == "command").choices
    suggested = [
        re.sub(r"\s+#.*$", "", line).rstrip(" \\")
        for _, commands in TRY_NEXT
        for line in commands
        if "tracejudge " in line
    ]
    parsed = set()
    for line in suggested:
        words = shlex.split(line)
        words = words[words.index("tracejudge") + 1 :]
        if words[0] in subcommands:
            parser.parse_args(words)
            parsed.add(words[0])
    assert {"demo", "consume", "calibrate"} <= parsed
