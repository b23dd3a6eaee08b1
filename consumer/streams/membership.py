"""Leaving a consumer group without a LeaveGroup request, as Kafka Streams does (`internal.leave.group.on.close`
is false there): the member's partitions move when its session times out.

Two reasons. A rolling restart that sends LeaveGroup rebalances the group twice per replica. And Tansu's
coordinator wedges for good when the member it elected leader of a forming group leaves (its LeaveGroup removes the
member but not the leadership, so no SyncGroup can ever succeed): a replica stopped while another was joining left
its whole group without partitions. A member that stops sending requests is evicted instead, and an evicted leader's
leadership goes with it. Static members (`--group-instance-id`) never send LeaveGroup anyway.
"""

from __future__ import annotations

from typing import Any


def close_staying(consumer: Any) -> None:
    """Close a group consumer (revocation callbacks and all) but send no LeaveGroup."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is not None and hasattr(coordinator, "maybe_leave_group"):
        coordinator.maybe_leave_group = _stay  # kafka-python's close() calls it last, after the revocation
    consumer.close(autocommit=False)


def _stay(*args: Any, **kwargs: Any) -> None:
    return None
