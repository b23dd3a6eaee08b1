"""One adapter per span convention: each turns a decoded span into a conversation event, or nothing."""

from __future__ import annotations

from ..decode import DecodedSpan
from . import genai, openinference, openllmetry
from ._base import ConversationEvent, Feedback, Turn

ADAPTERS = (genai.extract, openinference.extract, openllmetry.extract)

__all__ = ["ADAPTERS", "ConversationEvent", "Feedback", "Turn", "extract"]


def extract(span: DecodedSpan) -> ConversationEvent | None:
    """The first adapter that recognises the span wins; other spans are skipped cheaply."""
    for adapter in ADAPTERS:
        event = adapter(span)
        if event is not None:
            return event
    return None
