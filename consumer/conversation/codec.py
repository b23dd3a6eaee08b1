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

from .table import ConversationState

UNPACKABLE = (UnicodeEncodeError, OverflowError, msgspec.EncodeError)
_FIELDS = tuple(f.name for f in fields(ConversationState) if f.name != "_dropped")  # the lookup set is derived
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(ConversationState).decode


def pack(state: ConversationState) -> bytes:
    """The state's bytes; raises one of UNPACKABLE for what MessagePack cannot carry."""
    return _encode({name: getattr(state, name) for name in _FIELDS})


def unpack(value: bytes) -> ConversationState:
    state = _decode(value)
    state._dropped = set(state.dropped_span_ids)
    return state
