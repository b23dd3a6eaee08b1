"""The commit's durable half (Kafka Streams' prepareCommit / postCommit): what must be acknowledged before an input
offset may be committed.

Three acknowledged steps, in Kafka Streams' order: flush the producer (the forwarded events and judge jobs), write
every changed conversation to the changelog (then the local store) and flush again, write the task's positions and
flush again (then the checkpoint). A crash anywhere in between replays records since the last commit into restored
state, where a span already seen is a duplicate: at-least-once, never a fragment.
"""

from __future__ import annotations

from collections.abc import Callable

from ..kafka import OffsetAndMetadata, TopicPartition
from ..kafka.topics import InternalTopics
from . import records as R
from .record_collector import RecordCollector
from .state_manager import StateManager
from .task import Task


class Committer:
    """Makes tasks' progress durable; `recover_all` rebuilds every active task after a write failed for good."""

    def __init__(
        self,
        topic: str,
        topics: InternalTopics,
        collector: RecordCollector,
        state: StateManager,
        recover_all: Callable[[], None],
    ) -> None:
        self.topic = topic
        self.topics = topics
        self.collector = collector
        self.state = state
        self.recover_all = recover_all

    def flush(
        self, tasks: list[Task], timeout_s: float = 30.0, *, revoking: bool = False
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """Make the (active) tasks' progress durable; returns the input offsets that may now be committed (empty if
        not). A positions record is never durable before the states it covers. The collector's failure is
        process-wide and cleared only once every active task was recovered from it: a send that failed between two
        commits (synchronously, or behind a flush that timed out) is never forgotten, also when a revocation flushes
        only some partitions (revoked tasks are dropped, not recovered: the new owner re-reads from the last
        commit)."""
        if not tasks:
            return {}
        collector = self.collector
        if not collector.flushed(timeout_s):
            return {}
        if collector.failed:
            if revoking:
                return {}
            collector.renew()
            self.recover_all()
            return {}
        written: dict[int, dict[str, tuple[str, bytes | None]]] = {}
        for task in tasks:
            encoded = written[task.partition] = {}
            for cid, unflushed in task.stage_changes().items():
                kind, value = (R.STATE_PACKED, None) if unflushed is None else R.encode_state(unflushed)
                encoded[cid] = (kind, value)
                collector.send(self.topics.changelog, cid, value, kind, partition=task.partition)
        if not collector.flushed(timeout_s) or self._failed_again(revoking):
            return {}  # the changes stay unflushed and go out again at the next commit
        for task in tasks:
            self.state.store_changes(task, written[task.partition])  # after the changelog has them, as Kafka Streams
            task.changes_flushed()
            if task.positions_dirty:
                collector.send(
                    self.topics.changelog,
                    R.POSITIONS_KEY,
                    R.dumps(task.positions()),
                    R.POSITIONS,
                    partition=task.partition,
                    acked=task,
                )
        if not collector.flushed(timeout_s) or self._failed_again(revoking):
            return {}
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for task in tasks:
            if task.positions_dirty:
                self.state.checkpoint(task)  # the positions record's acknowledgement was applied by `flushed`
            task.positions_written()
            if task.input_position is not None and task.input_position != task.committed_input:
                offsets[TopicPartition(self.topic, task.partition)] = OffsetAndMetadata(task.input_position, "", -1)
        return offsets

    def _failed_again(self, revoking: bool) -> bool:
        """A changelog write failed: a fresh producer, nothing committed; the writes go out again next time."""
        if not self.collector.failed:
            return False
        if not revoking:
            self.collector.renew()
        return True
