"""The local state directory (Kafka Streams' StateDirectory): `<--state-dir>/<group>/<slot>/<partition>/`, a RocksDB
store per state partition and its `.checkpoint` (the changelog position the store reflects, and the partition's
positions as of then).

A slot is this process's own: the `--group-instance-id` (a StatefulSet pod's name: the same disk after a restart),
else the first numbered slot no live process holds (an exclusive `flock`, released when the process dies, kill -9
included), so replicas sharing a disk never share a store and a restart on the same disk takes its store back.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import IO, Any

from ..conversation.store import LocalStore

logger = logging.getLogger("tracejudge.consumer.streams")

CHECKPOINT = ".checkpoint"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class StateDirectory:
    def __init__(self, root: str | Path, group: str, instance: str | None = None) -> None:
        self.group_dir = Path(root) / _UNSAFE.sub("_", group)
        self.slot: Path | None = None
        self._lock: IO[bytes] | None = None
        self._instance = instance

    def lock(self) -> Path:
        """Take this process's slot (created if needed); its path."""
        if self.slot is not None:
            return self.slot
        self.group_dir.mkdir(parents=True, exist_ok=True)
        names = [_UNSAFE.sub("_", self._instance)] if self._instance else []
        names += [str(n) for n in range(1024)]
        for name in names:
            slot = self.group_dir / name
            slot.mkdir(exist_ok=True)
            handle = open(slot / ".lock", "ab")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                continue
            self.slot, self._lock = slot, handle
            return slot
        raise OSError(f"every slot of {self.group_dir} is held by a live process")

    def partition_dir(self, partition: int) -> Path:
        return self.lock() / str(partition)

    def open_store(self, partition: int) -> LocalStore:
        return LocalStore(self.partition_dir(partition) / "rocksdb")

    def read_checkpoint(self, partition: int) -> dict[str, Any] | None:
        """{"changelog": next changelog offset the store lacks, "positions": {...}}, or None (restore from 0)."""
        path = self.partition_dir(partition) / CHECKPOINT
        try:
            data = json.loads(path.read_text())
            int(data["changelog"])
            return data if isinstance(data, dict) else None
        except FileNotFoundError:
            return None
        except Exception as exc:  # unreadable: restored from the changelog's start instead
            logger.warning("unreadable checkpoint %s (restoring from the changelog): %r", path, exc)
            return None

    def write_checkpoint(self, partition: int, changelog: int, positions: dict[str, Any]) -> None:
        """Atomically (write, fsync, rename): a crash leaves the old checkpoint or the new one. Raises OSError."""
        directory = self.partition_dir(partition)
        path, temporary = directory / CHECKPOINT, directory / (CHECKPOINT + ".tmp")
        with open(temporary, "w") as handle:
            json.dump({"changelog": changelog, "positions": positions}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)

    def checkpoint_age_s(self, partition: int) -> float | None:
        """Seconds since the partition's checkpoint was written, or None without one."""
        try:
            return max(0.0, time.time() - (self.partition_dir(partition) / CHECKPOINT).stat().st_mtime)
        except OSError:
            return None

    def clear_checkpoint(self, partition: int) -> None:
        try:
            (self.partition_dir(partition) / CHECKPOINT).unlink()
        except FileNotFoundError:
            pass

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None
            self.slot = None
