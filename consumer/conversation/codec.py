"""A conversation's state as compact bytes: MessagePack through msgspec, written from and read into the dataclasses
themselves (no dicts in between), for the changelog and the local store on disk.

Read ~5x faster than JSON into `ConversationState.from_json` (bench/state_restore.py), at ~85% of its size. Fields
are named, so a state written before a field was added reads with that field's default. MessagePack strings are
UTF-8 and its integers 64-bit: a state whose text holds a lone surrogate, or whose span carries a timestamp past 2**64
(a record may say anything), cannot be packed (`UNPACKABLE`) and is written as JSON.
"""

from __future__ import annotations

from dataclasses import fields

import msgspec

from .table import OPEN, ConversationState

UNPACKABLE = (UnicodeEncodeError, OverflowError, msgspec.EncodeError)
_FIELDS = tuple(f.name for f in fields(ConversationState) if f.name != "_dropped")  # the lookup set is derived
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(ConversationState).decode


class _Activity(msgspec.Struct):
    """The fields a restore orders conversations by: msgspec skips the rest (turns, ids) without building them."""

    last_ms: int
    status: str = OPEN
    completed_ms: int | None = None


_decode_activity = msgspec.msgpack.Decoder(_Activity).decode


def pack(state: ConversationState) -> bytes:
    """The state's bytes; raises one of UNPACKABLE for what MessagePack cannot carry."""
    return _encode({name: getattr(state, name) for name in _FIELDS})


def unpack(value: bytes) -> ConversationState:
    state = _decode(value)
    state.shared_empties()
    return state


def activity_ms(state: ConversationState | _Activity) -> int:
    """When a conversation was last active (record time): completed, when it completed; else its last record."""
    return (state.completed_ms or state.last_ms) if state.status != OPEN else state.last_ms


def checked_activity_ms(state: ConversationState) -> int:
    """`activity_ms` of a state read from JSON, whose fields no schema checked: a time that is not a number makes
    the state unreadable (that conversation, never the partition's restore, which sorts by it)."""
    ms = activity_ms(state)
    if isinstance(ms, bool) or not isinstance(ms, int | float):
        raise TypeError(f"the state's activity time is {ms!r}, not a number")
    return int(ms)


def unpack_activity_ms(value: bytes | memoryview) -> int:
    """`activity_ms` of a packed state, read ~10x faster than `unpack` (a restore orders every state it loads)."""
    return activity_ms(_decode_activity(value))
