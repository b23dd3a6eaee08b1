"""Test-case models, field-compatible with the seeds' `eval_lib` so existing snippets run unchanged."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class EvalTestCase(BaseModel):
    """One turn: what the user said and what the agent answered."""

    model_config = ConfigDict(extra="allow")

    input: str
    actual_output: str | None = None
    expected_output: str | None = None
    retrieval_context: list[str] | None = None
    context: list[str] | None = None
    name: str | None = None


class ConversationalEvalTestCase(BaseModel):
    """A whole multi-turn conversation; the holistic judges read it as one sequence."""

    model_config = ConfigDict(extra="allow")

    turns: list[EvalTestCase] = Field(default_factory=list)
    chatbot_role: str | None = None
    name: str | None = None
