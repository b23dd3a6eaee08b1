"""A full disk under the local store (issue 32), on a real small filesystem: a tmpfs of a few hundred KiB mounted for
the test (root only; elsewhere the test skips, and under CI=true it fails).

RocksDB refuses every write after one failed, until it is reopened, and reopening fails while the disk is still full:
`LocalStore` reopens before its next write (read-only meanwhile, so what is on disk is still read back). Through a
real `tracejudge consume` process with --max-open-conversations 50: the full disk is counted
(`tracejudge_state_store_errors_total{reason="disk_full"}`) and said (what to do); a conversation judged on part of its
turns is one the bound cut because the store could not take it, counted (`completed_by="memory_bound"`) and said,
and judged again on its whole transcript when its next turn came; once the volume grows (`mount -o remount`), the
store writes again without a restart and a second backlog wider than the bound is judged whole, with no cut."""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import missing_part
from tests.consumer.test_pipeline import scripted_judge
from tests.reliability.test_state_beyond_memory import barrier
from tests.reliability.test_state_windows import Replica
from tests.support.judge_server import JudgeServer, conversation_text, metric_of
from tests.support.pipeline import play, traced_app, wait_for
from tracejudge.consumer.conversation import store as store_module
from tracejudge.consumer.conversation.store import LocalStore, StoreError, decode, encode
from tracejudge.consumer.embedded_broker import EmbeddedBroker

from ..consumer.test_state_writes import state_with_everything

TINY = "256k"  # three partitions' RocksDB stores open in ~160 KiB (LOG, OPTIONS, MANIFEST...): ~100 KiB for state
GROWN = "64m"
CONVERSATIONS = 300
PADDING = "x" * 600  # each answer: the backlog's states need several times the tiny disk
METRICS = "failure_rate,conversational_flow"


class Volume:
    """A tmpfs mounted at `path` for the test; `grow` remounts it bigger (it cannot be unmounted while open)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def grow(self, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True, capture_output=True)

    def used_kib(self) -> int:
        stat = os.statvfs(self.path)
        return (stat.f_blocks - stat.f_bfree) * stat.f_frsize // 1024


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Volume]:
    path = tmp_path / "disk"
    path.mkdir()
    if os.geteuid() != 0:
        missing_part("root, to mount a tmpfs for a full disk (run as root)")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TINY}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        missing_part(f"permission to mount a tmpfs ({mounted.stderr.strip()})")
    try:
        yield Volume(path)
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)  # a straggler still holds a file


def test_the_store_reopens_after_a_full_disk_and_writes_again(
    tiny_disk: Volume, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RocksDB itself: after a failed write every later one fails ("Writer has previous error") on the same handle,
    and reopening fails while the disk is full; the store stays readable, tries to reopen at most every
    REOPEN_EVERY_S (each attempt replays its log, and leaves an info log behind: kept to a few), and once there is
    room it writes again."""
    store = LocalStore(tiny_disk.path / "db")
    state = state_with_everything()
    value = encode(state)
    written = 0
    with pytest.raises(StoreError) as full:
        for _ in range(10_000):
            store.write([(f"c{written}-{i}", value) for i in range(8)])
            written += 1
    assert full.value.reason == "disk_full"
    assert written > 0
    with pytest.raises(StoreError) as still:
        store.write([("after", value)])  # reopening needs room too
    assert still.value.reason == "disk_full" and "cannot open" in str(still.value)
    with pytest.raises(StoreError) as waiting:
        store.write([("after", value)])  # the next attempt waits REOPEN_EVERY_S
    assert waiting.value.reason == "disk_full" and "reopens within" in str(waiting.value)
    assert store.get("c0-0") == state  # read-only meanwhile: what is on disk is still read back
    monkeypatch.setattr(store_module, "REOPEN_EVERY_S", 0.0)  # every write tries to reopen
    for _ in range(30):
        with pytest.raises(StoreError):
            store.write([("after", value)])
    info_logs = [name for name in os.listdir(store.path) if name.startswith("LOG")]
    # LOG, the kept old ones, and one each that the last read-write and read-only attempts rotated
    assert len(info_logs) <= store_module.KEEP_INFO_LOGS + 2, f"{len(info_logs)} info logs left by failed reopens"
    tiny_disk.grow(GROWN)
    store.write([("after", value)], ["c0-0"])  # the same LocalStore, no restart
    assert store.get("after") == state and store.get("c0-0") is None
    assert decode(dict(store.items())[f"c{written - 1}-7"]) == state
    store.close()


def test_a_full_disk_that_goes_read_only_keeps_the_store_readable_and_raises_only_store_errors(
    tiny_disk: Volume, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that fails further (remounted read-only, as ext4's errors=remount-ro does) while the store reopens:
    every write is a StoreError (counted by the caller, never an exception that stops the stream thread) and what is
    on disk is still read back; once the disk is writable and has room, the same store writes again."""
    store = LocalStore(tiny_disk.path / "db")
    value = encode(state_with_everything())
    with pytest.raises(StoreError):
        for n in range(10_000):
            store.write([(f"c{n}-{i}", value) for i in range(8)])
    monkeypatch.setattr(store_module, "REOPEN_EVERY_S", 0.0)
    for _ in range(10):  # past KEEP_INFO_LOGS: every later reopen prunes an info log
        with pytest.raises(StoreError):
            store.write([("x", value)])
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_disk.path)], check=True, capture_output=True)
    try:
        for _ in range(3):
            with pytest.raises(StoreError):
                store.write([("x", value)])
            assert store.get("c0-0") is not None
    finally:
        subprocess.run(["mount", "-o", f"remount,rw,size={GROWN}", str(tiny_disk.path)], check=True)
    store.write([("x", value)])
    assert store.get("x") is not None
    store.close()


def backlog(broker: EmbeddedBroker, topic: str, prefix: str) -> None:
    """Every first turn, then every second turn and end marker: as wide as the backlog, far past the bound."""
    provider = traced_app(broker.bootstrap_servers, topic)
    ids = [f"{prefix}-{i}" for i in range(CONVERSATIONS)]
    play(provider, {cid: [(f"{cid} q0", f"a0 {PADDING}")] for cid in ids}, end=False)
    play(provider, {cid: [(f"{cid} q1", f"a1 {PADDING}")] for cid in ids})
    provider.shutdown()


def recovered_partitions(log: Path) -> set[int]:
    """The partitions whose store said it writes again (each store failed: the disk is shared and too small)."""
    return {
        int(p) for p in re.findall(r"partition (\d+): the local store under --state-dir writes again", log.read_text())
    }


def judged(server: JudgeServer, prefix: str) -> list[tuple[str, str, bool]]:
    """(conversation, judge, whole transcript?) of every judge call on a conversation of the backlog `prefix`."""
    calls = []
    for request in list(server.requests):
        text = conversation_text(request)
        found = re.search(rf"\b{prefix}-(\d+) q[01]", text)
        if found:
            cid = found.group(1)
            calls.append((cid, metric_of(request), f"{prefix}-{cid} q0" in text and f"{prefix}-{cid} q1" in text))
    return calls


def whole_everywhere(server: JudgeServer, prefix: str) -> bool:
    """Every conversation of the backlog judged by both judges on its whole transcript."""
    return len({(c, m) for c, m, whole in judged(server, prefix) if whole}) == 2 * CONVERSATIONS


@pytest.mark.timeout(900)
def test_a_full_disk_is_counted_said_never_a_silent_cut_and_recovers_without_a_restart(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, tmp_path: Path, tiny_disk: Volume
) -> None:
    judge_server.responder = scripted_judge
    backlog(broker, topic, "full")
    log = tmp_path / "consumer.log"
    replica = Replica(
        broker,
        topic,
        f"diskfull-{uuid.uuid4().hex[:6]}",
        f"{topic}-results",
        log,
        TRACEJUDGE_METRICS=METRICS,
        TRACEJUDGE_MAX_OPEN_CONVERSATIONS="50",
        TRACEJUDGE_STATE_DIR=str(tiny_disk.path),
        TRACEJUDGE_MAX_CONCURRENCY="16",
    )
    try:
        # -- the disk fills: counted, said; what the bound cuts is counted and said, then judged whole -------------
        wait_for(lambda: whole_everywhere(judge_server, "full"), timeout=300, what="every conversation judged whole")
        barrier(broker, topic, judge_server, "full-")
        errors = replica.metric("tracejudge_state_store_errors_total", reason="disk_full")
        cut = replica.metric("tracejudge_conversations_completed_total", completed_by="memory_bound")
        text = log.read_text()
        calls = judged(judge_server, "full")
        partial = {cid for cid, _, whole in calls if not whole}
        print(
            f"\n{TINY} disk full at {tiny_disk.used_kib()} KiB used: {errors:.0f} store errors (disk_full),"
            f" {cut:.0f} conversations cut at the bound, {len(partial)} judged on part of their turns, then whole;"
            f" {len(calls)} judge calls for {CONVERSATIONS} conversations"
        )
        assert errors > 0
        said = [line for line in text.splitlines() if "local store under --state-dir" in line and "disk_full" in line]
        assert said and "free space on that volume or grow it" in said[0]
        assert len(partial) <= cut, f"{len(partial)} conversations judged on part of their turns, {cut} counted"
        if partial:  # a cut is said with what to do, never silent
            assert "completed_by=memory_bound" in text and "free space under --state-dir" in text
        per = Counter((cid, metric) for cid, metric, whole in calls if whole)
        assert len(per) == 2 * CONVERSATIONS  # nothing lost: each conversation judged on its whole transcript
        whole_calls = defaultdict(int)
        for cid, metric, whole in calls:
            whole_calls[(cid, metric)] += whole
        assert max(whole_calls.values()) == 1  # and once

        # -- the volume grows: the store writes again, without a restart -------------------------------------------
        before = {c.parent.name: c.stat().st_mtime_ns for c in tiny_disk.path.glob("*/*/*/.checkpoint")}
        grown = time.monotonic()
        tiny_disk.grow(GROWN)
        wait_for(lambda: recovered_partitions(log) == {0, 1, 2}, timeout=60, what="every store writing again")
        recovered = time.monotonic() - grown
        errors_recovered = replica.metric("tracejudge_state_store_errors_total", reason="disk_full")
        backlog(broker, topic, "again")
        wait_for(lambda: whole_everywhere(judge_server, "again"), timeout=300, what="the second backlog judged")
        barrier(broker, topic, judge_server, "again-")
        again = judged(judge_server, "again")
        errors_after = replica.metric("tracejudge_state_store_errors_total", reason="disk_full")
        cut_after = replica.metric("tracejudge_conversations_completed_total", completed_by="memory_bound")
        print(
            f"grown to {GROWN}: every partition's store wrote again {recovered:.2f}s after the remount;"
            f" second backlog: {len(again)} judge calls,"
            f" {tiny_disk.used_kib()} KiB used; store errors {errors:.0f}, {errors_recovered:.0f} when recovered,"
            f" {errors_after:.0f} after it;"
            f" cut {cut:.0f} -> {cut_after:.0f}"
        )
        assert replica.process.poll() is None  # the same process throughout
        assert all(whole for _, _, whole in again), "a conversation of the second backlog judged on part of it"
        assert len(again) == 2 * CONVERSATIONS
        assert cut_after == cut  # the bound spilled to disk again: nothing cut
        assert errors_after == errors_recovered  # none since: the store took the second backlog
        after = {c.parent.name: c.stat().st_mtime_ns for c in tiny_disk.path.glob("*/*/*/.checkpoint")}
        assert len(after) == 3 and all(ns > before.get(p, 0) for p, ns in after.items())  # every store checkpointed
    finally:
        replica.stop("kill")
