"""Labelled conversations in the calibrate format (JSON Lines: id, turns, labels, note), shared by `tracejudge
calibrate` and the consumer's canary; the built-in gold set ships in `tracejudge.metrics` (data/)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from tracejudge.metrics import ConversationalEvalTestCase, EvalTestCase
from tracejudge.metrics.calibration import Weighting
from tracejudge.metrics.conversational_flow import CONVERSATIONAL_FLOW_WEIGHTS
from tracejudge.metrics.failure_rate import FAILURE_RATE_WEIGHTS

BUILTIN_DATASET = "calibration_gold.jsonl"
# Labels in their rubric order; Flow's levels are ordered best to worst, so its kappa is linearly weighted.
LABELS: dict[str, tuple[str, ...]] = {
    "failure_rate": tuple(FAILURE_RATE_WEIGHTS),
    "conversational_flow": tuple(
        sorted(CONVERSATIONAL_FLOW_WEIGHTS, key=CONVERSATIONAL_FLOW_WEIGHTS.__getitem__)[::-1]
    ),
}
KAPPA_WEIGHTING: dict[str, Weighting] = {"failure_rate": "unweighted", "conversational_flow": "linear"}


def labels_with(judge_files: list[str] | tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    """The built-ins' labels and each rubric file's judge's, in its file's order (its kappa is unweighted: a file's
    labels say nothing of an order)."""
    if not judge_files:
        return dict(LABELS)
    from tracejudge.metrics.judges import file_judges

    return {**LABELS, **{name: tuple(cls.weights) for name, cls in file_judges(list(judge_files)).items()}}


def judge_name(value: str) -> str:
    """An argparse type: a judge's name as any judge may have it (a built-in or a rubric file's)."""
    import argparse
    import re

    from tracejudge.metrics.rubric import NAME_PATTERN

    if not re.fullmatch(NAME_PATTERN, value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a judge name ({NAME_PATTERN}), e.g. failure_rate")
    return value


def unknown_verdicts(
    verdicts: set[str] | frozenset[str], metrics: list[str] | None, labels: dict[str, tuple[str, ...]]
) -> tuple[list[str], set[str]]:
    """Verdicts no judge named (else: no judge known) can give, and the verdicts known. A judge named that is not
    known (a rubric file's, read from the results topic without its file) may give any label-like verdict."""
    if metrics and any(metric not in labels for metric in metrics):
        return [], set()
    known = {label for metric in (metrics or labels) for label in labels[metric]}
    return sorted(set(verdicts) - known), known


class DatasetError(ValueError):
    def __init__(self, source: str, line: int | None, message: str) -> None:
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")
        self.line = line


@dataclass(frozen=True, slots=True)
class GoldItem:
    id: str
    turns: tuple[tuple[str, str], ...]
    labels: dict[str, str]
    note: str | None = None
    line: int = 0

    def case(self) -> ConversationalEvalTestCase:
        return ConversationalEvalTestCase(
            name=self.id, turns=[EvalTestCase(input=user, actual_output=assistant) for user, assistant in self.turns]
        )


@dataclass(slots=True)
class Dataset:
    items: list[GoldItem]
    sha256: str
    source: str
    builtin: bool = False


def builtin_dataset_bytes() -> bytes:
    return resources.files("tracejudge.metrics").joinpath("data", BUILTIN_DATASET).read_bytes()


def _parse_item(raw: str, line: int, source: str, known: dict[str, tuple[str, ...]]) -> GoldItem:
    def fail(message: str) -> DatasetError:
        return DatasetError(source, line, message)

    try:
        entry = json.loads(raw)
    except ValueError as exc:
        raise fail(f"invalid JSON: {exc}") from None
    if not isinstance(entry, dict):
        raise fail("expected a JSON object")
    item_id = entry.get("id")
    if isinstance(item_id, int) and not isinstance(item_id, bool):
        item_id = str(item_id)
    if not isinstance(item_id, str) or not item_id.strip():
        raise fail("'id' must be a non-empty string")
    turns = entry.get("turns")
    if not isinstance(turns, list) or not turns:
        raise fail(f"item {item_id!r} has no turns")
    parsed: list[tuple[str, str]] = []
    for number, turn in enumerate(turns, 1):
        if (
            not isinstance(turn, dict)
            or not isinstance(turn.get("user"), str)
            or not isinstance(turn.get("assistant"), str)
        ):
            raise fail(f'item {item_id!r} turn {number}: expected {{"user": str, "assistant": str}}')
        parsed.append((turn["user"], turn["assistant"]))
    labels = entry.get("labels", {})
    if labels is None:
        labels = {}
    if not isinstance(labels, dict):
        raise fail(f"item {item_id!r}: 'labels' must be an object")
    labels = {metric: label for metric, label in labels.items() if label is not None}  # null: not labelled
    for metric, label in labels.items():
        if metric not in known:
            raise fail(f"item {item_id!r}: unknown metric {metric!r} in labels; known: {', '.join(known)}")
        if label not in known[metric]:
            raise fail(f"item {item_id!r}: unknown {metric} label {label!r}; known: {', '.join(known[metric])}")
    note = entry.get("note")
    if note is not None and not isinstance(note, str):
        raise fail(f"item {item_id!r}: 'note' must be a string")
    return GoldItem(item_id, tuple(parsed), dict(labels), note, line)


def parse_dataset(data: bytes, source: str, labels: dict[str, tuple[str, ...]] | None = None) -> list[GoldItem]:
    """Every line validated before anything is judged; the first bad line raises DatasetError with its number.
    `labels`: each judge's labels a line may carry (default the built-ins'; `labels_with` adds rubric files')."""
    known = LABELS if labels is None else labels
    try:
        text = data.decode("utf-8-sig")  # a BOM from Windows editors is not an error
    except UnicodeDecodeError as exc:
        raise DatasetError(source, text_line(data, exc.start), "not UTF-8") from None
    items: list[GoldItem] = []
    seen: dict[str, int] = {}
    # Lines end at "\n" only (JSON Lines): str.splitlines() would also split inside a string at U+2028, U+0085 etc.
    for line, raw in enumerate(text.split("\n"), 1):
        if not raw.strip():
            continue
        item = _parse_item(raw, line, source, known)
        if item.id in seen:
            raise DatasetError(source, line, f"duplicate id {item.id!r} (first on line {seen[item.id]})")
        seen[item.id] = line
        items.append(item)
    if not items:
        raise DatasetError(source, None, "the dataset has no conversations")
    return items


def text_line(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def load_dataset(path: str | None, labels: dict[str, tuple[str, ...]] | None = None) -> Dataset:
    if path is None:
        data = builtin_dataset_bytes()
        source, builtin = f"built-in gold set ({BUILTIN_DATASET})", True
    else:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise DatasetError(path, None, f"cannot read the dataset: {exc.strerror or exc}") from None
        source, builtin = path, False
    return Dataset(parse_dataset(data, source, labels), hashlib.sha256(data).hexdigest(), source, builtin)
