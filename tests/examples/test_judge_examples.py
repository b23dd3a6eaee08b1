"""The example rubric files under examples/judges/ are judges as shipped: each loads, `tracejudge consume
--judge-file` accepts it beside the built-ins, and it judges through `evaluate_conversations` as judges.md shows."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tracejudge.consumer.cli.options import settings_from_args
from tracejudge.consumer.cli.parser import build_parser
from tracejudge.consumer.settings import Settings
from tracejudge.metrics import (
    ConversationalEvalTestCase,
    CustomLLMClient,
    EvalTestCase,
    RubricMetric,
    evaluate_conversations,
)
from tracejudge.metrics.rubric import compose_system_prompt, load_rubric

ROOT = Path(__file__).resolve().parents[2]
JUDGES = sorted((ROOT / "examples" / "judges").glob("*.yaml"))


def test_the_documented_examples_are_there() -> None:
    assert {path.name for path in JUDGES} >= {"refund_policy.yaml", "task_completion.yaml"}


@pytest.mark.parametrize("path", JUDGES, ids=lambda p: p.name)
def test_an_example_is_a_judge_consume_accepts(path: Path) -> None:
    rubric = load_rubric(path)
    assert rubric.name == path.stem  # the file is named after its judge, as docs/judges.md advises
    assert rubric.examples and rubric.alert_shares  # what the docs show: few-shot examples and an alert threshold
    prompt = compose_system_prompt(rubric)
    assert all(f'"{label.name}"' in prompt for label in rubric.labels)

    settings = Settings.from_options(judge_files=[str(path)])
    assert settings.metrics == ["failure_rate", "conversational_flow", rubric.name]

    namespace = build_parser().parse_args(["consume", "--judge-file", str(path), "--metrics", rubric.name])
    assert settings_from_args(namespace).metrics == [rubric.name]  # --metrics can leave the built-ins out


def test_both_examples_load_together_as_the_variable_names_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEJUDGE_JUDGE_FILES", ",".join(str(path) for path in JUDGES))
    names = [load_rubric(path).name for path in JUDGES]
    assert Settings.from_options().metrics == ["failure_rate", "conversational_flow", *names]


def test_the_refund_policy_names_what_a_violation_is_about() -> None:
    rubric = load_rubric(ROOT / "examples" / "judges" / "refund_policy.yaml")
    assert [label.name for label in rubric.labels] == ["compliant", "minor_deviation", "violation"]
    assert [label.weight for label in rubric.labels] == [1.0, 0.5, 0.0]
    assert rubric.alert_shares == {"violation": 0.2}
    assert rubric.failing_verdicts == ("violation",)
    assert len(rubric.failure_modes) == 3


class Scripted(CustomLLMClient):
    """A judge model that answers one verdict, as the docs' snippet's model would."""

    def __init__(self, answer: dict[str, object]) -> None:
        self.answer = answer
        self.messages: list[dict[str, str]] = []

    async def chat_complete(self, messages: list[dict[str, str]], temperature: float) -> tuple[str, float | None]:
        self.messages = messages
        return json.dumps(self.answer), 0.0

    def get_model_name(self) -> str:
        return "scripted"


def test_the_refund_policy_judges_through_evaluate_conversations() -> None:
    client = Scripted(
        {
            "verdict": "violation",
            "evidence": ["turn 1: 'refunded to your card today'"],
            "reason": "A refund 45 days after delivery.",
            "failure_mode": "refund_outside_window",
        }
    )
    judge = RubricMetric.from_file(ROOT / "examples" / "judges" / "refund_policy.yaml", client)
    conversation = ConversationalEvalTestCase(
        turns=[
            EvalTestCase(
                input="My order came 45 days ago, can I get my money back?",
                actual_output="Sure, I've refunded it to your card today.",
            )
        ]
    )
    [result] = asyncio.run(evaluate_conversations([conversation], [judge]))
    [verdict] = result.metrics
    assert (verdict.name, verdict.verdict, verdict.score) == ("refund_policy", "violation", 0.0)
    assert verdict.failure_mode == "refund_outside_window"
    assert "30 days" in client.messages[0]["content"]  # the policy is in the system prompt
    assert judge.rubric_version.startswith("refund_policy@1.")
