"""Judge-quality statistics: confusion matrix, Cohen's kappa, binary rates, and the Rogan–Gladen correction.

Pure Python on counts, importable without LiteLLM: `tracejudge calibrate` measures a judge with these, and the
consumer corrects its live hallucination share with the same numbers read back from the calibration report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any, Literal

Weighting = Literal["unweighted", "linear"]
Z_95 = NormalDist().inv_cdf(0.975)


def confusion_matrix(pairs: Iterable[tuple[str, str]], labels: Sequence[str]) -> list[list[int]]:
    """Counts of (gold, judge) pairs: rows are gold labels, columns judge labels, both in `labels` order."""
    index = {label: i for i, label in enumerate(labels)}
    matrix = [[0] * len(labels) for _ in labels]
    for gold, judged in pairs:
        matrix[index[gold]][index[judged]] += 1
    return matrix


def accuracy(matrix: Sequence[Sequence[int]]) -> float | None:
    total = sum(map(sum, matrix))
    return None if total == 0 else sum(matrix[i][i] for i in range(len(matrix))) / total


def cohen_kappa(matrix: Sequence[Sequence[int]], weighting: Weighting = "unweighted") -> float | None:
    """Cohen's kappa, 1 − observed/expected disagreement; `linear` weights |i − j|/(k − 1) over ordered labels.

    None when chance disagreement is zero (every item in one category for both raters): kappa is undefined there.
    """
    k = len(matrix)
    total = sum(map(sum, matrix))
    if total == 0 or k < 2:
        return None
    rows = [sum(row) for row in matrix]
    columns = [sum(matrix[i][j] for i in range(k)) for j in range(k)]

    def weight(i: int, j: int) -> float:
        if weighting == "linear":
            return abs(i - j) / (k - 1)
        return 0.0 if i == j else 1.0

    observed = sum(weight(i, j) * matrix[i][j] for i in range(k) for j in range(k)) / total
    expected = sum(weight(i, j) * rows[i] * columns[j] for i in range(k) for j in range(k)) / total**2
    if expected == 0:
        return None
    return 1.0 - observed / expected


def _ratio(numerator: int, denominator: int) -> float | None:
    return None if denominator == 0 else numerator / denominator


def binary_stats(matrix: Sequence[Sequence[int]], labels: Sequence[str], positive: str) -> dict[str, Any]:
    """One label against all others: counts, precision, recall (= sensitivity), F1, specificity; None if undefined."""
    p = list(labels).index(positive)
    total = sum(map(sum, matrix))
    tp = matrix[p][p]
    fn = sum(matrix[p]) - tp
    fp = sum(matrix[i][p] for i in range(len(matrix))) - tp
    tn = total - tp - fn - fp
    sensitivity = _ratio(tp, tp + fn)
    return {
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "precision": _ratio(tp, tp + fp),
        "recall": sensitivity,
        "f1": _ratio(2 * tp, 2 * tp + fp + fn),
        "sensitivity": sensitivity,
        "specificity": _ratio(tn, tn + fp),
    }


def rogan_gladen(observed: float, sensitivity: float, specificity: float) -> float:
    """True prevalence from an observed share and the judge's error rates, clipped to [0, 1]."""
    youden = sensitivity + specificity - 1.0
    if youden <= 0:
        raise ValueError("sensitivity + specificity must exceed 1")
    return min(1.0, max(0.0, (observed + specificity - 1.0) / youden))


class CalibrationError(ValueError):
    """A calibration report that cannot correct rates; the message is one line for the command line."""


@dataclass(frozen=True, slots=True)
class HallucinationCalibration:
    """The judge's hallucination confusion counts on a gold set: what the correction and its interval need."""

    tp: int
    fn: int
    tn: int
    fp: int
    source: str = ""

    @property
    def sensitivity(self) -> float:
        return self.tp / (self.tp + self.fn)

    @property
    def specificity(self) -> float:
        return self.tn / (self.tn + self.fp)

    @classmethod
    def from_counts(cls, tp: Any, fn: Any, tn: Any, fp: Any, source: str = "") -> HallucinationCalibration:
        counts = {"tp": tp, "fn": fn, "tn": tn, "fp": fp}
        for name, value in counts.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CalibrationError(f"{source}: hallucination count {name!r} must be a non-negative integer")
        if tp + fn == 0 or tn + fp == 0:
            raise CalibrationError(f"{source}: needs gold items both with and without hallucination")
        calibration = cls(tp, fn, tn, fp, source)
        if calibration.sensitivity + calibration.specificity <= 1.0:
            raise CalibrationError(
                f"{source}: sensitivity {calibration.sensitivity:.3f} + specificity {calibration.specificity:.3f}"
                " <= 1: this judge carries no information about hallucinations"
            )
        return calibration


def load_hallucination_calibration(path: str | Path) -> HallucinationCalibration:
    """Read `metrics.failure_rate.hallucination` {tp, fn, tn, fp} from a `tracejudge calibrate --output` report."""
    source = str(path)
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CalibrationError(f"{source}: cannot read the calibration report: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CalibrationError(f"{source}: not a JSON calibration report: {exc}") from None
    try:
        stats = report["metrics"]["failure_rate"]["hallucination"]
        counts = {name: stats[name] for name in ("tp", "fn", "tn", "fp")}
    except (KeyError, TypeError):
        raise CalibrationError(
            f"{source}: no metrics.failure_rate.hallucination counts (tp, fn, tn, fp); "
            "run `tracejudge calibrate --metrics failure_rate --output` to make one"
        ) from None
    return HallucinationCalibration.from_counts(**counts, source=source)


@dataclass(frozen=True, slots=True)
class CorrectedRate:
    estimate: float
    lower: float
    upper: float


def _adjusted(successes: float, trials: float, z: float) -> tuple[float, float]:
    """Agresti–Coull: (x + z²/2) / (n + z²) and n + z², so zero counts still carry uncertainty."""
    n = trials + z * z
    return (successes + z * z / 2) / n, n


def corrected_rate(positives: int, n: int, calibration: HallucinationCalibration, *, z: float = Z_95) -> CorrectedRate:
    """Rogan–Gladen estimate of the true hallucination share and its delta-method interval.

    The variance adds the window's binomial error and the calibration's own sensitivity and specificity errors:
    Var = [p(1−p)/n + π²·Se(1−Se)/n₊ + (1−π)²·Sp(1−Sp)/n₋] / (Se + Sp − 1)², with p, Se, Sp and the n's
    Agresti–Coull-adjusted; the interval is π ± z·√Var, clipped to [0, 1].
    """
    if n <= 0:
        raise ValueError("the window is empty")
    estimate = rogan_gladen(positives / n, calibration.sensitivity, calibration.specificity)
    p, n_p = _adjusted(positives, n, z)
    se, n_se = _adjusted(calibration.tp, calibration.tp + calibration.fn, z)
    sp, n_sp = _adjusted(calibration.tn, calibration.tn + calibration.fp, z)
    youden = se + sp - 1.0
    if youden <= 0:
        return CorrectedRate(estimate, 0.0, 1.0)
    variance = (
        p * (1 - p) / n_p + estimate**2 * se * (1 - se) / n_se + (1 - estimate) ** 2 * sp * (1 - sp) / n_sp
    ) / youden**2
    half = z * math.sqrt(variance)
    return CorrectedRate(estimate, max(0.0, estimate - half), min(1.0, estimate + half))


def proportion_interval(successes: int, n: int, *, z: float = Z_95) -> CorrectedRate:
    """A share and its Agresti–Coull 95 % interval (the adjustment the corrected rates use), clipped to [0, 1]."""
    if n <= 0:
        raise ValueError("no observations")
    p, n_adjusted = _adjusted(successes, n, z)
    half = z * math.sqrt(p * (1 - p) / n_adjusted)
    return CorrectedRate(successes / n, max(0.0, p - half), min(1.0, p + half))
