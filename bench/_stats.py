"""Alternating runs and their summary: each figure is the median of at least five runs, with min and max."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Figure:
    name: str
    runs: list[float]
    unit: str

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    def as_dict(self) -> dict[str, object]:
        return {
            "median": self.median,
            "min": min(self.runs),
            "max": max(self.runs),
            "runs": self.runs,
            "unit": self.unit,
        }


def alternate(variants: dict[str, Callable[[], float]], rounds: int = 5, unit: str = "s") -> dict[str, Figure]:
    """Run every variant once per round, rotating the order, so drift hits all of them alike."""
    names = list(variants)
    results: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            results[name].append(variants[name]())
    return {name: Figure(name, runs, unit) for name, runs in results.items()}


def machine() -> dict[str, Any]:
    """The host a run names: its CPU model, cores, Python and platform."""
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
