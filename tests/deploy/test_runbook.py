"""Every alert tells the responder what it means and where to read what to do: a `description`, and a `runbook_url`
whose anchor is a section of docs/runbook.md that says what it means, what to check and what to do."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "runbook.md"


def alerts() -> list[dict[str, Any]]:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    return [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lowercase, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections() -> dict[str, str]:
    """Anchor → the section's text, for every `## ` heading of the runbook."""
    parts = re.split(r"^## (.+)$", RUNBOOK.read_text(), flags=re.MULTILINE)
    return {github_anchor(parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}


def test_every_alert_has_a_description_and_a_runbook_url_into_docs_runbook() -> None:
    found = sections()
    assert len(alerts()) >= 8
    for alert in alerts():
        annotations = alert["annotations"]
        name = alert["alert"]
        assert len(annotations.get("description", "")) > 20, f"{name} has no description"
        path, _, anchor = annotations.get("runbook_url", "").partition("#")
        assert path == "docs/runbook.md" and (ROOT / path).is_file(), f"{name}: runbook_url {path!r}"
        assert anchor == name.lower(), f"{name}: anchor {anchor!r}"
        assert anchor in found, f"{name}: docs/runbook.md has no section #{anchor}"
        section = found[anchor]
        for part in ("**Means.**", "**Check.**", "**Do.**"):
            assert part in section, f"{name}: its runbook section lacks {part}"


def test_every_alert_section_of_the_runbook_is_an_alert() -> None:
    names = {alert["alert"].lower() for alert in alerts()}
    stale = {anchor for anchor in sections() if anchor.startswith("tracejudge") and anchor not in names}
    assert not stale, f"runbook sections for alerts that no longer exist: {stale}"


def test_the_stall_alert_is_in_the_rules_with_the_exported_metric_names() -> None:
    """TracejudgeJudgeStalled reads what the consumer exports: the judge workers' queue lag, calls in flight and
    answers (outcomes, judge errors), the assemblers' submissions."""
    stalled = next(alert for alert in alerts() if alert["alert"] == "TracejudgeJudgeStalled")
    for name in (
        "tracejudge_judge_queue_lag",
        "tracejudge_judgements_in_flight",
        "tracejudge_conversations_submitted_total",
        "tracejudge_sessions_total",
        "tracejudge_judge_errors_total",
    ):
        assert name in stalled["expr"], name
    assert stalled["labels"]["severity"] == "page"
