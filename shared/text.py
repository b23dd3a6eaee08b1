"""Text safe to ship and bounded: valid UTF-8, clipped with a visible marker (tracer, judges and consumer)."""

from __future__ import annotations

__all__ = ["clip", "counted", "valid_unicode"]


def valid_unicode(text: str) -> str:
    """Lone surrogates cannot be encoded as UTF-8 (protobuf, HTTP): replace them instead of failing."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def clip(text: str, limit: int) -> str:
    """At most `limit` characters of `text`, then a marker saying how many were cut (a reader must see the cut)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]} …[{len(text) - limit} characters truncated]"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`1 conversation`, `2 conversations`: a count a user reads."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
