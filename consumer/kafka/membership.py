"""Group membership: a stopping replica leaves its group at once, a group Tansu left without a leader recovers, and a
member that joined but got no partition says so.

A graceful stop closes the group consumer the normal way, with a LeaveGroup request: its partitions move in one
rebalance instead of after its session timeout (a rolling restart or a scale-in on any broker). A static member
(`--group-instance-id`) sends none, as Kafka defines it: its restart comes back as the same member.

Tansu (the embedded broker, 0.6.0) has one coordinator bug in that path. A LeaveGroup from the leader of a group that
is *forming* (another member joining) removes the member but keeps it as the group's leader
(coordinator/group/administrator.rs, `Inner<O, Forming>::leave`; the `Formed` case clears it). Every later JoinGroup
then names a leader that no longer exists, no member gets the members list to assign, and every SyncGroup answers
REBALANCE_IN_PROGRESS for good. `OrphanedLeaderGuard` recognises exactly that, from the remaining members' side:
when a follower's SyncGroup answers REBALANCE_IN_PROGRESS it asks the coordinator to describe the group (at most once a
second); if the leader its JoinGroup named is not among the members, the lowest-id member leaves under its own id and
rejoins under the orphaned leader's id, which Tansu accepts as a new member that is already the leader: it assigns,
and the group forms. On Kafka the leader named by a JoinGroup is a member unless it left between that JoinGroup and
the SyncGroup; the takeover is then refused (UNKNOWN_MEMBER_ID) and the consumer joins afresh within the rebalance
that leaving started: one more JoinGroup, never a session timeout.

kafka-python (3.0.12, and its main branch) drops a join that finished while no `poll()` waited for it: its
`join_group_async` starts a new JoinGroup whenever the join task it scheduled `is_done`, so the assignment that join
got is never applied and the group rebalances again. A consumer whose thread does other work between short polls (the
judge worker: 100 ms polls between probes, retries and commits) loses most of its joins that way, on any broker. On
Tansu, whose coordinator holds each JoinGroup for half the session timeout, every loss costs that again; a leader
that loses its SyncGroup answer keeps claiming the partitions it was told to give up, so the cooperative round never
ends and the newcomer waits minutes for its partitions. `CompletedJoinKeeper` keeps a finished join's assignment until
join-complete applies it and hands it to the next attempt, as long as the member's state is still the one it was for.

The keeper also says when a member starts joining and when its join is complete (one line each per rebalance, any
broker): a join that changes no partition of this member (a follower's rejoin after a SyncGroup answered
REBALANCE_IN_PROGRESS) shows in no assigned/revoked line, yet on Tansu it is held for a whole join window, and a
member that leaves meanwhile hands that join the leader's role with the other members' subscriptions as they last
sent them (owned partitions out of date): its partitions then take two more rounds to settle instead of one. The
lines tell a group still rebalancing from a formed one.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kafka import errors as kafka_errors
from kafka.structs import MemberState

from .quirks import is_tansu

logger = logging.getLogger("tracejudge.consumer.kafka")

_CHECK_EVERY_S = 1.0


class OrphanedLeaderGuard:
    """Installed on one KafkaConsumer's group coordinator; counts the recoveries it made (`recoveries`)."""

    def __init__(self, coordinator: Any) -> None:
        self._coordinator = coordinator
        self._joined: tuple[str, str] | None = None  # (leader, member) named by the last JoinGroup
        self._checked_at = float("-inf")
        self.recoveries = 0
        self._process_join = coordinator._process_join_group_response
        self._join_and_sync = coordinator._do_join_and_sync_async
        coordinator._process_join_group_response = self._on_join_response
        coordinator._do_join_and_sync_async = self._guarded_join_and_sync

    def _on_join_response(self, response: Any, send_time: float) -> Any:
        result = self._process_join(response, send_time)
        self._joined = (response.leader, response.member_id)
        return result

    async def _guarded_join_and_sync(self) -> Any:
        try:
            return await self._join_and_sync()
        except kafka_errors.RebalanceInProgressError:
            try:
                await self._recover_if_orphaned()
            except Exception as exc:  # a probe that fails changes nothing: the join is retried as before
                logger.debug("orphaned-leader check failed: %r", exc)
            raise

    def orphaned(self, leader: str, member: str, members: list[str]) -> bool:
        """The named leader is gone and this member is the one (lowest id) to take its place."""
        return bool(members) and leader not in members and min(members) == member

    async def _recover_if_orphaned(self) -> None:
        if self._joined is None:
            return
        leader, member = self._joined
        if not leader or leader == member or time.monotonic() - self._checked_at < _CHECK_EVERY_S:
            return
        self._checked_at = time.monotonic()
        from kafka.protocol.admin import DescribeGroupsRequest
        from kafka.protocol.consumer import LeaveGroupRequest

        coordinator = self._coordinator
        described = await coordinator._manager.send(
            DescribeGroupsRequest(groups=[coordinator.group_id], include_authorized_operations=False),
            node_id=coordinator.coordinator_id,
        )
        group = described.groups[0]
        members = [m.member_id for m in group.members]
        if group.error_code or not self.orphaned(leader, member, members):
            return
        await coordinator._manager.send(
            LeaveGroupRequest(
                group_id=coordinator.group_id,
                member_id=member,
                members=[
                    LeaveGroupRequest.MemberIdentity(
                        member_id=member, group_instance_id=coordinator.group_instance_id, reason="orphaned leader"
                    )
                ],
            ),
            node_id=coordinator.coordinator_id,
        )
        coordinator.reset_generation(member_id=leader)
        self._joined = None
        self.recoveries += 1
        logger.warning(
            "group %r named leader %s, which has left (the broker kept a departed leader: Tansu's coordinator bug); "
            "rejoining under that id so the group can form",
            coordinator.group_id,
            leader,
        )


class CompletedJoinKeeper:
    """Installed on one KafkaConsumer's group coordinator (outside the orphaned-leader guard); counts the joins it
    handed on instead of sending a JoinGroup again (`kept`).

    A finished join is handed on only while it is fresh: kafka-python sends no heartbeat from the JoinGroup until
    join-complete, so a join kept longer than the session timeout (less a heartbeat interval) may belong to a member
    the coordinator has already expired, whose partitions another member owns by now; such a join is dropped and a
    new JoinGroup sent, as kafka-python would."""

    def __init__(self, coordinator: Any) -> None:
        self._coordinator = coordinator
        self._finished: tuple[Any, Any, float] | None = None  # (the generation it was for, assignment, finished at)
        config = getattr(coordinator, "config", {})
        fresh_ms = config.get("session_timeout_ms", 10_000) - config.get("heartbeat_interval_ms", 3_000)
        self._fresh_s = max(0.0, fresh_ms / 1000)
        self.kept = 0
        self._joining = False  # said "joining" and not yet "joined"
        self._join_and_sync = coordinator._do_join_and_sync_async
        self._join_complete = coordinator._on_join_complete_async
        coordinator._do_join_and_sync_async = self._join_or_hand_on
        coordinator._on_join_complete_async = self._applied

    async def _join_or_hand_on(self) -> Any:
        finished, self._finished = self._finished, None
        coordinator = self._coordinator
        if not self._joining:
            self._joining = True
            logger.info("group %r: joining (a rebalance is under way)", getattr(coordinator, "group_id", "?"))
        if (
            finished is not None
            and finished[0] == coordinator._generation
            and coordinator.state is MemberState.REBALANCING
            and time.monotonic() - finished[2] < self._fresh_s
        ):
            self.kept += 1
            logger.info(
                "group %r: a join finished while this consumer was busy; its assignment is applied now instead of "
                "joining again",
                getattr(coordinator, "group_id", "?"),
            )
            return finished[1]
        assignment = await self._join_and_sync()
        self._finished = (coordinator._generation, assignment, time.monotonic())
        return assignment

    async def _applied(self, *args: Any, **kwargs: Any) -> Any:
        self._finished = None
        if self._joining:
            self._joining = False
            generation = args[0] if args else getattr(self._coordinator._generation, "generation_id", "?")
            logger.info("group %r: joined generation %s", getattr(self._coordinator, "group_id", "?"), generation)
        return await self._join_complete(*args, **kwargs)


def guard_membership(consumer: Any) -> OrphanedLeaderGuard | None:
    """Install the completed-join keeper (kafka-python's bug: any broker) on a group consumer, and the orphaned-leader
    guard (Tansu's bug) when the brokers are Tansu (`quirks.is_tansu`): a real cluster never sends its
    DescribeGroups or its LeaveGroup. The guard, or None (another broker, or a consumer without kafka-python's
    coordinator, e.g. a fake)."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None or not hasattr(coordinator, "_do_join_and_sync_async"):
        return None
    guard = OrphanedLeaderGuard(coordinator) if is_tansu(consumer) else None
    if hasattr(coordinator, "_on_join_complete_async"):
        CompletedJoinKeeper(coordinator)
    return guard


def close_leaving(consumer: Any) -> None:
    """Close a group consumer: revocation callbacks, then LeaveGroup (none for a static member)."""
    consumer.close(autocommit=False)


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
