"""Graceful restarts and scale-in hand partitions over at once, through real `tracejudge consume` processes on Tansu.

The session timeout here is 30 s, so a handover that waited for the stopped member's session (no LeaveGroup) could
not come before it: the test asserts the old member left (or, static, was taken over) and prints the timings, from
the processes' own log lines (stop, join, assignment) and the first record read. Tansu holds a forming group's
JoinGroup open for half the session timeout (its join window), so that is the floor here. A kill -9 still waits for
the session timeout (docs/state.md).
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path

import pytest
from kafka import KafkaAdminClient

from tests.consumer.test_pipeline import scripted_judge
from tests.reliability.test_state_windows import Replica, Turns, _setup, calls_by_conversation
from tests.support.judge_server import JudgeServer
from tests.support.pipeline import wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker

# handover timings against the session timeout: runs alone (tests/run_suite.py's serial phase)
pytestmark = pytest.mark.serial

SESSION_S = 30.0  # a graceful handover (one rebalance) under a loaded 2-core CI stays well below it
_SLOW_SESSION = {"TRACEJUDGE_KAFKA_CONFIG": f"session_timeout_ms={int(SESSION_S * 1000)},heartbeat_interval_ms=1000"}
_MOVES = re.compile(r"tracejudge\.consumer\.streams: partitions (assigned|revoked|lost): \[([\d, ]*)\]")
_JOINS = re.compile(r"group '([^']+)': (joining|joined) ")


def owned(replica: Replica) -> set[int]:
    """The input partitions a replica owns now, replayed from its stream thread's assigned/revoked/lost lines (not the
    judge worker's judge-queue lines: another group, assigned apart)."""
    mine: set[int] = set()
    for kind, numbers in _MOVES.findall(replica.log.read_text()):
        partitions = {int(n) for n in numbers.split(",") if n.strip()}
        mine = mine | partitions if kind == "assigned" else mine - partitions
    return mine


def settled(replica: Replica, group: str) -> bool:
    """The replica's member of `group` has no join in flight: of its joining/joined lines (membership.py's keeper),
    the last says joined. A rejoin that moves none of its partitions shows in no assigned/revoked line."""
    last = None
    for name, what in _JOINS.findall(replica.log.read_text()):
        if name == group:
            last = what
    return last == "joined"


def timeline(replica: Replica, group: str) -> str:
    """The replica's joins, assignments and revocations in `group`, with their times: what a slow handover did."""
    lines = [
        f"  {line[11:23]} {line.split(': ', 1)[-1]}"
        for line in replica.log.read_text().splitlines()
        if _MOVES.search(line) or (f"group {group!r}: join" in line)
    ]
    return f"{replica.log.name}:\n" + "\n".join(lines)


def logged_at(replica: Replica, text: str) -> float:
    """The wall time of the first log line containing `text` (the processes stamp each line)."""
    for line in replica.log.read_text().splitlines():
        if text in line:
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    raise AssertionError(f"{replica.log.name} has no line with {text!r}")


def members(broker: EmbeddedBroker, group: str) -> list[str]:
    """The group's member ids, as its coordinator describes them."""
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    admin._process_acl_operations = lambda group: group  # Tansu reports ACL operation codes kafka-python rejects
    try:
        return [m["member_id"] for m in admin.describe_groups([group])[group]["members"]]
    finally:
        admin.close()


def first_read(replicas: list[Replica]) -> bool:
    return sum(r.metric("tracejudge_span_events_total") for r in replicas) > 0


@pytest.mark.parametrize("membership", ["dynamic", "static"])
def test_a_lone_replica_restarted_gracefully_consumes_again_without_waiting_for_its_old_session(
    broker: EmbeddedBroker, judge_server: JudgeServer, tmp_path: Path, membership: str
) -> None:
    """Dynamic: the stopped process left both its groups (DescribeGroups: no member) the moment it exited, so the
    restart never waits for the old session, however long the new process takes to start. Static: the old member
    stays (no LeaveGroup, as Kafka defines it) and the restart, the same `--group-instance-id`, takes its place."""
    judge_server.responder = scripted_judge
    topic, results, group = _setup(broker)
    env = dict(_SLOW_SESSION)
    if membership == "static":
        env["TRACEJUDGE_GROUP_INSTANCE_ID"] = "pod-0"
    first = Replica(broker, topic, group, results, tmp_path / "first.log", **env)
    first.ready()
    turns = Turns(broker.bootstrap_servers, topic)
    first.stop("term")
    left = {g: members(broker, g) for g in (group, f"{group}-judges")}
    second = Replica(broker, topic, group, results, tmp_path / "second.log", **env)
    ids = [f"r{i}" for i in range(9)]
    for cid in ids:
        turns.turn(cid, 1, indexed=False)
        turns.end(cid)
    turns.flush()
    wait_for(lambda: owned(second) == {0, 1, 2}, 120, "the restarted replica owning every partition")
    wait_for(lambda: first_read([second]), 60, "the first record read")
    read = time.time()
    wait_for(lambda: set(calls_by_conversation(judge_server)) >= set(ids), 90, "every conversation judged")
    second.stop("term")
    turns.provider.shutdown()
    stopped = logged_at(first, "stopped: ")
    joining = logged_at(second, "consuming '")
    assigned = logged_at(second, "streams: partitions assigned: [0, 1, 2]")
    print(
        f"\nlone {membership} restart: stop→new process joining {joining - stopped:.1f}s (its start-up), "
        f"joining→assigned {assigned - joining:.1f}s, assigned→first read ≤{read - assigned:.1f}s "
        f"(session timeout {SESSION_S:.0f}s; Tansu's join window is half of it); members after the stop {left}"
    )
    if membership == "dynamic":
        assert left == {group: [], f"{group}-judges": []}, left
    else:
        assert all(len(m) == 1 for m in left.values()), left  # kept for the restart: no LeaveGroup
        assert assigned - joining < SESSION_S, "the static restart waited for its old session to time out"


def test_a_replica_stopped_gracefully_among_three_has_its_partitions_owned_elsewhere_at_once(
    broker: EmbeddedBroker, judge_server: JudgeServer, tmp_path: Path
) -> None:
    """Scale-in 3 → 2: the stopped replica's partitions are owned by the other two before its session could expire,
    and what arrives then is judged."""
    judge_server.responder = scripted_judge
    topic, results, group = _setup(broker)
    replicas: list[Replica] = []
    for i in range(3):  # one at a time, as a scale-out does
        replicas.append(Replica(broker, topic, group, results, tmp_path / f"r{i}.log", **_SLOW_SESSION))
        wait_for(lambda: "ready: consuming" in replicas[-1].log.read_text(), 300, "the replica ready")  # slow start-ups
    # the formed group: one partition each (cooperative-sticky), not a rebalance still moving them to the newcomer, and
    # no member still joining: on Tansu a rejoin that moves nothing (a follower's, after its SyncGroup timed out while
    # the leader started the cooperative second round) is held a whole join window and shows in no assigned line; a
    # stop meanwhile is a scale-in during a scale-out's rebalance, which takes Tansu two more rounds (a separate case)
    wait_for(
        lambda: all(len(owned(r)) == 1 and settled(r, group) for r in replicas) and len(members(broker, group)) == 3,
        4 * SESSION_S,
        "one partition owned by each replica, no join in flight",
    )
    victim = replicas[0]
    survivors = [r for r in replicas if r is not victim]
    moving = owned(victim)
    victim.stop("term")
    stopped = time.monotonic()
    wait_for(lambda: set().union(*(owned(r) for r in survivors)) == {0, 1, 2}, 2 * SESSION_S, "partitions moved")
    moved = time.monotonic()
    turns = Turns(broker.bootstrap_servers, topic)
    ids = [f"s{i}" for i in range(12)]
    for cid in ids:
        turns.turn(cid, 1, indexed=False)
        turns.end(cid)
    turns.flush()
    produced = time.monotonic()
    wait_for(lambda: set(calls_by_conversation(judge_server)) >= set(ids), 90, "every conversation judged")
    judged = time.monotonic()
    for replica in survivors:
        replica.stop("term")
    turns.provider.shutdown()
    print(
        f"\nscale-in 3→2: partitions {sorted(moving)} owned elsewhere {moved - stopped:.1f}s after the stop; "
        f"records produced then judged in {judged - produced:.1f}s (session timeout {SESSION_S:.0f}s)"
    )
    assert moved - stopped < SESSION_S, (
        f"the handover took {moved - stopped:.1f}s (a join window is {SESSION_S / 2:.0f}s):\n"
        + "\n".join(timeline(r, group) for r in replicas)
    )
