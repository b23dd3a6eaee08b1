"""A record's bytes → conversation events. Nothing a record contains may raise out of here: an undecodable record
is one reason, a span that fails to adapt costs only itself (the others still come out, with the reason)."""

from __future__ import annotations

from ..adapters import ConversationEvent, classify, extract, may_matter, textless_model_call, trace_contexts
from ..decode import MalformedRecord, decode_record
from .textless import TextlessSpans


def read_events(
    value: bytes | None, *, max_bytes: int, textless: TextlessSpans | None = None
) -> tuple[list[ConversationEvent], str | None]:
    """The record's events and, when it is (partly) unreadable, why; model-call spans without text go to
    `textless` (counted and said). What each span is and where it goes is worked out once (`classify`); a record
    that holds nothing for a conversation (`may_matter`: an HTTP span from the Collector) is parsed, not read."""
    try:
        spans = decode_record(value, max_bytes=max_bytes, relevant=may_matter)
        if not spans:
            return [], None
        classified = [classify(span) for span in spans]
        # A span without an id goes with the conversation its trace names; a lone span's trace names only its own.
        traces = trace_contexts(spans, classified) if len(spans) > 1 else {}
    except MalformedRecord as exc:
        return [], str(exc)
    except Exception as exc:  # RecursionError (deep nesting), OverflowError, TypeError, ...
        return [], f"undecodable: {exc!r}"[:300]
    events: list[ConversationEvent] = []
    failure: Exception | None = None
    for facts in classified:
        span = facts.span
        try:
            event = extract(span, traces, facts)
            if textless is not None:
                convention = textless_model_call(span, event, facts)
                if convention is not None:
                    textless.seen(span, convention, event)
        except Exception as exc:  # one bad span never costs the rest of the record
            failure = failure or exc
            continue
        if event is not None:
            events.append(event)
    return events, None if failure is None else f"a span could not be read: {failure!r}"[:300]
