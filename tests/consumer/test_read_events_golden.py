"""Every recorded fixture still reads as it did: the events `read_events` yields for each record (conversation id,
agent, turn text and span fields, end markers, feedback), what it says is unreadable, the text-less model calls it
reports (and what the log line would name), and the exchanges each conversation's turns make, over both routes: the
records as our exporter wrote them and re-cut per trace as the OpenTelemetry Collector writes them.

The golden file was written by the decode path before the lazy hot path replaced it (issue 31), so this compares the
old code's outputs with the new code's over all of them. Regenerate ONLY for a deliberate change of the extraction
rules (and say so in the commit): `.venv/bin/python -m tests.consumer.test_read_events_golden`.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from typing import Any

import pytest

from tests.consumer.test_interop import FIXTURES_DIR, SETUPS, collector_records, records
from tracejudge.consumer.adapters import Convention, ConversationEvent, Turn, present_attributes
from tracejudge.consumer.conversation.reading import read_events
from tracejudge.consumer.conversation.textless import TextlessSpans
from tracejudge.consumer.decode import DEFAULT_MAX_RECORD_BYTES
from tracejudge.consumer.exchanges import exchanges

GOLDEN = FIXTURES_DIR.parent / "read_events_golden.json.gz"
ROUTES = ("exporter", "collector")


class _Recorder(TextlessSpans):
    """What `TextlessSpans.seen` is told, with what its log line would name (service, scope, attributes present)."""

    def __init__(self) -> None:
        super().__init__(lambda convention, outcome: None)
        self.calls: list[dict[str, Any]] = []

    def seen(self, span: Any, convention: Convention, event: ConversationEvent | None) -> None:
        self.calls.append(
            {
                "convention": convention.name,
                "counted": event is not None and event.turn is not None,
                "service": str(span.resource.get("service.name") or "?"),
                "scope": span.scope,
                "present": present_attributes(span),
            }
        )


def _route(setup: str, route: str) -> list[bytes]:
    values = [value for _, value in records(setup)]
    if route == "collector":
        values = [cut for value in values for _, cut in collector_records(value)]
    return values


def _turn(turn: Turn) -> dict[str, Any]:
    return dataclasses.asdict(turn)


def capture(setup: str, route: str) -> dict[str, Any]:
    """What the decode path makes of one fixture over one route."""
    per_record = []
    turns: dict[str, list[Turn]] = {}
    for value in _route(setup, route):
        textless = _Recorder()
        events, failure = read_events(value, max_bytes=DEFAULT_MAX_RECORD_BYTES, textless=textless)
        per_record.append(
            {"events": [dataclasses.asdict(e) for e in events], "failure": failure, "textless": textless.calls}
        )
        for event in events:
            if event.turn is not None:
                turns.setdefault(event.conversation_id, []).append(event.turn)
    return {
        "records": per_record,
        "exchanges": {cid: [_turn(t) for t in exchanges(ts)] for cid, ts in sorted(turns.items())},
    }


def _golden() -> dict[str, Any]:
    return json.loads(gzip.decompress(GOLDEN.read_bytes()))


def test_the_golden_file_covers_every_fixture() -> None:
    assert sorted(_golden()) == sorted(f"{setup}/{route}" for setup in SETUPS for route in ROUTES)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("setup", SETUPS)
def test_read_events_yields_what_it_did(setup: str, route: str) -> None:
    want = _golden()[f"{setup}/{route}"]
    got = json.loads(json.dumps(capture(setup, route)))  # tuples and lists alike, as stored
    assert len(got["records"]) == len(want["records"])
    for index, (new, old) in enumerate(zip(got["records"], want["records"], strict=True)):
        assert new == old, f"record {index}"
    assert got["exchanges"] == want["exchanges"]


def main() -> None:
    out = {f"{setup}/{route}": capture(setup, route) for setup in SETUPS for route in ROUTES}
    data = json.dumps(out, sort_keys=True, ensure_ascii=False).encode()
    GOLDEN.write_bytes(gzip.compress(data, mtime=0))
    print(f"{GOLDEN}: {len(out)} fixture routes, {len(data)} bytes")


if __name__ == "__main__":
    main()
