"""A transcript's identity: the same judged spans give the same id anywhere (live, after a restart, in backfill),
and different transcripts never share one, whether or not their spans carry turn indices."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from ..adapters import Turn

_SEP = b"\x1f"


def content_id(conversation_id: str, exchanges: Sequence[Turn]) -> str:
    """SHA-256 over the conversation id and each exchange's span id, times and text, in order (32 hex digits)."""
    digest = hashlib.sha256(conversation_id.encode("utf-8", "surrogatepass"))
    for turn in exchanges:
        for part in (
            turn.span_id,
            str(turn.start_ns),
            turn.input or "",
            "\x00" if turn.input is None else "",
            turn.output or "",
            "\x00" if turn.output is None else "",
        ):
            digest.update(_SEP)
            digest.update(part.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:32]
