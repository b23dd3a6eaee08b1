"""Review of issue 26 (batch tier): holes found by a reviewer, as failing tests."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.metrics.test_tiers import LABELS, batch_metric, conversation, coordinator, scripted
from tests.support.judge_server import JudgeServer
from tracejudge.metrics.batch import BatchCoordinator, MemoryBatchStore


class Replica(MemoryBatchStore):
    """One replica's view of the shared compacted topic: what it saves, the others learn (as KafkaBatchStore.follow)."""

    def __init__(self, shared: dict[str, dict[str, Any]], peers: list[tuple[Replica, BatchCoordinator]]) -> None:
        super().__init__()
        self.records = shared
        self.peers = peers

    def save(self, record: dict[str, Any]) -> None:
        super().save(record)
        for store, coord in self.peers:
            if store is not self:
                coord.learn(dict(record))


async def test_an_expired_batch_followed_by_two_replicas_after_a_rebalance_is_resubmitted_once(
    judge_server: JudgeServer,
) -> None:
    """Replica A submitted a batch; partition moved to B mid-batch (A's calls cancelled, B asks for the same
    requests and waits for A's batch). The batch expires unanswered: "resubmitted once" -- one retry batch, not one
    per replica (the moved requests would be paid twice)."""
    judge_server.responder = scripted
    judge_server.batch.script.hold.clear()
    judge_server.batch.script.outcomes = ["expired"]
    judge_server.batch.script.expire_after_items = 0
    shared: dict[str, dict[str, Any]] = {}
    peers: list[tuple[Replica, BatchCoordinator]] = []
    store_a, store_b = Replica(shared, peers), Replica(shared, peers)
    a, b = coordinator(store_a), coordinator(store_b)
    peers.extend([(store_a, a), (store_b, b)])
    on_a = [asyncio.ensure_future(batch_metric(a).evaluate(conversation(i))) for i in range(4)]
    for _ in range(500):
        if any(r.get("state") == "submitted" for r in shared.values()):
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("not submitted")
    for call in on_a[:2]:  # partitions 0..1 revoked from A (JudgePool.abandon)
        call.cancel()
    await asyncio.gather(*on_a[:2], return_exceptions=True)
    on_b = [asyncio.ensure_future(batch_metric(b).evaluate(conversation(i))) for i in range(2)]
    for _ in range(250):  # B waits for A's batch (its bodies kept for the resubmission)
        if all(len(batch.bodies) == 2 for batch in b._batches.values()) and b._batches:
            break
        await asyncio.sleep(0.02)
    judge_server.batch.script.hold.set()
    results = await asyncio.wait_for(asyncio.gather(*on_b, *on_a[2:]), 30)
    assert [r.verdict for r in results] == [LABELS[i % 6] for i in (0, 1, 2, 3)]
    assert a.submissions + b.submissions == 2, (a.submissions, b.submissions)
    assert len(judge_server.batch.created) == 2  # the original and ONE resubmission
