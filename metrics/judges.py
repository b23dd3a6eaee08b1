"""Which judges exist: the two built-ins and the team's rubric files, by name.

Every command builds its judges from here (`judge_classes`), so a rubric file's judge and a built-in are looked up,
validated and constructed the same way. A file is read once per content: the classes are kept by path, modification
time and size, so validating the options and building the judges read it once, and an edited file is read again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ._judge import HolisticJudgeMetric
from .conversational_flow import ConversationalFlowRateMetric
from .failure_rate import FailureRateMetric
from .rubric import RubricError, RubricMetric, load_rubrics

BUILTIN_JUDGES: dict[str, type[HolisticJudgeMetric]] = {
    FailureRateMetric.name: FailureRateMetric,
    ConversationalFlowRateMetric.name: ConversationalFlowRateMetric,
}

_LOADED: dict[tuple[tuple[str, int, int], ...], dict[str, type[RubricMetric]]] = {}


def _stamp(path: str) -> tuple[str, int, int]:
    try:
        status = os.stat(path)
    except OSError:
        return (path, -1, -1)  # load_rubrics says what is wrong with it
    return (path, status.st_mtime_ns, status.st_size)


def file_judges(paths: Sequence[str]) -> dict[str, type[RubricMetric]]:
    """The judges of the rubric files, by name; RubricError (one line) for a bad file or a taken name."""
    if not paths:
        return {}
    key = tuple(_stamp(str(path)) for path in paths)
    classes = _LOADED.get(key)
    if classes is None:
        classes = load_rubrics([str(path) for path in paths], taken=BUILTIN_JUDGES)
        if len(_LOADED) > 64:
            _LOADED.clear()
        _LOADED[key] = classes
    return classes


def judge_classes(paths: Sequence[str] = ()) -> dict[str, type[HolisticJudgeMetric]]:
    """Every judge that can run with these rubric files: the built-ins first, then the files' in their order."""
    return {**BUILTIN_JUDGES, **file_judges(paths)}


def result_keys(paths: Sequence[str], names: Sequence[str]) -> dict[str, str]:
    """What names each judge in its result ids: a built-in's name, a rubric file's version (so an edited rubric
    re-judges and an unchanged one never pays twice)."""
    classes = judge_classes(paths)
    return {name: _key(classes.get(name), name) for name in names}


def _key(cls: type[HolisticJudgeMetric] | None, name: str) -> str:
    if cls is not None and issubclass(cls, RubricMetric):
        return cls.key()
    return name


def labels_of(paths: Sequence[str] = ()) -> dict[str, tuple[str, ...]]:
    """Each judge's verdict labels, by judge name."""
    return {name: tuple(cls.weights) for name, cls in judge_classes(paths).items()}


__all__ = ["BUILTIN_JUDGES", "RubricError", "file_judges", "judge_classes", "labels_of", "result_keys"]
