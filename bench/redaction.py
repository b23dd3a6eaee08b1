"""Cost of the default redactor per turn (user + assistant text), next to rendering the same turn unredacted.

Three turns: prose without digits, a support answer dense with dates, amounts, IDs and one phone number, and the
same answer seen again (the phone parser's per-window cache, as when several metrics render one conversation).
`python -m bench.redaction` prints the figures as JSON.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from bench._stats import Figure, alternate
from tracejudge._shared.redact import _cached_window_phones, redact_pii
from tracejudge.metrics._cases import EvalTestCase
from tracejudge.metrics.transcript import render_transcript

PROSE = (
    "Sure! Here is a short poem about autumn leaves falling softly on the quiet street, golden and red. " * 6,
    "Can you write me a short poem about autumn?",
)
DENSE = (
    "Thanks for your patience. Order #A-48213 was placed on 2024-11-30 at 14:35 for 1,234.56 EUR and shipped with "
    "tracking 1Z999AA10123456784 on 2024-12-01. The carrier reports it at the Leipzig hub (last scan 1733072400). "
    "Expected delivery is 2024-12-04 between 09:00-17:30. If you need anything else, call +49 30 901820 or reply "
    "here. Version 2.14.3 of our app also shows the status under Orders.",
    "Hi, my order #A-48213 from 2024-11-30 hasn't arrived. My e-mail is jane.doe@example.com.",
)
CALLS = 200


def _per_turn(turn: tuple[str, str], *, redact: bool, cold: bool) -> Callable[[], float]:
    case = [EvalTestCase(input=turn[1], actual_output=turn[0])]

    def run() -> float:
        total = 0.0
        for _ in range(CALLS):
            if cold:
                _cached_window_phones.cache_clear()
            start = time.perf_counter()
            render_transcript(case, redactor=redact_pii if redact else None)
            total += time.perf_counter() - start
        return total / CALLS * 1e6

    return run


def run() -> dict[str, object]:
    variants = {
        "prose, unredacted": _per_turn(PROSE, redact=False, cold=True),
        "prose, redacted": _per_turn(PROSE, redact=True, cold=True),
        "dense, unredacted": _per_turn(DENSE, redact=False, cold=True),
        "dense, redacted (first time)": _per_turn(DENSE, redact=True, cold=True),
        "dense, redacted (seen before)": _per_turn(DENSE, redact=True, cold=False),
    }
    figures: dict[str, Figure] = alternate(variants, rounds=5, unit="µs/turn")
    return {"figures": {name: figure.as_dict() for name, figure in figures.items()}, "calls_per_run": CALLS}


if __name__ == "__main__":
    print(json.dumps(run(), indent=2, ensure_ascii=False))
