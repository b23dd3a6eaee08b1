"""Judgements as values: a verdict with a score, or a failure with a reason, never a guessed score."""

from __future__ import annotations

from pydantic import BaseModel, Field

# Why a judgement failed; these strings become the `reason` label of tracejudge_judge_errors_total.
ERROR_TIMEOUT = "timeout"
ERROR_RATE_LIMITED = "rate_limited"
ERROR_SERVER = "server_error"
ERROR_CONNECTION = "connection"
ERROR_INVALID_OUTPUT = "invalid_output"
ERROR_BAD_REQUEST = "bad_request"
ERROR_AUTH = "auth"
ERROR_CLIENT = "client_error"
ERROR_EMPTY_CONVERSATION = "empty_conversation"
ERROR_INTERNAL = "internal"
ERROR_PREPARE_TIMEOUT = "prepare_timeout"  # the transcript (redaction, windowing) was not ready within its deadline


class MetricResult(BaseModel):
    """One metric's judgement of one conversation."""

    name: str
    score: float | None = None
    success: bool = False
    verdict: str | None = None
    reason: str = ""
    evidence: list[str] = Field(default_factory=list)
    failure_mode: str | None = None  # what a failing verdict is about (the judge's taxonomy, or `other`)
    threshold: float
    model: str
    rubric_version: str | None = None  # `{metric}@{12 hex}`: which rubric (prompt, labels, schema) gave the verdict
    # What names the judge in a result id (the judge's `result_key`: a built-in's name, a rubric file's version).
    result_key: str | None = Field(default=None, exclude=True, repr=False)
    cost_usd: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None  # cache reads, part of input_tokens
    cache_write_input_tokens: int | None = None  # written to the provider's cache (Anthropic: 1.25x), part of input
    latency_s: float = 0.0
    attempts: int = 0
    tier: str | None = None  # the service tier that answered: standard, flex or batch
    tier_fallbacks: int = 0  # flex requests refused for capacity and made at the standard tier instead
    error: str | None = None
    error_kind: str | None = None
    # The conversation exactly as the judge was sent it (redacted, windowed: the JSON array between the markers).
    # Kept out of dumps and reprs: it is conversation text; the consumer writes it only with --results-transcript.
    transcript: str | None = Field(default=None, exclude=True, repr=False)

    @property
    def failed(self) -> bool:
        return self.error is not None


class ConversationResult(BaseModel):
    """Every metric's result for one conversation, in the order the metrics were given."""

    index: int
    name: str | None = None
    metrics: list[MetricResult] = Field(default_factory=list)

    @property
    def success(self) -> bool:
        return bool(self.metrics) and all(m.success for m in self.metrics)
