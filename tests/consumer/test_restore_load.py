"""A restore loads the same table whichever way it reads the states (issue 31): a fresh disk loads the changelog's
states as read (ordered by their activity fields alone), a checkpointed store is read back from RocksDB, a task
without a store keeps everything in memory, and each equals what the previous loader (every state decoded whole to
order it, then read back from the store) gave, over one mixed changelog: MessagePack and JSON states, a state only
JSON can carry, overwrites, tombstones, an unreadable state and the positions records."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tracejudge.consumer.adapters import Turn
from tracejudge.consumer.conversation.store import decode as store_decode
from tracejudge.consumer.conversation.table import COMPLETED, OPEN, ConversationState
from tracejudge.consumer.streams import records as R
from tracejudge.consumer.streams.task import Task

from .test_review_state import assembler


def state(cid: str, last_ms: int, *, status: str = OPEN, completed_ms: int | None = None, **extra: Any) -> Any:
    turns = {f"{cid}-s{n}": Turn(f"{cid}-s{n}", "t", "", n, n + 1, f"q{n} {cid}", "a", index=n) for n in range(2)}
    return ConversationState(
        id=cid,
        first_ms=last_ms - 5,
        last_ms=last_ms,
        agent="a",
        spans=turns,
        status=status,
        completed_ms=completed_ms,
        **extra,
    )


def changelog() -> list[SimpleNamespace]:
    """Records as the changelog holds them, in offset order."""
    out: list[tuple[str | None, bytes, bytes | None]] = []

    def put(value: ConversationState) -> None:
        kind, raw = R.encode_state(value)
        out.append((kind, value.id.encode("utf-8", "surrogatepass"), raw))

    for n in range(12):  # ids in one order, activity in another
        put(state(f"c{n:02d}", 5_000 - 300 * n + (n % 3) * 1_000))
    put(state("done-late", 900, status=COMPLETED, completed_ms=9_500, dispatched={"x": "judged"}))  # idle long
    put(state("done-early", 1_000, status=COMPLETED, completed_ms=1_200, dispatched={"y": None}))
    put(state("done-zero", 7_000, status=COMPLETED, completed_ms=0))  # completed_ms falsy: its last record counts
    put(state("ending", 4_200, end_due_ms=4_900, ended=True))
    json_state = state("json", 3_100, dropped_span_ids=["d1", "d2"])
    out.append((R.STATE, b"json", R.dumps(json_state.to_json())))  # as an older version wrote it
    put(state("lone-\ud800", 2_500))  # only JSON carries a lone surrogate
    assert out[-1][0] == R.STATE
    put(state("c01", 8_800))  # overwritten: the latest record wins
    out.append((R.STATE_PACKED, b"c02", None))  # forgotten
    out.append((R.STATE_PACKED, b"c03", None))
    put(state("c03", 6_100, status=COMPLETED, completed_ms=6_150))  # forgotten, then back
    out.append((R.STATE_PACKED, b"never-seen", None))
    out.append((R.STATE_PACKED, b"garbage", b"\xc1\xc1"))  # unreadable: costs that conversation only
    out.append((R.STATE, b"garbage-json", b"{not json"))
    out.append((R.EVENTS, b"c04", b"{}"))  # not a state: ignored
    records = [
        SimpleNamespace(key=key, value=value, headers=R.header(kind) if kind else [], partition=0, offset=i)
        for i, (kind, key, value) in enumerate(out)
    ]
    positions = [
        {"repartition": 7, "watermark": 4_000, "sources": {"0": 3_000, "1": 3_500}},
        {"repartition": 11, "watermark": 3_900, "sources": {"1": 4_100, "2": 100}},
    ]
    for i, value in zip((5, len(records)), positions, strict=True):
        records.insert(i, SimpleNamespace(key=R.POSITIONS_KEY, value=R.dumps(value), headers=R.header(R.POSITIONS)))
    for offset, record in enumerate(records):
        record.partition, record.offset = 0, offset
    return records


def old_load(asm: Any, task: Task, open_elsewhere: int) -> None:
    """The loader this change replaced: the tail into the store, every stored state decoded whole to order them,
    then each read back from the store and decoded again."""
    restored, task.restored = task.restored, {}
    assert task.store is not None and asm.state._store_tail(task, restored)
    order = []
    for cid, value in task.store.items():
        try:
            found = store_decode(value)
        except Exception:
            continue
        order.append(((found.completed_ms or found.last_ms) if found.status != OPEN else found.last_ms, cid))
    order.sort()
    for _, cid in order:
        loaded = task.store.get(cid)
        assert loaded is not None
        resident = not asm.state.memory.over and (
            loaded.status != OPEN
            or open_elsewhere + task.table.resident_open_count < asm.settings.max_open_conversations
        )
        task.table.restore(loaded, cid, resident=resident)


def restore(asm: Any, task: Task, *, old: bool = False) -> Task:
    records = changelog()
    for record in records:
        asm.state.restore(task, record)
    task.changelog_position = len(records)
    if old:
        old_load(asm, task, 0)
    else:
        asm.state._load_restored(task, 0)
    return task


def view(task: Task) -> dict[str, Any]:
    table = task.table
    return {
        "states": dict(table.states),
        "dropped": {cid: set(s._dropped) for cid, s in table.states.items()},
        "open": list(table._open),
        "completed": list(table._completed),
        "ending": dict(table._ending),
        "spilled": set(table._spilled),
        "spilled_open": table._spilled_open,
        "positions": (task.repartition_position, task.watermark_ms, dict(task.sources)),
        "stored": None if task.store is None else dict(task.store.items()),
    }


def fresh(asm: Any, partition: int) -> Task:
    task = asm.state.new_task(partition)
    assert task.store is not None and task.checkpointed is None
    return task


def checkpointed(asm: Any, partition: int) -> Task:
    """A task over a store with a checkpoint at the changelog's start (empty): the store-reading loader."""
    asm.state.close_task(asm.state.new_task(partition))  # the partition's store exists, empty
    asm.state.directory.write_checkpoint(partition, 0, {})
    task = asm.state.new_task(partition)
    assert task.checkpointed == 0
    return task


@pytest.mark.parametrize(
    ("bound", "options"),
    [
        ("none", {}),
        ("open", {"max_open_conversations": 4}),
        ("bytes", {"max_state_bytes": 3_000}),  # the store-reading loader keeps few values: the rest read back
    ],
)
def test_every_loader_gives_the_table_the_old_one_gave(
    tmp_path: Path, bound: str, options: dict[str, Any], caplog: Any
) -> None:
    def asm(name: str) -> Any:  # one each: the memory bound is the process's, shared by its tables
        return assembler(state_dir=str(tmp_path / name), **options)

    old_asm, fresh_asm, store_asm = asm("old"), asm("fresh"), asm("store")
    with caplog.at_level(logging.WARNING, logger="tracejudge.consumer.streams"):
        expected = view(restore(old_asm, fresh(old_asm, 0), old=True))
        loaded = {
            "fresh disk": view(restore(fresh_asm, fresh(fresh_asm, 0))),
            "checkpointed store": view(restore(store_asm, checkpointed(store_asm, 1))),
        }
    for how, got in loaded.items():
        assert got == expected, how
    unreadable = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(unreadable) == 2, unreadable  # each new loader says it (rate-limited: its first)
    for counted in (fresh_asm, store_asm):  # and counts each unreadable state once
        assert counted.instruments.forgotten.labels(reason="unreadable")._value.get() == 2
    states = expected["states"]
    assert "c02" not in states and "never-seen" not in states and "garbage" not in states
    assert states.get("c01") is None or states["c01"].last_ms == 8_800
    assert expected["positions"] == (11, 4_000, {0: 3_000, 1: 4_100, 2: 100})
    if bound == "open":  # the bound held: the least recently active open ones wait on disk
        assert 0 < expected["spilled_open"] and len(set(expected["open"]) - expected["spilled"]) == 4
    elif bound == "bytes":  # past the byte bound everything else waits on disk
        assert 0 < len(expected["states"]) < 10 and len(expected["spilled"]) > 5
    else:
        assert expected["spilled"] == set()
        activity = [states[cid].last_ms for cid in expected["open"]]
        assert activity == sorted(activity) and len(activity) > 10  # the least recently active first
        memory_only = restore(store_asm, Task(2, store_asm.state.new_table()))  # no store: changelog order, in memory
        got = view(memory_only)
        assert got["states"] == states and sorted(got["open"]) == sorted(expected["open"])
        assert got["completed"] and sorted(got["completed"]) == sorted(expected["completed"])


_LITTER = """
import gc
import sys
import weakref

from tests.consumer import test_restore_load as T

class Cycle:
    pass

made = []
decode = T.R.decode_state

def decode_and_litter(kind, value):
    if not made:  # another thread's garbage, made while the restore loads
        cycle = Cycle()
        cycle.me = cycle
        made.append(weakref.ref(cycle))
    return decode(kind, value)

T.R.decode_state = decode_and_litter
asm = T.assembler(state_dir=sys.argv[1])
T.restore(asm, T.fresh(asm, 0))
assert gc.isenabled() and made and made[0]() is not None, (gc.isenabled(), made)
gc.collect(1)
assert made[0]() is None
print("freed by a young collection")
"""


def test_garbage_made_during_a_restore_is_left_to_the_young_collections(tmp_path: Path) -> None:
    """The collector is off while a restore loads (its passes over the growing heap cost more than the decode) and
    on again afterwards, with what any thread made meanwhile still young: a cycle that became garbage then is freed
    by a young collection (gc.freeze() would have put it in the oldest generation, for the next full one).

    In a process of its own: the collector is process-wide, and a thread an earlier test left behind (a restore of
    its own re-enabling it) made this fail once in a full run."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _LITTER, str(tmp_path)], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "freed by a young collection" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("odd", [None, "soon", True, [1]])
def test_a_json_state_whose_activity_time_is_no_number_costs_that_conversation_only(
    tmp_path: Path, odd: object, caplog: pytest.LogCaptureFixture
) -> None:
    asm = assembler(state_dir=str(tmp_path))
    task = fresh(asm, 0)
    good_kind, good = R.encode_state(state("good", 100))
    data = state("odd", 200).to_json()
    data["last_ms"] = odd  # an older version's JSON, which no schema checked
    for offset, (key, kind, value) in enumerate([(b"good", good_kind, good), (b"odd", R.STATE, R.dumps(data))]):
        asm.state.restore(
            task, SimpleNamespace(key=key, value=value, headers=R.header(kind), partition=0, offset=offset)
        )
    task.changelog_position = 2
    with caplog.at_level(logging.WARNING):
        asm.state.finish_restore(task, 2, 0)
    assert sorted(task.table.states) == ["good"]
    assert "unreadable changelog state of conversation 'odd'" in caplog.text
    assert asm.instruments.forgotten.labels(reason="unreadable")._value.get() == 1


def test_a_store_that_cannot_be_wiped_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store without a checkpoint is wiped before the changelog restores it; one whose wipe failed still holds
    what the changelog may have forgotten (a compacted tombstone), so the task runs without it."""
    from tracejudge.consumer.conversation.store import LocalStore, StoreError, encode

    asm = assembler(state_dir=str(tmp_path))
    first = asm.state.new_task(0)
    assert first.store is not None
    first.store.write([("stale", encode(state("stale", 50)))], [])
    asm.state.close_task(first)  # no checkpoint written

    def refuse(self: LocalStore) -> None:
        raise StoreError("wipe failed", "io")

    monkeypatch.setattr(LocalStore, "wipe", refuse)
    task = asm.state.new_task(0)
    assert task.checkpointed is None and task.store is None
    kind, value = R.encode_state(state("live", 100))
    asm.state.restore(task, SimpleNamespace(key=b"live", value=value, headers=R.header(kind), partition=0, offset=0))
    task.changelog_position = 1
    asm.state.finish_restore(task, 1, 0)
    assert sorted(task.table.states) == ["live"]
