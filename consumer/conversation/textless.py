"""Spans that look like model calls but carry no text: counted by convention and outcome, and said once per service
and instrumentation scope with the attributes they had and what to set, so no conversation vanishes in silence."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ..adapters import Convention, ConversationEvent, present_attributes

logger = logging.getLogger("tracejudge.consumer")
TEXTLESS_OUTCOME_TURN = "counted_as_turn"
TEXTLESS_OUTCOME_NO_ID = "no_conversation_id"
_MAX_TEXTLESS_SOURCES = 1024  # (service, scope) pairs told what to set by name; past that, one rate-limited line


class TextlessSpans:
    def __init__(self, count: Callable[[str, str], None]) -> None:
        self.count = count
        self._textless_told: set[tuple[str, str]] = set()
        self._textless_log = RateLimitedLog(logger, interval_s=60.0)

    def seen(self, span: Any, convention: Convention, event: ConversationEvent | None) -> None:
        """A model-call span without text: counted by convention and outcome, and said once per service and
        instrumentation scope, with the attributes it had and what to set."""
        counted = event is not None and event.turn is not None
        outcome = TEXTLESS_OUTCOME_TURN if counted else TEXTLESS_OUTCOME_NO_ID
        self.count(convention.name, outcome)
        service = str(span.resource.get("service.name") or "?")[:128]
        source = (service, span.scope[:128])
        if source in self._textless_told:
            return
        message = (
            "spans of service %r from instrumentation scope %r (%s conventions) look like model calls but carry no "
            "text%s; attributes present: %s; to put the text on the spans set: %s"
        )
        consequence = (
            ": their conversations end failed/empty_conversation unless other spans carry the text"
            if counted
            else " and no conversation id (set one: see docs/works-with.md)"
        )
        arguments = (
            service,
            span.scope,
            convention.name,
            consequence,
            ", ".join(present_attributes(span)),
            convention.hint,
        )
        if len(self._textless_told) < _MAX_TEXTLESS_SOURCES:
            self._textless_told.add(source)
            logger.warning(message, *arguments)
        else:
            self._textless_log.warning(message, *arguments)
