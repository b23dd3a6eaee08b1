"""The orphaned-leader guard against Tansu's coordinator, both sides: it recovers the group Tansu wedges (a LeaveGroup
from the leader of a forming group), and stays out of the way where the leader is still a member. The completed-join
keeper against kafka-python, both sides: a join that finished while nobody polled is dropped and sent again without it,
applied at the next poll with it."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kafka import KafkaConsumer
from kafka.coordinator.base import Generation
from kafka.structs import MemberState

from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.kafka.membership import (
    CompletedJoinKeeper,
    OrphanedLeaderGuard,
    close_leaving,
    guard_membership,
)

SESSION_MS = 6000


@pytest.fixture
def group(broker: EmbeddedBroker) -> Iterator[tuple[EmbeddedBroker, str, str]]:
    topic = f"m-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, 3)
    yield broker, topic, f"m-{uuid.uuid4().hex[:6]}"


def member(broker: EmbeddedBroker, topic: str, group_id: str) -> KafkaConsumer:
    return KafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap_servers,
        group_id=group_id,
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=1000,
        enable_auto_commit=False,
    )


def assigned(consumer: KafkaConsumer, count: int) -> None:
    while len(consumer.assignment()) < count:
        consumer.poll(200)


class Poller(threading.Thread):
    """Polls a consumer for up to `limit_s`; `took` is when it owned `count` partitions (None: never)."""

    def __init__(self, consumer: KafkaConsumer, count: int, limit_s: float) -> None:
        super().__init__(daemon=True)
        self.consumer, self.count, self.limit_s = consumer, count, limit_s
        self.took: float | None = None

    def run(self) -> None:
        started = time.monotonic()
        while time.monotonic() - started < self.limit_s:
            self.consumer.poll(200)
            if len(self.consumer.assignment()) == self.count:
                self.took = time.monotonic() - started
                return


def leader_leaves_while_another_joins(group: tuple[EmbeddedBroker, str, str], guarded: bool) -> tuple[Poller, Any]:
    broker, topic, group_id = group
    leader = member(broker, topic, group_id)
    assigned(leader, 3)
    joiner = member(broker, topic, group_id)
    guard = guard_membership(joiner) if guarded else None
    poller = Poller(joiner, 3, limit_s=4 * SESSION_MS / 1000)
    poller.start()
    # The barrier: the leader hears of the join (its heartbeat answers REBALANCE_IN_PROGRESS) and has not rejoined.
    deadline = time.monotonic() + 30
    while not leader._coordinator.rejoin_needed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leader._coordinator.rejoin_needed, "the joiner never started a rebalance"
    close_leaving(leader)  # LeaveGroup from the leader of a forming group
    poller.join()
    joiner.close(autocommit=False)
    return poller, guard


def test_without_the_guard_tansu_leaves_the_group_without_a_leader(group: tuple[EmbeddedBroker, str, str]) -> None:
    """The broker bug itself (if Tansu fixes it, this fails and the guard can go): no partition for four sessions."""
    poller, _ = leader_leaves_while_another_joins(group, guarded=False)
    assert poller.took is None


def test_the_guard_recovers_a_group_whose_leader_left_while_it_formed(group: tuple[EmbeddedBroker, str, str]) -> None:
    poller, guard = leader_leaves_while_another_joins(group, guarded=True)
    assert isinstance(guard, OrphanedLeaderGuard) and guard.recoveries == 1
    assert poller.took is not None
    print(f"\norphaned leader recovered: the joiner owned every partition {poller.took:.1f}s after it started")


def test_the_guard_stays_out_of_a_group_whose_leader_is_a_member(group: tuple[EmbeddedBroker, str, str]) -> None:
    """A formed group: the leader leaves (Tansu clears the leadership) and the other member takes every partition with
    no recovery; and a follower that is told the leader is a member never takes over."""
    broker, topic, group_id = group
    leader = member(broker, topic, group_id)
    assigned(leader, 3)
    follower = member(broker, topic, group_id)
    guard = guard_membership(follower)
    assert guard is not None
    both = threading.Thread(target=lambda: [leader.poll(200) for _ in range(200) if len(follower.assignment()) == 0])
    both.start()
    assigned(follower, 1)
    both.join()
    close_leaving(leader)
    started = time.monotonic()
    assigned(follower, 3)
    print(
        f"\nformed group: the leader left, the other member owned every partition {time.monotonic() - started:.1f}s on"
    )
    follower.close(autocommit=False)
    assert guard.recoveries == 0
    assert not guard.orphaned("leader-1", "member-2", ["leader-1", "member-2"])
    assert not guard.orphaned("gone", "member-3", ["member-2", "member-3"])  # the lowest id takes over, only it
    assert guard.orphaned("gone", "member-2", ["member-2", "member-3"])


def test_a_consumer_without_kafka_pythons_coordinator_is_left_alone() -> None:
    assert guard_membership(object()) is None


def join_finished_between_polls(
    group: tuple[EmbeddedBroker, str, str], kept: bool
) -> tuple[KafkaConsumer, list[float]]:
    """A consumer whose join finishes while its thread is busy elsewhere (not in poll), then polls once; the JoinGroup
    rounds it ran (each answered after Tansu's join window, half the session timeout)."""
    broker, topic, group_id = group
    consumer = member(broker, topic, group_id)
    coordinator = consumer._coordinator
    rounds: list[float] = []
    join_and_sync = coordinator._do_join_and_sync_async

    async def counted() -> Any:
        assignment = await join_and_sync()
        rounds.append(time.monotonic())
        return assignment

    coordinator._do_join_and_sync_async = counted
    if kept:
        CompletedJoinKeeper(coordinator)
    deadline = time.monotonic() + 30
    while not rounds and time.monotonic() < deadline:  # the barrier: one JoinGroup/SyncGroup round finished...
        consumer.poll(10)
        task = coordinator._join_task
        while task is not None and not task.is_done and time.monotonic() < deadline:  # ...while nobody polled
            time.sleep(0.05)
    assert rounds, "no join finished"
    assert consumer.assignment() == set()
    consumer.poll(100)
    return consumer, rounds


def test_without_the_keeper_kafka_python_drops_a_join_finished_between_polls(
    group: tuple[EmbeddedBroker, str, str],
) -> None:
    """The client bug itself (if kafka-python fixes it, this fails and the keeper can go): the poll after the join
    finished sends another JoinGroup instead of taking the assignment."""
    consumer, _ = join_finished_between_polls(group, kept=False)
    try:
        assert consumer.assignment() == set()
        task = consumer._coordinator._join_task
        assert task is not None and not task.is_done, "no second JoinGroup in flight"
    finally:
        consumer.close(autocommit=False)


def test_the_keeper_applies_a_join_finished_between_polls_at_the_next_poll(
    group: tuple[EmbeddedBroker, str, str],
) -> None:
    consumer, rounds = join_finished_between_polls(group, kept=True)
    try:
        assert len(consumer.assignment()) == 3
        assert len(rounds) == 1
    finally:
        consumer.close(autocommit=False)


class FakeCoordinator:
    """kafka-python's coordinator as the keeper sees it: a join round that makes a new generation each time."""

    group_id = "g"

    def __init__(self) -> None:
        self.config = {"session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": 1000}
        self._generation = Generation.NO_GENERATION
        self.state = MemberState.UNJOINED
        self.rounds = 0

    async def _do_join_and_sync_async(self) -> bytes:
        self.rounds += 1
        self.state = MemberState.REBALANCING
        self._generation = Generation(self.rounds, f"m{self.rounds}", "cooperative-sticky")
        return f"assignment-{self.rounds}".encode()

    async def _on_join_complete_async(self, *args: Any) -> None:
        self.state = MemberState.STABLE

    def reset_generation(self, member_id: str = "") -> None:
        self._generation = Generation(-1, member_id, None)
        self.state = MemberState.UNJOINED


def test_the_keeper_hands_on_only_a_fresh_join_for_the_state_it_was_made_in(monkeypatch: pytest.MonkeyPatch) -> None:
    coordinator = FakeCoordinator()
    keeper = CompletedJoinKeeper(coordinator)
    assert asyncio.run(coordinator._do_join_and_sync_async()) == b"assignment-1"
    assert asyncio.run(coordinator._do_join_and_sync_async()) == b"assignment-1"  # handed on: no second round
    assert (coordinator.rounds, keeper.kept) == (1, 1)

    def refused_after(change: Callable[[], None]) -> bool:
        asyncio.run(coordinator._on_join_complete_async())  # what was kept is applied: nothing is kept
        before = coordinator.rounds
        asyncio.run(coordinator._do_join_and_sync_async())  # a fresh finished join
        change()
        asyncio.run(coordinator._do_join_and_sync_async())
        return coordinator.rounds == before + 2

    assert refused_after(coordinator.reset_generation)  # left, expired or fenced: UNJOINED
    assert refused_after(lambda: coordinator.reset_generation(member_id=coordinator._generation.member_id))
    assert refused_after(lambda: asyncio.run(coordinator._on_join_complete_async()))  # already applied
    now = time.monotonic()
    stale = now + SESSION_MS / 1000  # no heartbeat since the join: the coordinator may have expired the member
    assert refused_after(lambda: monkeypatch.setattr(time, "monotonic", lambda: stale))
    assert keeper.kept == 1


def test_the_keeper_says_once_a_rebalance_when_it_starts_joining_and_when_it_has_joined(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A rejoin that moves no partition of this member shows in no assigned/revoked line; these lines tell a group
    still rebalancing from a formed one (the scale-in test waits on them)."""
    coordinator = FakeCoordinator()
    CompletedJoinKeeper(coordinator)
    caplog.set_level("INFO", logger="tracejudge.consumer.kafka")

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "tracejudge.consumer.kafka"]

    asyncio.run(coordinator._do_join_and_sync_async())
    coordinator._generation = Generation.NO_GENERATION  # the attempt failed (e.g. REBALANCE_IN_PROGRESS): tried again
    asyncio.run(coordinator._do_join_and_sync_async())
    assert said() == ["group 'g': joining (a rebalance is under way)"]  # one line for the rebalance, not per attempt
    asyncio.run(coordinator._on_join_complete_async(2, "m2", "cooperative-sticky", b""))
    assert said()[1:] == ["group 'g': joined generation 2"]
    asyncio.run(coordinator._do_join_and_sync_async())  # the next rebalance
    assert said()[2:] == ["group 'g': joining (a rebalance is under way)"]
