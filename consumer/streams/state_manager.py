"""The state manager (Kafka Streams' ProcessorStateManager): a task's local store, its restore from the changelog,
its checkpoint.

Restoration is decided and applied here, in one place: `restore_records` takes what the stream thread read of a
restoring task's changelog, `complete_restorations` decides, task by task, whether its changelog was read to its end
(then loads it and makes it active) or its store cannot be trusted (then replaces the task); the stream thread only
resumes the input partitions of the tasks it returns.

A task's store is trusted only with a fresh checkpoint (the changelog offset it reflects); then restoration reads
the changelog from there on, else the store is wiped and the changelog is read from its start. The store gets a
state only after the changelog acknowledged it, and the checkpoint moves only once the store holds every state the
changelog has, so store and checkpoint stay a valid restore point. A store that fails (a full disk) is counted and
said; its conversations stay in memory.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

from tracejudge._shared.rate_limited_log import RateLimitedLog

from ..conversation.store import LocalStore, StoreError, tagged
from ..conversation.store import activity_ms as stored_activity_ms
from ..conversation.store import decode as store_decode
from ..conversation.table import OPEN, ConversationState, ConversationTable, MemoryBound
from ..settings import Settings
from . import records as R
from .instruments import StreamsInstruments
from .state_directory import StateDirectory
from .state_failures import StateFailures
from .task import Task

logger = logging.getLogger("tracejudge.consumer.streams")
# A checkpointed store older than this is not trusted (the changelog keeps tombstones a day by default:
# delete.retention.ms), so a conversation forgotten meanwhile cannot come back from the store.
STORE_TRUST_S = 86_400.0


class StateManager:
    """The tasks' local stores under --state-dir; driven by the stream thread only."""

    def __init__(self, settings: Settings, memory: MemoryBound, instruments: StreamsInstruments) -> None:
        self.settings = settings
        self.memory = memory
        self.instruments = instruments
        self.directory = StateDirectory(settings.state_dir, settings.group_id, settings.group_instance_id)
        self.failures = StateFailures(instruments, settings.state_dir)
        self._unreadable_log = RateLimitedLog(logger, interval_s=10.0)

    def new_table(self, store: LocalStore | None = None) -> ConversationTable:
        """A task's table: the settings' rules, the process's memory bound, `store` to spill to (none: memory only)."""
        return ConversationTable.from_settings(self.settings, self.memory, store)

    def new_task(self, partition: int) -> Task:
        """A task with its local store and, when the store has a checkpoint, the changelog read from there on."""
        store: LocalStore | None = None
        try:
            store = self.directory.open_store(partition)
        except (StoreError, OSError) as exc:
            self.failures.store_failed(exc, partition)
        checkpoint = self.directory.read_checkpoint(partition) if store is not None else None
        if store is not None and checkpoint is not None and self._stale(partition):
            # Older than the changelog keeps tombstones (delete.retention.ms, a day by default) or than the state
            # retention: a conversation forgotten meanwhile may have no tombstone left to replay over the store.
            logger.info("local store of partition %d is older than its checkpoint may be trusted: restoring", partition)
            self.directory.clear_checkpoint(partition)
            checkpoint = None
        if store is not None and checkpoint is None:
            try:  # a store without a (fresh) checkpoint may hold anything: the changelog restores it from the start
                store.wipe()
            except StoreError as exc:  # what it holds cannot be trusted: the task runs from memory and the changelog
                self.failures.store_failed(exc, partition)
                store.close()
                store = None
        task = Task(partition, self.new_table(store), store=store)
        if checkpoint is not None:
            task.start_from_checkpoint(int(checkpoint["changelog"]), checkpoint.get("positions") or {})
        return task

    def _stale(self, partition: int) -> bool:
        age = self.directory.checkpoint_age_s(partition)
        return age is not None and age > min(self.settings.state_retention, STORE_TRUST_S)

    def distrust_store(self, task: Task, end: int) -> Task:
        """The store's checkpoint is past the changelog's end (the topic was recreated): a new task over the wiped
        store, restored from the changelog's start."""
        logger.warning(
            "partition %d: the local store's checkpoint (changelog offset %s) is past the changelog's end (%d):"
            " restoring from the changelog's start",
            task.partition,
            task.checkpointed,
            end,
        )
        assert task.store is not None
        task.store.wipe()
        self.directory.clear_checkpoint(task.partition)
        return Task(task.partition, self.new_table(task.store), store=task.store, restore_started=task.restore_started)

    @staticmethod
    def close_task(task: Task) -> None:
        task.table.close()
        if task.store is not None:
            task.store.close()

    def close(self) -> None:
        self.directory.close()

    # -- restoration -----------------------------------------------------------------------------------------------

    def restore_records(self, task: Task, records: Sequence[Any]) -> None:
        """A batch of the restoring task's changelog records, read in order."""
        if not task.restoring or not records:
            return
        self.instruments.restored.inc(len(records))
        for record in records:
            self.restore(task, record)
        task.changelog_read(records[-1].offset + 1)

    def restore(self, task: Task, record: Any) -> None:
        """One changelog record: positions are taken at once, a state kept raw until the restore ends."""
        kind = R.kind_of(record.headers)
        try:
            if kind == R.POSITIONS:
                task.restore_positions(R.loads(record.value))
            elif kind in R.STATES and record.key is not None:
                task.restore_state(record.key, kind, record.value)
        except Exception as exc:  # a changelog record we cannot read costs that conversation, never the partition
            self.instruments.unreadable_internal.labels(topic="changelog").inc()
            self._unreadable_log.warning(
                "unreadable changelog record at %d/%d, skipped: %r (does another program write to the changelog?)",
                record.partition,
                record.offset,
                exc,
            )

    def complete_restorations(
        self, tasks: MutableMapping[int, Task], changelog_end: Callable[[int], int | None]
    ) -> list[Task]:
        """Each restoring task of `tasks` whose changelog (`changelog_end(partition)`: its end offset, None while
        unknown) was read to its end is loaded and made active; returned, so its input partition resumes. A task
        whose store's checkpoint is past the changelog's end (the topic was recreated) is replaced in `tasks` by one
        restoring from the changelog's start."""
        done: list[Task] = []
        for task in list(tasks.values()):
            if not task.restoring:
                continue
            end = changelog_end(task.partition)
            if end is not None and task.checkpointed is not None and task.checkpointed > end:
                tasks[task.partition] = self.distrust_store(task, end)
                continue
            if end is None or task.changelog_position < end:
                continue
            elsewhere = sum(other.table.resident_open_count for other in tasks.values() if other is not task)
            self.finish_restore(task, end, elsewhere)
            done.append(task)
        return done

    def finish_restore(self, task: Task, end: int, open_elsewhere: int) -> None:
        """The changelog was read to `end`: the restored states into the table (`open_elsewhere`: open conversations
        other tasks hold in memory, under the same --max-open-conversations), the checkpoint moved to the end."""
        self._load_restored(task, open_elsewhere)
        task.activate()
        task.table.restored(stored=task.table.store is not None)  # restored state is in the changelog (and store)
        if task.table.store is not None and task.changelog_position != task.checkpointed:
            task.acknowledged(task.changelog_position)
            self.checkpoint(task)  # the store now reflects the changelog to its end
        task.table.take_dispatches()
        elapsed = time.monotonic() - task.restore_started
        self.instruments.restore_seconds.observe(elapsed)
        logger.info(
            "partition %d restored: %d conversations (%d on disk) from changelog records %d..%d in %.2fs%s",
            task.partition,
            len(task.table),
            task.table.spilled_count,
            task.checkpointed or 0,
            end,
            elapsed,
            " (the local store's checkpoint)" if task.checkpointed else "",
        )

    def _load_restored(self, task: Task, open_elsewhere: int) -> None:
        """The restored states into the table, each decoded once (its latest record). With a local store: the
        changelog's tail goes into the store, then the store into the table, in memory up to the bounds."""
        restored = task.take_restored()
        collecting = gc.isenabled()
        gc.disable()  # decoding makes no cycles; the collector's passes over the growing heap cost ~4x the decode
        try:
            if task.store is not None and self._store_tail(task, restored):
                if task.checkpointed is None:  # the store was wiped: it now holds what was read, still in memory
                    self._load_changelog(task, open_elsewhere, restored)
                else:
                    self._load_store(task, open_elsewhere)
                return
            if task.store is not None:  # the tail could not be stored: the store's older states, then the tail
                self._load_store(task, open_elsewhere)
                task.table.store = None  # nothing may leave memory for a store that lacks the tail
            for key, (kind, value) in restored.items():
                cid = key.decode("utf-8", "surrogatepass")
                try:
                    task.table.restore(None if value is None else R.decode_state(kind, value), cid)
                except Exception as exc:  # an unreadable state costs that conversation, never the partition
                    self.failures.unreadable("changelog state", cid, exc)
        finally:
            if collecting:
                # Not gc.freeze()/unfreeze() to skip the young passes over what was loaded: that is process-wide, and
                # would move the other threads' cyclic garbage of the same moments to the oldest generation with it.
                gc.enable()

    def _store_tail(self, task: Task, restored: dict[bytes, tuple[str | None, bytes | None]]) -> bool:
        assert task.store is not None
        puts: list[tuple[str, bytes]] = []
        deletes: list[str] = []
        for key, (kind, value) in restored.items():
            cid = key.decode("utf-8", "surrogatepass")
            if value is None:
                deletes.append(cid)
            else:
                puts.append((cid, tagged(kind == R.STATE_PACKED, value)))
        try:
            task.store.write(puts, deletes)
            return True
        except StoreError as exc:
            task.store_wrote(False)
            self.failures.store_failed(exc, task.partition)
            return False

    def _load_changelog(
        self, task: Task, open_elsewhere: int, restored: dict[bytes, tuple[str | None, bytes | None]]
    ) -> None:
        """The whole changelog was read into a wiped store: the table loads the states read rather than reading
        the store back (the same states, without a second pass over RocksDB and a second decode)."""
        values: dict[str, tuple[str | None, bytes]] = {}
        order: list[tuple[int, str]] = []
        for key, (kind, value) in restored.items():
            if value is None:  # forgotten: nothing to load
                continue
            cid = key.decode("utf-8", "surrogatepass")
            try:
                order.append((R.state_activity_ms(kind, value), cid))
            except Exception as exc:  # an unreadable state costs that conversation, never the partition
                self.failures.unreadable("changelog state", cid, exc)
                continue
            values[cid] = (kind, value)

        def read(cid: str) -> ConversationState:
            kind, value = values.pop(cid)
            return R.decode_state(kind, value)

        self._load_ordered(task, open_elsewhere, order, read)

    def _load_store(self, task: Task, open_elsewhere: int) -> None:
        """Every conversation of the store into the table: in memory while the process is within its bounds. The
        values the ordering pass read are kept, as many as the memory bound's room, rather than read again from
        RocksDB one by one in activity order; the rest are read back."""
        assert task.store is not None
        store = task.store
        order: list[tuple[int, str]] = []
        kept: dict[str, bytes] = {}
        room = self.memory.max_bytes - self.memory.used
        for cid, value in store.items():
            try:
                order.append((stored_activity_ms(value), cid))
            except Exception as exc:  # an unreadable state costs that conversation, never the partition
                self.failures.unreadable("stored state", cid, exc)
                continue
            if room > 0:
                kept[cid] = value
                room -= len(value)

        def read(cid: str) -> ConversationState | None:
            value = kept.pop(cid, None)
            return store.get(cid) if value is None else store_decode(value)

        self._load_ordered(task, open_elsewhere, order, read)

    def _load_ordered(
        self,
        task: Task,
        open_elsewhere: int,
        order: list[tuple[int, str]],
        read: Callable[[str], ConversationState | None],
    ) -> None:
        """In activity order (RocksDB iterates by id): the table's idle scan, retention and spilling read it as the
        least recently active first. The order was read from each state's activity fields only; `read` decodes
        each state whole, once."""
        settings = self.settings
        order.sort()
        for _, cid in order:
            try:
                state = read(cid)
            except Exception as exc:
                self.failures.unreadable("state", cid, exc)
                continue
            if state is None:
                continue
            resident = not self.memory.over and (
                state.status != OPEN
                or open_elsewhere + task.table.resident_open_count < settings.max_open_conversations
            )
            task.table.restore(state, cid, resident=resident)

    # -- writes after a commit's changelog writes ------------------------------------------------------------------

    def store_changes(self, task: Task, encoded: dict[str, tuple[str, bytes | None]]) -> None:
        """The changes the changelog acknowledged, and any the store missed before, into the local store."""
        if task.store is None or task.table.store is None:
            return
        for state in task.table.unstored():
            if state.id not in encoded:
                encoded[state.id] = R.encode_state(state)
        for cid in task.table.unstored_removed():  # deletions a failed write missed (a later state wins)
            encoded.setdefault(cid, (R.STATE_PACKED, None))
        if not encoded:
            return
        puts = [(cid, tagged(kind == R.STATE_PACKED, value)) for cid, (kind, value) in encoded.items() if value]
        try:
            task.store.write(puts, [cid for cid, (_, value) in encoded.items() if value is None])
        except StoreError as exc:
            task.store_wrote(False)
            self.failures.store_failed(exc, task.partition)
            return
        if task.store_wrote(True):
            logger.info("partition %d: the local store under --state-dir writes again", task.partition)
        task.table.stored(encoded)

    def checkpoint(self, task: Task) -> None:
        """The changelog position the store now reflects, once it holds every state the changelog has."""
        table = task.table
        if task.store is None or task.store_failing or task.changelog_acked is None:
            return
        if table.unstored() or table.unstored_removed():
            return
        try:
            self.directory.write_checkpoint(task.partition, task.changelog_acked, task.positions())
        except OSError as exc:
            self.failures.store_failed(exc, task.partition)
