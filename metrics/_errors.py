"""Errors of the judges, under the project's one root (tracejudge._shared.errors)."""

from __future__ import annotations

from tracejudge._shared.errors import TracejudgeError


class JudgeCallError(TracejudgeError):
    """A judge call failed; `kind` is one of the ERROR_* reasons and says whether a retry can help."""

    def __init__(self, kind: str, message: str, *, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable
        self.retry_after = retry_after
        self.attempts = 0


class InvalidJudgeAnswer(TracejudgeError):
    """The judge answered, but not with a verdict we can accept."""
