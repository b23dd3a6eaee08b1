"""Group membership as Kafka Streams handles it: leaving without a LeaveGroup request, and telling a member that
joined but got no partition.

Leaving a consumer group without a LeaveGroup request, as Kafka Streams does (`internal.leave.group.on.close`
is false there): the member's partitions move when its session times out.

Two reasons. A rolling restart that sends LeaveGroup rebalances the group twice per replica. And Tansu's
coordinator wedges for good when the member it elected leader of a forming group leaves (its LeaveGroup removes the
member but not the leadership, so no SyncGroup can ever succeed): a replica stopped while another was joining left
its whole group without partitions. A member that stops sending requests is evicted instead, and an evicted leader's
leadership goes with it. Static members (`--group-instance-id`) never send LeaveGroup anyway.
"""

from __future__ import annotations

from typing import Any

from kafka.structs import MemberState


def close_staying(consumer: Any) -> None:
    """Close a group consumer (revocation callbacks and all) but send no LeaveGroup."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is not None and hasattr(coordinator, "maybe_leave_group"):
        coordinator.maybe_leave_group = _stay  # kafka-python's close() calls it last, after the revocation
    consumer.close(autocommit=False)


def _stay(*args: Any, **kwargs: Any) -> None:
    return None


def stable_generation(consumer: Any) -> int | None:
    """The group generation this member has joined and is heartbeating in, or None while unjoined or rebalancing."""
    try:
        metadata = consumer.group_metadata()
    except Exception:  # a consumer without a group, or closed
        return None
    if metadata.state != MemberState.STABLE or metadata.generation_id < 0:
        return None
    return int(metadata.generation_id)


class PartitionlessMember:
    """Whether a member sits in its group without a partition of `topic`: joined (a stable generation) and assigned
    none, for `after_s` in that same generation. The wait covers a cooperative rebalance's second round (the
    partitions another member gives up reach the newcomer in the next generation, seconds later), so a replica that
    is only between the two rounds is not reported. `check` is True once per stretch without partitions."""

    def __init__(self, topic: str, after_s: float) -> None:
        self.topic = topic
        self.after_s = after_s
        self._since: tuple[int, float] | None = None  # (generation, first seen without partitions)
        self._said = False

    def check(self, consumer: Any, now: float) -> bool:
        generation = stable_generation(consumer)
        if generation is None:
            return False
        if any(tp.topic == self.topic for tp in consumer.assignment()):
            self._since, self._said = None, False
            return False
        if self._since is None or self._since[0] != generation:
            self._since = (generation, now)
            return False
        if self._said or now - self._since[1] < self.after_s:
            return False
        self._said = True
        return True
