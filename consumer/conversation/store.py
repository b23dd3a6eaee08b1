"""A state partition's conversations on local disk (RocksDB through rocksdict): where the table's memory bounds send
conversations instead of cutting them, as Kafka Streams keeps a store beyond memory in RocksDB.

The store holds every conversation as of the last commit (the runtime writes each commit's changed conversations
after the changelog acknowledged them, `write`), so a conversation leaves memory only once it is clean, and the store
with a checkpoint of the changelog position is a valid starting point for the next restore on the same disk. Values
are the codec's bytes behind a one-byte tag: MessagePack, or JSON for what MessagePack cannot carry.

Every write error is a `StoreError` (a full disk: `disk_full`): the caller keeps the conversations in memory, counts
and says it; nothing is lost, the changelog still has them. RocksDB refuses every write after one failed ("Writer has
previous error") until it is reopened, and reopening flushes its log, so it fails while the disk is still full: the
next write reopens the store first (at most every `REOPEN_EVERY_S`: each attempt replays RocksDB's log), and until
that succeeds the store is open read-only (conversations on disk are still read back).
"""

from __future__ import annotations

import errno
import json
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from rocksdict import AccessType, Options, Rdict, WriteBatch

from . import codec
from .table import ConversationState

_PACKED, _JSON = b"\x01", b"\x02"
REOPEN_EVERY_S = 5.0
KEEP_INFO_LOGS = 5  # each open rotates RocksDB's LOG; failed reopens on a full disk would leave hundreds


class StoreError(Exception):
    """A write (or open) of the local store failed; `reason` is `disk_full` or `io`."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _reason(exc: BaseException) -> str:
    text = str(exc)
    full = isinstance(exc, OSError) and exc.errno == errno.ENOSPC
    return "disk_full" if full or "No space left" in text or "ENOSPC" in text else "io"


def tagged(packed: bool, payload: bytes) -> bytes:
    """A store value from the codec's bytes (`packed`: MessagePack, else JSON) as the changelog carries them."""
    return (_PACKED if packed else _JSON) + payload


def encode(state: ConversationState) -> bytes:
    try:
        return _PACKED + codec.pack(state)
    except codec.UNPACKABLE:
        data = json.dumps(state.to_json(), separators=(",", ":"), ensure_ascii=False)
        return _JSON + data.encode("utf-8", "surrogatepass")


def decode(value: bytes) -> ConversationState:
    body = memoryview(value)[1:]
    if value[:1] == _PACKED:
        return codec.unpack(bytes(body))
    return ConversationState.from_json(json.loads(bytes(body).decode("utf-8", "surrogatepass")))


def activity_ms(value: bytes) -> int:
    """`codec.activity_ms` of a stored state, without decoding all of a packed one."""
    if value[:1] == _PACKED:
        return codec.unpack_activity_ms(memoryview(value)[1:])
    return codec.checked_activity_ms(decode(value))


def _key(conversation_id: str) -> bytes:
    return conversation_id.encode("utf-8", "surrogatepass")


class LocalStore:
    """One state partition's conversations by id. One thread uses a store (its task's)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = self._open()
        self._broken: StoreError | None = None  # a write failed: RocksDB takes no other before it is reopened
        self._reopened_at = 0.0

    @staticmethod
    def _options() -> Options:
        options = Options(raw_mode=True)
        options.set_keep_log_file_num(KEEP_INFO_LOGS)
        return options

    def _open(self) -> Rdict:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            return Rdict(str(self.path), options=self._options())
        except Exception as exc:
            raise StoreError(f"cannot open the local store at {self.path}: {exc}", _reason(exc)) from exc

    def _reopen(self, failed: StoreError) -> None:
        """After a failed write: open the store again (read-write); while that fails (the disk is still full),
        read-only, so what is on disk is still read back. Between attempts the last error stands."""
        if time.monotonic() - self._reopened_at < REOPEN_EVERY_S:
            raise StoreError(f"{failed} (the store reopens within {REOPEN_EVERY_S:.0f}s)", failed.reason)
        self._reopened_at = time.monotonic()
        try:  # opened first (it takes no lock), so reads never lose a handle
            fallback = Rdict(str(self.path), options=self._options(), access_type=AccessType.read_only())
        except Exception as exc:  # the directory is not even readable now: keep the old handle (reads still work)
            raise StoreError(f"{failed} (reopening it failed too: {exc})", failed.reason) from exc
        self.close()
        try:  # a failed open purges none; a disk gone read-only or failing must not stop the stream thread
            for info_log in sorted(self.path.glob("LOG.old.*"))[:-KEEP_INFO_LOGS]:
                info_log.unlink(missing_ok=True)
        except OSError:
            pass
        try:
            self._db = self._open()
        except StoreError as exc:
            self._broken = exc
            self._db = fallback
            raise
        fallback.close()
        self._broken = None

    def get(self, conversation_id: str) -> ConversationState | None:
        value = self._db.get(_key(conversation_id))
        return None if value is None else decode(value)

    def write(self, puts: Iterable[tuple[str, bytes]], deletes: Iterable[str] = ()) -> None:
        """Encoded states (`encode`) and forgotten ids, in one atomic batch (all or none: a failed one is retried
        whole)."""
        if self._broken is not None:
            self._reopen(self._broken)
        batch = WriteBatch(raw_mode=True)
        for cid, value in puts:
            batch.put(_key(cid), value)
        for cid in deletes:
            batch.delete(_key(cid))
        try:
            self._db.write(batch)
        except Exception as exc:
            self._broken = StoreError(f"writing the local store at {self.path} failed: {exc}", _reason(exc))
            raise self._broken from exc

    def items(self) -> Iterator[tuple[str, bytes]]:
        """Every conversation id and its encoded state."""
        for key, value in self._db.items():
            assert isinstance(key, bytes) and isinstance(value, bytes)
            yield key.decode("utf-8", "surrogatepass"), value

    def close(self) -> None:
        try:
            self._db.close()
        except Exception:  # closing twice, or after the disk went away: nothing left to keep
            pass

    def wipe(self) -> None:
        """Delete everything (a store that cannot be trusted: the changelog restores it from the start)."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self._db = self._open()
        self._broken = None
