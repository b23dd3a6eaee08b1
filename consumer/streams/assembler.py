"""The assembler: span records in, conversations as durable state, completed conversations out to the judge queue.

One thread (the stream thread) owns three Kafka clients: the group consumer of the input topic (cooperative-sticky,
optionally static membership), a manually assigned consumer for the internal repartition and changelog partitions
of the tasks it owns, and a producer. Owning input partition p makes this process the owner of state partition p
(a task): the conversations whose id hashes to p, fed by p's own records and by repartition partition p.

- Routing. A record's events whose conversation hashes to the partition they were read from (our exporter keys by
  conversation id) are applied at once; the others (the Collector keys by trace id) go to their owner through the
  repartition topic, with the record's timestamp.
- Restoration. A newly assigned task is paused, its changelog read to the end (latest state per conversation,
  tombstones, the positions record) and only then are its records processed.
- Commit (every commit interval, on revocation and at shutdown), in Kafka Streams' order: flush the producer (the
  forwarded events and judge jobs are acknowledged), write every changed conversation and the task's positions to
  the changelog and flush again, then commit the input offsets. A crash anywhere in between replays records since
  the last commit into restored state, where a span already seen is a duplicate: at-least-once, never a fragment.
- Completion by the conversation's own clock: a task's clock is the highest record timestamp it has read, or the wall
  time at which a fetch answered after the last check found nothing left to read (`_probe_caught_up`); a
  lagging, paused or rebalancing task never makes its conversations idle, and a stale high watermark never
  passes for "caught up".
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafka import AsyncConsumerRebalanceListener, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.errors import KafkaTimeoutError
from kafka.structs import OffsetAndMetadata

from tracejudge._shared.rate_limited_log import RateLimitedLog
from tracejudge._shared.text import clip

from ..adapters import ConversationEvent
from ..conversation.job import MAX_FIELD_CHARS, JudgeJob
from ..conversation.reading import read_events
from ..conversation.store import LocalStore, StoreError, tagged
from ..conversation.store import decode as store_decode
from ..conversation.table import COMPLETED, OPEN, ConversationState, ConversationTable, MemoryBound
from ..conversation.textless import TextlessSpans
from ..emit import KafkaWriter
from ..emit.prometheus import ConsumerInstruments
from ..settings import Settings
from . import records as R
from .instruments import StreamsInstruments
from .membership import close_leaving, guard_membership
from .partitioner import state_partition
from .probe import forget_highwater, restore_highwater
from .state_directory import StateDirectory
from .topics import InternalTopics

logger = logging.getLogger("tracejudge.consumer.streams")
FUTURE_SLACK_MS = 5 * 60 * 1000  # a record stamped further ahead than this (a producer's bad clock) is not believed
WATERMARK_INTERVAL_S = 0.5
ANSWER_WAIT_MS = 3_000  # no fetch answer for a dropped high watermark this long: an incremental session left it out
FETCH_WAIT_MS = 1_000  # a fetch in flight when a high watermark is dropped was answered at most this long before


ROUTED_RECORD_BYTES = 512 * 1024
PRODUCER_BATCH_BYTES = 256 * 1024
# A checkpointed store older than this is not trusted (the changelog keeps tombstones a day by default:
# delete.retention.ms), so a conversation forgotten meanwhile cannot come back from the store.
STORE_TRUST_S = 86_400.0
RESTORE_RECORDS = 10_000  # records a poll of the changelog may return: restoration reads in bulk
RESTORE_FETCH_BYTES = 8 * 1024 * 1024  # per partition and fetch (kafka-python's default is 1 MiB)


def _clipped(event: ConversationEvent) -> dict[str, Any]:
    """An event as routed: its text clipped as the table would clip it (a routed record stays small)."""
    data = R.event_to_json(event)
    turn = data.get("turn")
    if turn is not None:
        for side in ("input", "output"):
            if turn.get(side) is not None:
                turn[side] = clip(turn[side], MAX_FIELD_CHARS)
    feedback = data.get("feedback")
    if feedback is not None and feedback.get("comment") is not None:
        feedback["comment"] = clip(feedback["comment"], 1_000)
    return data


def _chunks(events: list[dict[str, Any]]) -> list[bytes]:
    """Routed events in records of at most ROUTED_RECORD_BYTES (one event a record at the very least)."""
    out: list[bytes] = []
    batch: list[dict[str, Any]] = []
    size = 0
    for event in events:
        encoded = len(R.dumps(event))
        if batch and size + encoded > ROUTED_RECORD_BYTES:
            out.append(R.dumps({"events": batch}))
            batch, size = [], 0
        batch.append(event)
        size += encoded
    if batch:
        out.append(R.dumps({"events": batch}))
    return out


def _acknowledged(task: Task, meta: Any) -> None:
    offset = getattr(meta, "offset", None)
    if isinstance(offset, int) and offset >= 0:
        task.changelog_acked = max(task.changelog_acked or 0, offset + 1)


def wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class Task:
    """State partition p owned here: its table, where its sources stand, its clock."""

    partition: int
    table: ConversationTable
    restoring: bool = True
    restore_started: float = field(default_factory=time.monotonic)
    changelog_position: int = 0
    changelog_end: int | None = None
    repartition_position: int = 0
    input_position: int | None = None  # next input offset to process (None: nothing read since assignment)
    committed_input: int | None = None
    watermark_ms: int = 0
    caught_up_ms: int = 0  # wall time by which a fresh fetch found nothing in the input partition left to read
    highwater_dropped_ms: int | None = None  # when the group consumer's remembered high watermark was dropped
    highwater_seen: int | None = None  # the last high watermark a fetch answered (for the lag gauge)
    unflushed: dict[str, ConversationState | None] = field(default_factory=dict)
    # While restoring: the changelog's latest record per conversation (kind, value), decoded once at the end (a
    # state the changelog holds several times, not compacted yet, is read once).
    restored: dict[bytes, tuple[str | None, bytes | None]] = field(default_factory=dict)
    store: LocalStore | None = None  # the local store on disk (None: it could not be opened; memory only)
    store_failing: bool = False  # its last write failed (a full disk): no checkpoint until one succeeds
    checkpointed: int | None = None  # the changelog offset the store was restored from (its checkpoint)
    changelog_acked: int | None = None  # next offset after this task's last acknowledged changelog write
    positions_dirty: bool = False
    reported: dict[str, int] = field(default_factory=dict)  # table counts already exported
    sources: dict[int, int] = field(default_factory=dict)  # input partition → its routed watermark (ms)


class Assembler(AsyncConsumerRebalanceListener):
    def __init__(
        self,
        settings: Settings,
        prometheus: ConsumerInstruments,
        instruments: StreamsInstruments,
        select: Callable[[JudgeJob], bool],
        *,
        partitions: int,
        consumer_factory: Callable[..., KafkaConsumer] = KafkaConsumer,
        producer_factory: Callable[..., KafkaProducer] = KafkaProducer,
    ) -> None:
        self.settings = settings
        self.prometheus = prometheus
        self.instruments = instruments
        self.select = select
        self.partitions = partitions
        self.topics = InternalTopics(settings.group_id)
        self.memory = MemoryBound(settings.max_state_bytes)
        self.tasks: dict[int, Task] = {}
        self.consumer_factory = consumer_factory
        self.producer_factory = producer_factory
        self.group: KafkaConsumer | None = None
        self.side: KafkaConsumer | None = None
        self.producer: KafkaProducer | None = None
        self.dead_letter: KafkaWriter | None = None
        self._send_failed = False
        self._flush_timed_out = False
        self._stop = threading.Event()
        self.assigned = threading.Event()  # set once partitions were assigned and restored (ready)
        self._side_assignment: set[TopicPartition] = set()
        self._side_owners: dict[TopicPartition, int] = {}
        self._malformed_log = RateLimitedLog(logger, interval_s=10.0)
        self.textless = TextlessSpans(prometheus.record_textless_span)
        self._send_log = RateLimitedLog(logger, interval_s=10.0)
        self._lag_reported: set[int] = set()
        self._last_watermarks = 0.0
        self._last_probe = 0.0
        self.state_dir = StateDirectory(settings.state_dir, settings.group_id, settings.group_instance_id)
        self._store_log = RateLimitedLog(logger, interval_s=30.0)
        self._bound_log = RateLimitedLog(logger, interval_s=30.0)

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def _new_producer(self) -> KafkaProducer:
        settings = self.settings
        # Large batches: a commit writes its changed conversations in a burst, and kafka-python wakes its sender
        # each time a send opens a new batch (per record, with 2 KiB states in the default 16 KiB batches).
        config: dict[str, Any] = {
            "bootstrap_servers": settings.bootstrap_servers,
            "client_id": "tracejudge-state",
            "acks": "all",
            "linger_ms": 5,
            "batch_size": PRODUCER_BATCH_BYTES,
        }
        return self.producer_factory(**{**config, **settings.producer_config()})

    def _renew_producer(self) -> None:
        """A send failed for good: a fresh producer (an idempotent producer whose id the brokers forgot, e.g. after
        they lost their state, fails every later send with InitProducerId errors and never recovers)."""
        old = self.producer
        self.producer = self._new_producer()
        if old is not None:
            try:
                old.close(timeout=0)
            except Exception as exc:
                logger.warning("closing the failed producer: %r", exc)

    def open(self) -> None:
        settings = self.settings
        common = settings.consumer_config()
        group_config: dict[str, Any] = {
            "bootstrap_servers": settings.bootstrap_servers,
            "group_id": settings.group_id,
            "client_id": "tracejudge-assembler",
            "enable_auto_commit": False,
            "auto_offset_reset": settings.start_from,
            "max_poll_records": 500,
            "partition_assignment_strategy": [CooperativeStickyAssignor],
            **common,
        }
        if settings.group_instance_id:
            group_config["group_instance_id"] = settings.group_instance_id
        self.producer = self._new_producer()
        side_config = {k: v for k, v in common.items() if k not in ("group_id", "group_instance_id")}
        self.side = self.consumer_factory(
            bootstrap_servers=settings.bootstrap_servers,
            client_id="tracejudge-restore",
            enable_auto_commit=False,
            group_id=None,
            auto_offset_reset="earliest",
            max_poll_records=RESTORE_RECORDS,
            **{"max_partition_fetch_bytes": RESTORE_FETCH_BYTES, "fetch_max_wait_ms": 50, **side_config},
        )
        self.group = self.consumer_factory(**group_config)
        guard_membership(self.group)
        self.group.subscribe([settings.topic], listener=self)
        if settings.dead_letter_topic:
            self.dead_letter = KafkaWriter(
                settings.bootstrap_servers,
                settings.dead_letter_topic,
                on_error=lambda: self.prometheus.record_output_error("dead_letter"),
                **settings.producer_config(),
            ).start()

    def step(self) -> None:
        """One round of the stream thread: poll, restore, process, complete, dispatch, maybe commit."""
        assert self.group is not None and self.side is not None
        restoring = any(task.restoring for task in self.tasks.values())
        batches = self.group.poll(timeout_ms=0 if restoring else 100, max_records=500)
        self._sync_side()
        for tp, records in batches.items():
            task = self.tasks.get(tp.partition)
            if task is None or task.restoring:
                self.group.seek(tp, records[0].offset)  # read again once restored
                continue
            for record in records:
                self._input(task, record)
            task.input_position = records[-1].offset + 1
            task.positions_dirty = True
        wait = 0 if batches else 50
        side = self.side.poll(timeout_ms=wait, max_records=RESTORE_RECORDS) if self._side_assignment else {}
        for tp, records in side.items():
            task = self.tasks.get(tp.partition)
            if task is None:
                continue
            if tp.topic == self.topics.changelog:
                if task.restoring:
                    self.instruments.restored.inc(len(records))
                    for record in records:
                        self._restore(task, record)
                    task.changelog_position = records[-1].offset + 1
            elif not task.restoring:
                for record in records:
                    self._repartitioned(task, record)
                task.repartition_position = records[-1].offset + 1
                task.positions_dirty = True
        self._finish_restores()
        self._probe_caught_up()
        self._advance()
        self._bound_open()
        self._bound_memory()
        self._dispatch()
        self._broadcast_watermarks()

    def close(self, grace_s: float) -> None:
        """Commit what is done, then leave the group (`membership`): the partitions move at once, restored by their next
        owner from what was just committed."""
        try:
            offsets = self._flush(set(self.tasks))
            if offsets and self.group is not None:
                self.group.commit(offsets)
        except Exception as exc:
            logger.warning("final commit failed (records since the last commit are read again): %r", exc)
        for client in (self.group, self.side):
            try:
                if client is self.group and client is not None:
                    close_leaving(client)  # LeaveGroup: its partitions move at once
                elif client is not None:
                    client.close(autocommit=False)
            except Exception as exc:
                logger.warning("closing a consumer: %r", exc)
        if self.producer is not None:
            try:
                self.producer.close(timeout=max(0.5, grace_s))
            except Exception as exc:
                logger.warning("closing the producer: %r", exc)
        if self.dead_letter is not None:
            self.dead_letter.close(max(0.5, grace_s))
        for task in self.tasks.values():
            self._close_task(task)
        self.state_dir.close()

    # -- rebalance (kafka-python's IO thread, while the stream thread waits in poll()) -------------------------------

    def _mine(self, partitions: Any) -> set[int]:
        return {tp.partition for tp in partitions if tp.topic == self.settings.topic}

    async def on_partitions_assigned(self, assigned: Any) -> None:
        mine = self._mine(assigned)
        if not mine:
            return
        assert self.group is not None
        self.group.pause(*[TopicPartition(self.settings.topic, p) for p in mine])  # processed once restored
        for partition in mine:
            self.tasks[partition] = self._new_task(partition)
        logger.info("partitions assigned: %s (restoring their state)", sorted(mine))

    async def on_partitions_revoked(self, revoked: Any) -> None:
        mine = self._mine(revoked) & set(self.tasks)
        if not mine:
            return
        assert self.group is not None
        try:
            offsets = self._flush(mine, timeout_s=5.0, revoking=True)  # the new owner restores what we flush now
            if offsets:
                await self.group.commit_async(offsets)
        except Exception as exc:
            logger.warning("commit on revocation failed (the new owner re-reads from the last commit): %r", exc)
        self._drop(mine)
        logger.info("partitions revoked: %s (state handed over through the changelog)", sorted(mine))

    async def on_partitions_lost(self, lost: Any) -> None:
        mine = self._mine(lost) & set(self.tasks)
        self._drop(mine)  # evicted: a commit would be refused; the new owner restores the last flushed state
        if mine:
            logger.warning("partitions lost: %s (the new owner restores their last committed state)", sorted(mine))

    def _drop(self, partitions: set[int]) -> None:
        for partition in partitions:
            task = self.tasks.pop(partition, None)
            if task is not None:
                self._close_task(task)
        self.prometheus.forget_partitions(partitions)
        self._lag_reported -= partitions

    # -- the stream thread -----------------------------------------------------------------------------------------

    def _table(self, store: LocalStore | None = None) -> ConversationTable:
        settings = self.settings
        return ConversationTable(
            idle_timeout_s=settings.session_idle_timeout,
            max_turns=settings.max_turns_per_conversation,
            max_bytes=settings.max_conversation_bytes,
            retention_s=settings.state_retention,
            end_grace_s=settings.end_grace,
            memory=self.memory,
            store=store,
        )

    def _new_task(self, partition: int) -> Task:
        """A task with its local store and, when the store has a checkpoint, the changelog read from there on."""
        store: LocalStore | None = None
        try:
            store = self.state_dir.open_store(partition)
        except (StoreError, OSError) as exc:
            self._store_failed(exc, partition)
        task = Task(partition, self._table(store), store=store)
        checkpoint = self.state_dir.read_checkpoint(partition) if store is not None else None
        if store is not None and checkpoint is not None and self._stale(partition):
            # Older than the changelog keeps tombstones (delete.retention.ms, a day by default) or than the state
            # retention: a conversation forgotten meanwhile may have no tombstone left to replay over the store.
            logger.info("local store of partition %d is older than its checkpoint may be trusted: restoring", partition)
            self.state_dir.clear_checkpoint(partition)
            checkpoint = None
        if store is not None and checkpoint is None:
            try:  # a store without a (fresh) checkpoint may hold anything: the changelog restores it from the start
                store.wipe()
            except StoreError as exc:
                self._store_failed(exc, partition)
        if checkpoint is not None:
            task.changelog_position = task.checkpointed = int(checkpoint["changelog"])
            positions = checkpoint.get("positions") or {}
            task.repartition_position = int(positions.get("repartition") or 0)
            task.watermark_ms = int(positions.get("watermark") or 0)
            task.sources = {int(k): int(v) for k, v in (positions.get("sources") or {}).items()}
        return task

    def _stale(self, partition: int) -> bool:
        age = self.state_dir.checkpoint_age_s(partition)
        return age is not None and age > min(self.settings.state_retention, STORE_TRUST_S)

    def _close_task(self, task: Task) -> None:
        task.table.close()
        if task.store is not None:
            task.store.close()

    def _store_failed(self, exc: BaseException, partition: int) -> None:
        reason = exc.reason if isinstance(exc, StoreError) else "io"
        self.instruments.store_errors.labels(reason=reason).inc()
        self._store_log.warning(
            "partition %d: the local store under --state-dir %s failed (%s): %s. Its conversations stay in memory,"
            " and past --max-open-conversations / --max-state-bytes the least recently active complete early"
            " (completed_by=memory_bound); free space on that volume or grow it (docs/state.md, the local store)",
            partition,
            self.settings.state_dir,
            reason,
            exc,
        )

    def _sync_side(self) -> None:
        """The manual consumer reads the changelog of restoring tasks and the repartition topic of active ones."""
        assert self.side is not None
        wanted: dict[TopicPartition, int] = {}
        for task in self.tasks.values():
            if task.restoring:
                wanted[TopicPartition(self.topics.changelog, task.partition)] = task.changelog_position
            else:
                wanted[TopicPartition(self.topics.repartition, task.partition)] = task.repartition_position
        owners = {tp: id(self.tasks[tp.partition]) for tp in wanted}
        if set(wanted) == self._side_assignment and owners == self._side_owners:
            return
        # A partition whose task changed (lost and assigned again within one poll) is sought too: assign() keeps
        # the old position of a partition that stays assigned, and a restore must start at the beginning.
        moved = {tp for tp in wanted if tp not in self._side_assignment or self._side_owners.get(tp) != owners[tp]}
        self.side.assign(list(wanted))
        for tp in moved:
            self.side.seek(tp, wanted[tp])
        self._side_assignment = set(wanted)
        self._side_owners = owners

    def _restore(self, task: Task, record: Any) -> None:
        """One changelog record: positions are taken at once, a state kept raw until the restore ends."""
        kind = R.kind_of(record.headers)
        try:
            if kind == R.POSITIONS:
                positions = R.loads(record.value)
                task.repartition_position = int(positions["repartition"])
                task.watermark_ms = max(task.watermark_ms, int(positions.get("watermark", 0)))
                for source, ms in (positions.get("sources") or {}).items():
                    task.sources[int(source)] = max(task.sources.get(int(source), 0), int(ms))
            elif kind in R.STATES and record.key is not None:
                task.restored[record.key] = (kind, record.value)
        except Exception as exc:  # a changelog record we cannot read costs that conversation, never the partition
            logger.warning("unreadable changelog record at %d/%d: %r", record.partition, record.offset, exc)

    def _load_restored(self, task: Task) -> None:
        """The restored states into the table, each decoded once (its latest record). With a local store: the
        changelog's tail goes into the store, then the store into the table, in memory up to the bounds."""
        restored, task.restored = task.restored, {}
        collecting = gc.isenabled()
        gc.disable()  # decoding makes no cycles; the collector's passes over the growing heap cost ~4x the decode
        try:
            if task.store is not None and self._store_tail(task, restored):
                self._load_store(task)
                return
            if task.store is not None:  # the tail could not be stored: the store's older states, then the tail
                self._load_store(task)
                task.table.store = None  # nothing may leave memory for a store that lacks the tail
            for key, (kind, value) in restored.items():
                cid = key.decode("utf-8", "surrogatepass")
                try:
                    task.table.restore(None if value is None else R.decode_state(kind, value), cid)
                except Exception as exc:  # an unreadable state costs that conversation, never the partition
                    logger.warning("unreadable changelog state of conversation %r: %r", cid, exc)
        finally:
            if collecting:
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
            task.store_failing = True
            self._store_failed(exc, task.partition)
            return False

    def _load_store(self, task: Task) -> None:
        """Every conversation of the store into the table: in memory while the process is within its bounds."""
        assert task.store is not None
        settings = self.settings
        # In activity order (RocksDB iterates by id): the table's idle scan, retention and spilling read it as the
        # least recently active first. One pass keeps only ids and times; the second reads each state again.
        order: list[tuple[int, str]] = []
        for cid, value in task.store.items():
            try:
                state = store_decode(value)
            except Exception as exc:  # an unreadable state costs that conversation, never the partition
                logger.warning("unreadable stored state of conversation %r: %r", cid, exc)
                continue
            order.append(((state.completed_ms or state.last_ms) if state.status != OPEN else state.last_ms, cid))
        order.sort()
        for _, cid in order:
            try:
                found = task.store.get(cid)
            except Exception as exc:
                logger.warning("unreadable stored state of conversation %r: %r", cid, exc)
                continue
            if found is None:
                continue
            state = found
            resident = not self.memory.over and (
                state.status != OPEN or self._resident_open() < settings.max_open_conversations
            )
            task.table.restore(state, cid, resident=resident)

    def _resident_open(self) -> int:
        return sum(task.table.resident_open_count for task in self.tasks.values())

    def _finish_restores(self) -> None:
        assert self.side is not None and self.group is not None
        for task in self.tasks.values():
            if not task.restoring:
                continue
            tp = TopicPartition(self.topics.changelog, task.partition)
            end = self.side.highwater(tp)
            if end is not None and task.checkpointed is not None and task.checkpointed > end:
                self._distrust_store(task, end)  # a changelog younger than the store (the topic was recreated)
                continue
            if end is None or task.changelog_position < end:
                continue
            self._load_restored(task)
            task.restoring = False
            task.table.restored(stored=task.table.store is not None)  # restored state is in the changelog (and store)
            if task.table.store is not None and task.changelog_position != task.checkpointed:
                task.changelog_acked = task.changelog_position
                self._checkpoint(task)  # the store now reflects the changelog to its end
            task.table.take_dispatches()
            elapsed = time.monotonic() - task.restore_started
            self.instruments.restore_seconds.observe(elapsed)
            self.group.resume(TopicPartition(self.settings.topic, task.partition))
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
        if self.tasks and not any(task.restoring for task in self.tasks.values()):
            self.assigned.set()

    def _distrust_store(self, task: Task, end: int) -> None:
        logger.warning(
            "partition %d: the local store's checkpoint (changelog offset %s) is past the changelog's end (%d):"
            " restoring from the changelog's start",
            task.partition,
            task.checkpointed,
            end,
        )
        assert task.store is not None
        task.store.wipe()
        self.state_dir.clear_checkpoint(task.partition)
        fresh = Task(task.partition, self._table(task.store), store=task.store)
        fresh.restore_started = task.restore_started
        self.tasks[task.partition] = fresh  # a new task: `_sync_side` seeks its changelog partition to 0

    def _timestamp(self, record: Any) -> int:
        now = wall_ms()
        ts = record.timestamp if isinstance(record.timestamp, int) and record.timestamp > 0 else now
        return min(ts, now + FUTURE_SLACK_MS)

    def _input(self, task: Task, record: Any) -> None:
        events, failure = read_events(record.value, max_bytes=self.settings.max_record_bytes, textless=self.textless)
        ts = self._timestamp(record)
        task.watermark_ms = max(task.watermark_ms, ts)
        remote: dict[str, list[ConversationEvent]] = {}
        local = 0
        key = record.key
        for event in events:
            if state_partition(event.conversation_id, self.partitions) == task.partition:
                # In order only if the producer keyed the record by this conversation (our exporter does).
                ordered = key is not None and key == event.conversation_id.encode("utf-8", "surrogatepass")
                failure = self._apply(task, event, ts, ordered=ordered) or failure
                local += 1
            else:
                remote.setdefault(event.conversation_id, []).append(event)
        if local:
            self.instruments.routed.labels(route="local").inc(local)
        for cid, items in remote.items():
            for chunk in _chunks([_clipped(e) for e in items]):  # well under the brokers' 1 MB record limit
                self._send(
                    self.topics.repartition,
                    cid,
                    chunk,
                    R.EVENTS,
                    partition=state_partition(cid, self.partitions),
                    timestamp_ms=ts,
                )
            self.instruments.routed.labels(route="repartition").inc(len(items))
        if failure is not None:
            self._malformed(record, failure)
        else:
            self.prometheus.record_records("ok")

    def _apply(self, task: Task, event: ConversationEvent, ts: int, *, ordered: bool = True) -> str | None:
        try:
            task.table.apply(event, ts, ordered=ordered)
        except Exception as exc:  # nothing a record contains may stop the consumer
            return f"a span could not be folded in: {exc!r}"[:300]
        if event.feedback is not None:  # the judge worker joins feedback to verdicts: same partition, same owner
            state = task.table.get(event.conversation_id)
            known = state.agent if state is not None else None
            agent = event.agent if event.agent_named else (known or event.agent)
            self._send(
                self.topics.judge_queue,
                event.conversation_id,
                R.dumps({"agent": agent, "feedback": R.event_to_json(event)["feedback"]}),
                R.FEEDBACK,
                partition=task.partition,
                timestamp_ms=ts,
            )
        return None

    def _repartitioned(self, task: Task, record: Any) -> None:
        ts = self._timestamp(record)
        kind = R.kind_of(record.headers)
        try:
            value = R.loads(record.value)
            if kind == R.WATERMARK:
                source = int(value["source"])
                task.sources[source] = max(task.sources.get(source, 0), int(value["ms"]))
                return
            cid = record.key.decode("utf-8", "surrogatepass")
            if kind == R.EVENTS:
                # Only routed events carry record time; watermarks and verdict acks are stamped with wall time, and
                # taking theirs would move this clock (and what it broadcasts) past input not yet read.
                task.watermark_ms = max(task.watermark_ms, ts)
                for item in value["events"]:
                    self._apply(task, R.event_from_json(cid, item), ts, ordered=False)
            elif kind == R.VERDICT:
                task.table.verdict(cid, str(value["content_id"]), str(value["outcome"]), ts)
        except Exception as exc:
            logger.warning("unreadable repartition record at %d/%d: %r", record.partition, record.offset, exc)

    def _input_position(self, task: Task) -> int | None:
        assert self.group is not None
        if task.input_position is not None:
            return task.input_position
        try:
            return self.group.position(TopicPartition(self.settings.topic, task.partition), timeout_ms=0)
        except Exception:
            return None

    def _looks_caught_up(self, task: Task) -> bool:
        """By the clients' last fetches (which may be stale): nothing left in the input or repartition partition."""
        assert self.group is not None and self.side is not None
        end = self.group.highwater(TopicPartition(self.settings.topic, task.partition))
        position = self._input_position(task)
        if end is None or position is None or position < end:
            return False
        side_end = self.side.highwater(TopicPartition(self.topics.repartition, task.partition))
        return side_end is None or task.repartition_position >= side_end

    def _probe_caught_up(self) -> None:
        """Every WATERMARK_INTERVAL_S: a task that looks caught up has the high watermark its group consumer remembers
        dropped; once a fetch answered after that brings one back and it is still at the task's position, nothing
        more was in the partition when it was dropped (less a fetch's wait: an answer in flight then is older).
        While the consumer does not fetch (paused, rebalancing, its thread busy) no answer comes, and the clock holds.
        An incremental fetch session (Apache Kafka) leaves an unchanged partition out of its answers: past
        ANSWER_WAIT_MS without one, the last value comes back and counts as an answer (the clock then trusts it, as
        any consumer reading its last fetch would). Where kafka-python keeps the value out of reach, it is taken as
        it is."""
        if time.monotonic() - self._last_probe < WATERMARK_INTERVAL_S:
            return
        self._last_probe = time.monotonic()
        assert self.group is not None
        now = wall_ms()
        for task in self.tasks.values():
            if task.restoring:
                continue
            tp = TopicPartition(self.settings.topic, task.partition)
            position = self._input_position(task)
            end = self.group.highwater(tp)
            if end is None and task.highwater_dropped_ms is not None and task.highwater_seen is not None:
                if now - task.highwater_dropped_ms >= ANSWER_WAIT_MS and restore_highwater(
                    self.group, tp, task.highwater_seen
                ):
                    end = task.highwater_seen
            if end is not None:
                task.highwater_seen = end
            if task.highwater_dropped_ms is not None and end is not None and position is not None and end <= position:
                task.caught_up_ms = max(task.caught_up_ms, task.highwater_dropped_ms - FETCH_WAIT_MS)
            if end is not None and self._looks_caught_up(task):
                if forget_highwater(self.group, tp):
                    task.highwater_dropped_ms = now
                else:
                    task.caught_up_ms = max(task.caught_up_ms, now)
            elif end is not None:
                task.highwater_dropped_ms = None  # records still to read: no claim until caught up again

    def _clock(self, task: Task, now: int) -> int:
        """A task's clock: its highest record timestamp, or the wall time by which a fresh fetch found its input
        partition read to the end (never later than `now`)."""
        return min(now, max(task.watermark_ms, task.caught_up_ms)) if task.caught_up_ms else task.watermark_ms

    def _advance(self) -> None:
        now = wall_ms()
        for task in self.tasks.values():
            if task.restoring:
                continue
            others = [task.sources.get(q, 0) for q in range(self.partitions) if q != task.partition]
            task.table.advance(self._clock(task, now), min(others) if others else None)

    def _broadcast_watermarks(self) -> None:
        """Every other state partition learns how far each of our input partitions has routed its records (as
        Flink's watermarks cross a shuffle): conversations with routed events complete by the slowest source."""
        if self.partitions < 2 or time.monotonic() - self._last_watermarks < WATERMARK_INTERVAL_S:
            return
        self._last_watermarks = time.monotonic()
        now = wall_ms()
        for task in self.tasks.values():
            if task.restoring:
                continue
            value = R.dumps({"source": task.partition, "ms": self._clock(task, now)})
            for target in range(self.partitions):
                if target != task.partition:
                    self._send(self.topics.repartition, R.WATERMARK_KEY, value, R.WATERMARK, partition=target)

    def _spill(self, excess: int, *, open_only: bool) -> int:
        """Up to `excess` clean conversations leave memory for their local stores, from the tables holding the
        most; when every one left is dirty, a commit writes them first (Kafka Streams flushes its record cache when
        full). Returns what is still over."""
        for attempt in range(2):
            holders = [t for t in self.tasks.values() if not t.restoring and t.table.store is not None]
            holders.sort(key=lambda t: t.table.resident_open_count if open_only else len(t.table.states), reverse=True)
            for task in holders:
                if excess <= 0:
                    return 0
                table = task.table
                excess -= table.spill_open(excess) if open_only else table.spill_oldest(excess)
            if excess <= 0 or attempt or not holders:
                return max(excess, 0)
            self.commit()
        return max(excess, 0)

    def _bound_open(self) -> None:
        """Past --max-open-conversations (held in memory), the least recently active open conversations wait in the
        local store. What no store can take (it could not be opened, its disk is full, or a commit failed) completes
        early (`memory_bound`, counted and said): pausing cannot help, since a paused partition's clock stands
        still. Restoring partitions take no part: what they hold is already in the changelog."""
        active = [task for task in self.tasks.values() if not task.restoring]
        excess = sum(task.table.resident_open_count for task in active) - self.settings.max_open_conversations
        if excess <= 0:
            return
        excess = self._spill(excess, open_only=True)
        if excess > 0:
            self._cut("--max-open-conversations", excess)
        while excess > 0 and active:
            busiest = max(active, key=lambda t: t.table.resident_open_count)
            if busiest.table.resident_open_count == 0 or not busiest.table.complete_oldest(busiest.watermark_ms):
                return
            excess -= 1

    def _cut(self, bound: str, excess: int) -> None:
        self._bound_log.warning(
            "past %s with %d conversations the local store cannot take (see tracejudge_state_store_errors_total):"
            " the least recently active complete early on the turns read so far (completed_by=memory_bound);"
            " free space under --state-dir, or raise the bound",
            bound,
            excess,
        )

    def _bound_memory(self) -> None:
        """Past --max-state-bytes, process-wide: the oldest clean conversations leave memory for the local store
        (completed first). Without a store to take them, as before it: the oldest completed conversation of any
        partition is forgotten first, then the least recently active open ones complete (`memory_bound`, counted),
        to be forgotten in turn once they were dispatched."""
        active = [task for task in self.tasks.values() if not task.restoring]
        while self.memory.over and active:
            if self._spill(64, open_only=False) < 64:
                continue
            break
        if self.memory.over and active:
            self._cut("--max-state-bytes", 1)
        while self.memory.over and active:
            kept = [(t.table.oldest_completed_ms(), t) for t in active]
            candidates = [(ms, t) for ms, t in kept if ms is not None]
            if candidates:
                min(candidates, key=lambda c: c[0])[1].table.forget_oldest_completed()
                continue
            busiest = max(active, key=lambda t: t.table.open_count)
            if busiest.table.open_count == 0 or not busiest.table.complete_oldest(busiest.watermark_ms):
                return

    def _dispatch(self) -> None:
        for task in self.tasks.values():
            if task.restoring:
                continue
            for dispatch in task.table.take_dispatches():
                job = dispatch.job
                sampled = self.select(job)
                self._send(
                    self.topics.judge_queue,
                    job.conversation_id,
                    R.dumps(R.job_to_json(job, sampled=sampled, completed_ms=dispatch.completed_ms)),
                    R.JOB,
                    partition=task.partition,
                    timestamp_ms=dispatch.completed_ms,
                )
                self.instruments.completed.labels(completed_by=job.completed_by).inc()

    def _send(
        self, topic: str, key: str | bytes, value: bytes | None, kind: str, *, acked: Task | None = None, **kwargs: Any
    ) -> None:
        """`acked`: the task whose `changelog_acked` follows this record's acknowledgement."""
        assert self.producer is not None
        raw_key = key if isinstance(key, bytes) else key.encode("utf-8", "surrogatepass")
        try:
            future = self.producer.send(topic, key=raw_key, value=value, headers=R.header(kind), **kwargs)
        except Exception as exc:
            self._send_error(topic, exc)
            return
        producer = self.producer  # a renewed producer's aborted sends were already recovered from
        future.add_errback(lambda exc: self._send_error(topic, exc) if producer is self.producer else None)
        if acked is not None:
            future.add_callback(lambda meta: _acknowledged(acked, meta))

    def _send_error(self, topic: str, exc: BaseException) -> None:
        self._send_failed = True
        output = "changelog" if topic == self.topics.changelog else "internal_topics"
        self.prometheus.record_output_error(output)
        self._send_log.warning(
            "writing to internal topic %s failed: %r (nothing is committed past it; check the brokers)", topic, exc
        )

    def _malformed(self, record: Any, reason: str) -> None:
        self.prometheus.record_records("malformed")
        self._malformed_log.warning(
            "malformed record at partition %d offset %d: %s", record.partition, record.offset, reason
        )
        if self.dead_letter is not None:
            headers = [
                ("tracejudge.error", reason.encode("utf-8", "replace")[:1000]),
                ("tracejudge.source", f"{record.topic}/{record.partition}/{record.offset}".encode()),
            ]
            self.dead_letter.write(record.key, record.value or b"", headers)

    # -- commit ----------------------------------------------------------------------------------------------------

    def _flush(
        self, partitions: set[int], timeout_s: float = 30.0, *, revoking: bool = False
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """Make the tasks' progress durable; returns the input offsets that may now be committed (empty if not).

        Three acknowledged steps, in Kafka Streams' order: what the records caused (routed events, judge jobs), then
        the changed conversations, then the positions; a positions record is never durable before the states it
        covers. `_send_failed` is process-wide and cleared only once every active task was recovered from it: a send
        that failed between two commits (synchronously, or behind a flush that timed out) is never forgotten, also
        when a revocation flushes only some partitions (revoked tasks are dropped, not recovered: the new owner
        re-reads from the last commit)."""
        assert self.producer is not None
        tasks = [self.tasks[p] for p in sorted(partitions) if p in self.tasks and not self.tasks[p].restoring]
        if not tasks:
            return {}
        if not self._flushed(timeout_s):
            return {}
        if self._send_failed:
            if revoking:
                return {}
            self._send_failed = False
            self._renew_producer()
            for task in [t for t in self.tasks.values() if not t.restoring]:
                self._recover(task)
            return {}
        written: dict[int, dict[str, tuple[str, bytes | None]]] = {}
        for task in tasks:
            changed, removed = task.table.take_changes()
            for state in changed:
                task.unflushed[state.id] = state
            for cid in removed:
                task.unflushed[cid] = None
            encoded = written[task.partition] = {}
            for cid, unflushed in task.unflushed.items():
                kind, value = (R.STATE_PACKED, None) if unflushed is None else R.encode_state(unflushed)
                encoded[cid] = (kind, value)
                self._send(self.topics.changelog, cid, value, kind, partition=task.partition)
        if not self._flushed(timeout_s) or self._failed_again(revoking):
            return {}  # the changes stay unflushed and go out again at the next commit
        for task in tasks:
            self._store_changes(task, written[task.partition])  # after the changelog has them, as Kafka Streams
            if task.unflushed:
                task.positions_dirty = True
            task.unflushed.clear()
            if task.positions_dirty:
                self._send(
                    self.topics.changelog,
                    R.POSITIONS_KEY,
                    R.dumps(self._positions(task)),
                    R.POSITIONS,
                    partition=task.partition,
                    acked=task,
                )
        if not self._flushed(timeout_s) or self._failed_again(revoking):
            return {}
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for task in tasks:
            if task.positions_dirty:
                self._checkpoint(task)
            task.positions_dirty = False
            if task.input_position is not None and task.input_position != task.committed_input:
                offsets[TopicPartition(self.settings.topic, task.partition)] = OffsetAndMetadata(
                    task.input_position, "", -1
                )
        return offsets

    @staticmethod
    def _positions(task: Task) -> dict[str, Any]:
        return {
            "input": task.input_position,
            "repartition": task.repartition_position,
            "watermark": task.watermark_ms,
            "sources": {str(k): v for k, v in task.sources.items()},
        }

    def _store_changes(self, task: Task, encoded: dict[str, tuple[str, bytes | None]]) -> None:
        """The changes the changelog acknowledged, and any the store missed before, into the local store."""
        if task.store is None or task.table.store is None:
            return
        for state in task.table.unstored():
            if state.id not in encoded:
                encoded[state.id] = R.encode_state(state)
        if not encoded:
            return
        puts = [(cid, tagged(kind == R.STATE_PACKED, value)) for cid, (kind, value) in encoded.items() if value]
        try:
            task.store.write(puts, [cid for cid, (_, value) in encoded.items() if value is None])
        except StoreError as exc:
            task.store_failing = True
            self._store_failed(exc, task.partition)
            return
        task.store_failing = False
        task.table.stored(encoded)

    def _checkpoint(self, task: Task) -> None:
        """The changelog position the store now reflects, once it holds every state the changelog has."""
        if task.store is None or task.store_failing or task.changelog_acked is None or task.table.unstored():
            return
        try:
            self.state_dir.write_checkpoint(task.partition, task.changelog_acked, self._positions(task))
        except OSError as exc:
            self._store_failed(exc, task.partition)

    def _failed_again(self, revoking: bool) -> bool:
        """A changelog write failed: a fresh producer, nothing committed; the writes go out again next time."""
        if not self._send_failed:
            return False
        if not revoking:
            self._send_failed = False
            self._renew_producer()
        return True

    def _flushed(self, timeout_s: float) -> bool:
        """Everything sent is acknowledged (or failed); False when the brokers did not answer in time (an outage:
        nothing is committed, the producer keeps retrying and the next commit tries again)."""
        assert self.producer is not None
        try:
            self.producer.flush(timeout=timeout_s)
        except KafkaTimeoutError:
            self._flush_timed_out = True
            self._send_log.warning(
                "internal topics unacknowledged after %.0fs: nothing is committed until they are (check the brokers)",
                timeout_s,
            )
            return False
        self._flush_timed_out = False
        return True

    def commit(self) -> None:
        assert self.group is not None
        offsets = self._flush(set(self.tasks))
        if not offsets:
            return
        try:
            self.group.commit(offsets)
        except Exception as exc:
            logger.warning("commit failed (will retry): %r", exc)
            return
        for tp, meta in offsets.items():
            task = self.tasks.get(tp.partition)
            if task is not None:
                task.committed_input = meta.offset

    def _recover(self, task: Task) -> None:
        """A write to an internal topic failed for good: rebuild the task from its changelog and its last commit."""
        assert self.group is not None
        tp = TopicPartition(self.settings.topic, task.partition)
        logger.warning("partition %d: an internal write failed; restoring it from the changelog", task.partition)
        self._close_task(task)
        fresh = self._new_task(task.partition)
        self.tasks[task.partition] = fresh
        self.group.pause(tp)
        try:
            committed = self.group.committed(tp)
        except Exception:
            committed = task.committed_input
        if committed is not None:
            self.group.seek(tp, committed)
        else:
            self.group.seek_to_beginning(tp) if self.settings.start_from == "earliest" else self.group.seek_to_end(tp)

    # -- gauges ----------------------------------------------------------------------------------------------------

    def update_gauges(self, *, lag: bool) -> None:
        open_count = sum(task.table.open_count for task in self.tasks.values())
        total = sum(len(task.table) for task in self.tasks.values())
        self.prometheus.sessions_open.set(open_count)
        self.instruments.conversations.labels(status=OPEN).set(open_count)
        self.instruments.conversations.labels(status=COMPLETED).set(total - open_count)
        self.instruments.bytes.set(self.memory.used)
        self.instruments.on_disk.set(sum(task.table.spilled_count for task in self.tasks.values()))
        for task in self.tasks.values():
            for key, count in task.table.counts.items():
                delta = count - task.reported.get(key, 0)
                if delta > 0 and key.startswith("forgotten_"):
                    self.instruments.forgotten.labels(reason=key.removeprefix("forgotten_")).inc(delta)
                task.reported[key] = count
        if not lag or self.group is None:
            return
        for task in self.tasks.values():
            tp = TopicPartition(self.settings.topic, task.partition)
            end = self.group.highwater(tp)
            end = task.highwater_seen if end is None else end  # dropped by `_probe_caught_up`: the last answer
            position = task.input_position
            if position is None:
                try:
                    position = self.group.position(tp, timeout_ms=0)
                except Exception:
                    position = None
            if end is not None and position is not None:
                self.prometheus.set_lag(task.partition, end - position)
                self._lag_reported.add(task.partition)
