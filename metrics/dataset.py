"""A `tracejudge export` dataset read back as test cases: one JSON line per conversation, shaped as the seeds'
`ConversationalEvalTestCase` (`name`, `turns` of `input`/`actual_output`) plus the verdict it was exported for.

`load_conversations(path)` is the one call; eval_lib's own class reads the same lines
(`ConversationalEvalTestCase(**json.loads(line))`: it ignores the extra keys, ours keeps them as attributes).
"""

from __future__ import annotations

from pathlib import Path

from tracejudge._shared.errors import TracejudgeError

from ._cases import ConversationalEvalTestCase

__all__ = ["DatasetLineError", "load_conversations"]


class DatasetLineError(TracejudgeError, ValueError):
    """A line that is not an exported conversation: its file and line number say which."""


def load_conversations(path: str | Path) -> list[ConversationalEvalTestCase]:
    """Every conversation of an export, in file order; each keeps the exported keys as attributes (`verdict`,
    `metric`, `reason`, `evidence`, `model`, `rubric_version`, `result_id`, `trace_id`, `results`, ...)."""
    cases = []
    with Path(path).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                cases.append(ConversationalEvalTestCase.model_validate_json(line))
            except ValueError as exc:
                raise DatasetLineError(f"{path}:{number}: not an exported conversation: {exc}") from None
    return cases
