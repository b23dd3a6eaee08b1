"""The assembler: the stream thread (Kafka Streams' StreamThread), its poll loop and its rebalance listener.

Span records in, conversations as durable state, completed conversations out to the judge queue. One thread owns
three Kafka clients: the group consumer of the input topic (cooperative-sticky, optionally static membership), a
manually assigned consumer for the internal repartition and changelog partitions of the tasks it owns, and the
record collector's producer. Each round (`step`) polls, restores, processes, completes, dispatches; the pieces are
their own modules, as Kafka Streams separates them:

- `task`: a state partition owned here (its table, where its sources stand);
- `processor`: records into tables, routed to their owner, completions to the judge queue;
- `state_manager`: the local store, restoration from the changelog (a newly assigned task is paused until its
  changelog was read to the end), the checkpoint;
- `clock`: stream time, by which conversations go idle; `bounds`: the memory bounds (spilling to the store);
- `record_collector`: every write to Kafka; `commit`: what is acknowledged before an input offset is committed
  (every commit interval, on revocation and at shutdown).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from ..conversation.job import JudgeJob
from ..conversation.table import MemoryBound
from ..emit.prometheus import ConsumerInstruments
from ..kafka import KafkaClients, KafkaConsumer, OffsetAndMetadata, RebalanceListener, TopicPartition
from ..kafka.membership import close_leaving, guard_membership
from ..kafka.topics import InternalTopics
from ..settings import Settings
from .bounds import MemoryBounds
from .clock import StreamClock
from .commit import Committer
from .instruments import StreamsInstruments
from .processor import Processor
from .record_collector import RecordCollector
from .state_manager import StateManager
from .task import Task, active

logger = logging.getLogger("tracejudge.consumer.streams")
RESTORE_RECORDS = 10_000  # records a poll of the changelog may return: restoration reads in bulk
RESTORE_FETCH_BYTES = 8 * 1024 * 1024  # per partition and fetch (kafka-python's default is 1 MiB)
# How long the brokers hold a fetch of the changelog and repartition partitions with nothing new. Short: kafka-python
# sends no fetch to a broker while one is pending, so a changelog partition assigned to restore waits for the held
# fetch of the idle repartition partitions (0.35-1.35 s at 500 ms on Tansu, 0.11 s at 50 ms).
SIDE_FETCH_WAIT_MS = 50


class Assembler(RebalanceListener):
    """The stream thread: it owns the tasks and the clients; `step` is one round, `commit` one commit."""

    def __init__(
        self,
        settings: Settings,
        prometheus: ConsumerInstruments,
        instruments: StreamsInstruments,
        select: Callable[[JudgeJob], bool],
        *,
        partitions: int,
        clients: KafkaClients | None = None,
    ) -> None:
        self.settings = settings
        self.prometheus = prometheus
        self.instruments = instruments
        self.partitions = partitions
        self.topics = InternalTopics(settings.group_id)
        self.memory = MemoryBound(settings.max_state_bytes)
        self.tasks: dict[int, Task] = {}
        self.clients = clients = clients or KafkaClients.from_settings(settings)
        self.group: KafkaConsumer | None = None
        self.side: KafkaConsumer | None = None
        self.collector = RecordCollector(settings, prometheus, self.topics, clients)
        self.state = StateManager(settings, self.memory, instruments)
        self.processor = Processor(
            self.collector,
            self.topics,
            partitions,
            prometheus,
            instruments,
            select,
            max_record_bytes=settings.max_record_bytes,
        )
        self.clock = StreamClock(
            settings.topic, self.topics.repartition, partitions, instruments.fetch_answer_unreadable
        )
        self.bounds = MemoryBounds(settings.max_open_conversations, self.memory, self.commit)
        self.committer = Committer(settings.topic, self.topics, self.collector, self.state, self._recover_all)
        self._stop = threading.Event()
        self.assigned = threading.Event()  # set once partitions were assigned and restored (ready)
        self._side_assignment: set[TopicPartition] = set()
        self._side_owners: dict[TopicPartition, int] = {}
        self._lag_reported: set[int] = set()
        # What the rebalance listener learned on kafka-python's IO thread, applied by the stream thread (`_rebalanced`)
        # right after the poll that ran it: ("assigned" | "lost", partitions), in the order it came.
        self._rebalances: queue.SimpleQueue[tuple[str, set[int]]] = queue.SimpleQueue()

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def open(self) -> None:
        settings = self.settings
        self.collector.open()
        self.side = self.clients.consumer(
            "tracejudge-restore",
            max_poll_records=RESTORE_RECORDS,
            max_partition_fetch_bytes=RESTORE_FETCH_BYTES,
            fetch_max_wait_ms=SIDE_FETCH_WAIT_MS,
        )
        self.group = self.clients.member(
            "tracejudge-assembler",
            settings.group_id,
            instance_id=settings.group_instance_id,
            auto_offset_reset=settings.start_from,
            max_poll_records=500,
        )
        guard_membership(self.group)
        self.clock.watch(self.group, self.side)
        self.group.subscribe([settings.topic], listener=self)

    def step(self) -> None:
        """One round of the stream thread: poll, restore, process, complete, dispatch, maybe commit."""
        assert self.group is not None and self.side is not None
        restoring = any(task.restoring for task in self.tasks.values())
        batches = self.group.poll(timeout_ms=0 if restoring else 100, max_records=500)
        self._rebalanced()
        self._sync_side()
        for tp, records in batches.items():
            task = self.tasks.get(tp.partition)
            if task is None or task.restoring:
                self.group.seek(tp, records[0].offset)  # read again once restored
                continue
            for record in records:
                self.processor.input(task, record)
            task.input_read(records[-1].offset + 1)
        wait = 0 if batches else 50
        side = self.side.poll(timeout_ms=wait, max_records=RESTORE_RECORDS) if self._side_assignment else {}
        for tp, records in side.items():
            task = self.tasks.get(tp.partition)
            if task is None:
                continue
            if tp.topic == self.topics.changelog:
                self.state.restore_records(task, records)
            elif not task.restoring:
                for record in records:
                    self.processor.repartitioned(task, record)
                task.repartition_read(records[-1].offset + 1)
        self.complete_restorations()
        tasks = self.tasks.values()
        self.clock.probe(tasks, self.group, self.side)
        self.clock.advance(tasks)
        self.bounds.hold_open(tasks)
        self.bounds.hold_bytes(tasks)
        self.processor.dispatch(tasks)
        self.clock.broadcast(tasks, self.collector)
        self.collector.wake()  # once a round: the sends of this round go out (`record_collector.DeferredWakeup`)

    def close(self, grace_s: float) -> None:
        """Commit what is done, then leave the group (`membership`): the partitions move at once, restored by their next
        owner from what was just committed."""
        try:
            self._rebalanced()
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
        self.collector.close(grace_s)
        for task in self.tasks.values():  # closing revoked (and dropped) them already, unless the group was gone
            self.state.close_task(task)
        self.tasks.clear()
        self.state.close()

    # -- rebalance -------------------------------------------------------------------------------------------------
    # The listener runs on kafka-python's IO thread while the stream thread is parked in poll() (or close()) waiting
    # for it. An assignment or a loss is only queued (a newly assigned partition is paused first: the group
    # consumer's fetch state, before its next fetch) and applied by the stream thread right after the poll returns
    # (`_rebalanced`), before it reads anything. A revocation cannot wait for that: kafka-python's poll() goes on
    # polling until its timeout, and so sends the follow-up JoinGroup of a cooperative rebalance in the same call;
    # the revoked partitions would reach their next owner before a deferred flush and commit. So the revocation is
    # applied in the callback, as a synchronous hand-off (as Java's consumer runs the listener on the polling thread):
    # the stream thread is parked until it returns, so no task is ever changed by two threads at once.

    def _mine(self, partitions: Any) -> set[int]:
        return {tp.partition for tp in partitions if tp.topic == self.settings.topic}

    async def on_partitions_assigned(self, assigned: Any) -> None:
        mine = self._mine(assigned)
        if not mine:
            return
        assert self.group is not None
        self.group.pause(*[TopicPartition(self.settings.topic, p) for p in mine])  # processed once restored
        self.clock.forget(mine)  # the IO thread, as the answers: one kept from an earlier ownership is not this one's
        self._rebalances.put(("assigned", mine))

    async def on_partitions_revoked(self, revoked: Any) -> None:
        mine = self._mine(revoked)
        if not mine:
            return
        assert self.group is not None
        self._rebalanced()  # an assignment queued earlier in the same poll: its task exists before it is revoked
        mine &= set(self.tasks)
        if not mine:
            return
        try:
            offsets = self._flush(mine, timeout_s=5.0, revoking=True)  # the new owner restores what we flush now
            if offsets:
                await self.group.commit_async(offsets)  # the IO thread: a blocking commit would wait on itself
        except Exception as exc:
            logger.warning("commit on revocation failed (the new owner re-reads from the last commit): %r", exc)
        self._drop(mine)
        logger.info("partitions revoked: %s (state handed over through the changelog)", sorted(mine))

    async def on_partitions_lost(self, lost: Any) -> None:
        mine = self._mine(lost)
        if mine:
            self._rebalances.put(("lost", mine))

    def _rebalanced(self) -> None:
        """What the listener queued (assignments, losses), applied in the order it came."""
        while True:
            try:
                what, partitions = self._rebalances.get_nowait()
            except queue.Empty:
                return
            if what == "assigned":
                self._drop(partitions & set(self.tasks))  # a task still here (lost, then assigned again) starts anew
                for partition in partitions:
                    self.tasks[partition] = self.state.new_task(partition)
                logger.info("partitions assigned: %s (restoring their state)", sorted(partitions))
            else:
                mine = partitions & set(self.tasks)
                self._drop(mine)  # evicted: a commit would be refused; the new owner restores the last flushed state
                if mine:
                    logger.warning(
                        "partitions lost: %s (the new owner restores their last committed state)", sorted(mine)
                    )

    def _drop(self, partitions: set[int]) -> None:
        for partition in partitions:
            task = self.tasks.pop(partition, None)
            if task is not None:
                self.state.close_task(task)
        self.prometheus.forget_partitions(partitions)
        self._lag_reported -= partitions

    # -- restoration -----------------------------------------------------------------------------------------------

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
        self.clock.forget({tp.partition for tp in moved if tp.topic == self.topics.repartition}, side=True)
        self._side_assignment = set(wanted)
        self._side_owners = owners

    def complete_restorations(self) -> None:
        """The state manager decides which restoring tasks are done (`StateManager.complete_restorations`); their
        input partitions resume. A task it replaced (a store distrusted) gets its changelog partition sought to 0 by
        `_sync_side`."""
        assert self.side is not None and self.group is not None
        side, changelog = self.side, self.topics.changelog
        for task in self.state.complete_restorations(
            self.tasks, lambda partition: side.highwater(TopicPartition(changelog, partition))
        ):
            self.group.resume(TopicPartition(self.settings.topic, task.partition))
        if self.tasks and not any(task.restoring for task in self.tasks.values()):
            self.assigned.set()

    # -- commit ----------------------------------------------------------------------------------------------------

    def _flush(
        self, partitions: set[int], timeout_s: float = 30.0, *, revoking: bool = False
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """The active tasks of `partitions` made durable (`commit.Committer`): the input offsets to commit. Jobs still
        in a table's outbox go out first: a commit in the middle of a step (a memory bound's) must not write a
        completion, and commit the input past it, without its job (a crash then would never judge it)."""
        tasks = [self.tasks[p] for p in sorted(partitions) if p in self.tasks and not self.tasks[p].restoring]
        self.processor.dispatch(tasks)
        return self.committer.flush(tasks, timeout_s, revoking=revoking)

    def commit(self) -> None:
        assert self.group is not None
        self._rebalanced()
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
                task.committed(meta.offset)

    def _recover_all(self) -> None:
        for task in active(self.tasks.values()):
            self._recover(task)

    def _recover(self, task: Task) -> None:
        """A write to an internal topic failed for good: rebuild the task from its changelog and its last commit."""
        assert self.group is not None
        tp = TopicPartition(self.settings.topic, task.partition)
        logger.warning("partition %d: an internal write failed; restoring it from the changelog", task.partition)
        self.state.close_task(task)
        fresh = self.state.new_task(task.partition)
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
        self.prometheus.sessions_open.set(self.instruments.report_tables(self.tasks.values(), self.memory.used))
        if not lag or self.group is None:
            return
        for task in self.tasks.values():
            answer = self.clock.answer(task, self.group)  # none yet in this assignment: no lag reported
            position = self.clock.input_position(task, self.group)
            if answer is not None and position is not None:
                self.prometheus.set_lag(task.partition, answer.highwater - position)
                self._lag_reported.add(task.partition)
