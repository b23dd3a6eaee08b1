"""The judge pool: an asyncio loop on its own thread, so the Kafka poll loop never waits for a judge.

Concurrency cap, requests-per-minute token bucket and a USD-per-hour budget; every finished job is handed back
through `on_done` (called on the pool's thread; receivers must be thread-safe).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tracejudge.metrics import ConversationalEvalTestCase, EvalTestCase, MetricResult
from tracejudge.metrics._judge import HolisticJudgeMetric

from .sessions import JudgeJob

logger = logging.getLogger("tracejudge.consumer.pool")

OUTCOME_JUDGED = "judged"
OUTCOME_FAILED = "failed"
OUTCOME_SAMPLED_OUT = "sampled_out"
OUTCOME_SKIPPED_BUDGET = "skipped_budget"


@dataclass(slots=True)
class Judgement:
    job: JudgeJob
    outcome: str
    results: list[MetricResult] = field(default_factory=list)
    judged_at: float = field(default_factory=time.time)


class TokenBucket:
    """Requests per minute, smoothed: capacity one minute's worth, refilled continuously."""

    def __init__(self, per_minute: float | None) -> None:
        self.rate = (per_minute or 0) / 60.0
        self.capacity = float(per_minute or 0)
        self.tokens = self.capacity
        self.updated = time.monotonic()

    async def acquire(self) -> None:
        if self.rate <= 0:
            return
        while True:
            now = time.monotonic()
            self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
            if self.tokens >= 1:
                self.tokens -= 1
                return
            await asyncio.sleep((1 - self.tokens) / self.rate)


class SpendWindow:
    """Judge spend over the last hour; the budget refills as old spend slides out of the window."""

    def __init__(self, max_per_hour: float | None, window_s: float = 3600.0) -> None:
        self.max_per_hour = max_per_hour
        self.window_s = window_s
        self._entries: deque[tuple[float, float]] = deque()
        self._total = 0.0
        self._lock = threading.Lock()

    def record(self, cost: float) -> None:
        if cost <= 0:
            return
        with self._lock:
            self._entries.append((time.monotonic(), cost))
            self._total += cost

    def spent(self) -> float:
        with self._lock:
            cutoff = time.monotonic() - self.window_s
            while self._entries and self._entries[0][0] < cutoff:
                self._total -= self._entries.popleft()[1]
            return max(0.0, self._total)

    @property
    def exhausted(self) -> bool:
        return self.max_per_hour is not None and self.spent() >= self.max_per_hour


class JudgePool:
    def __init__(
        self,
        metrics: Sequence[HolisticJudgeMetric],
        on_done: Callable[[Judgement], None],
        *,
        max_concurrency: int = 16,
        max_requests_per_minute: float | None = None,
        max_cost_per_hour: float | None = None,
        on_call: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.metrics = list(metrics)
        self.on_done = on_done
        self.on_call = on_call
        self.max_concurrency = max_concurrency
        self.bucket = TokenBucket(max_requests_per_minute)
        self.budget = SpendWindow(max_cost_per_hour)
        self.in_flight = 0
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="tracejudge-judges", daemon=True)
        self._slots: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting = True

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet finished (queued for a slot or being judged)."""
        with self._pending_lock:
            return self._pending

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._slots = asyncio.Semaphore(self.max_concurrency)
        self._loop.run_forever()

    def start(self) -> JudgePool:
        self._thread.start()
        return self

    def submit(self, job: JudgeJob) -> None:
        """Thread-safe and non-blocking."""
        if not self._accepting:
            raise RuntimeError("the judge pool is stopping")
        with self._pending_lock:
            self._pending += 1
        self._loop.call_soon_threadsafe(self._spawn, job)

    def _spawn(self, job: JudgeJob) -> None:
        task = self._loop.create_task(self._judge(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _evaluate(self, metric: HolisticJudgeMetric, case: ConversationalEvalTestCase) -> MetricResult:
        assert self._slots is not None
        async with self._slots:
            await self.bucket.acquire()
            self.in_flight += 1
            try:
                result = await metric.evaluate(case)
            finally:
                self.in_flight -= 1
        if result.cost_usd:
            self.budget.record(result.cost_usd)
        if self.on_call is not None:
            self.on_call(metric.name, result.error is None)
        return result

    async def _judge(self, job: JudgeJob) -> None:
        try:
            if self.budget.exhausted:
                judgement = Judgement(job, OUTCOME_SKIPPED_BUDGET)
            else:
                case = ConversationalEvalTestCase(
                    name=job.conversation_id,
                    turns=[
                        EvalTestCase(input=t.input or "", actual_output=t.output or "") for t in job.judgeable_turns
                    ],
                )
                results = list(await asyncio.gather(*(self._evaluate(m, case) for m in self.metrics)))
                outcome = OUTCOME_JUDGED if all(r.error is None for r in results) else OUTCOME_FAILED
                judgement = Judgement(job, outcome, results)
            try:
                self.on_done(judgement)
            except Exception:
                logger.exception("handling a finished judgement failed (conversation %s)", job.conversation_id)
        finally:
            with self._pending_lock:
                self._pending -= 1

    def stop(self, grace_s: float = 30.0) -> bool:
        """Stop accepting; let in-flight judgements finish within the grace period; True when all finished."""
        self._accepting = False
        if not self._thread.is_alive():
            return True
        deadline = time.monotonic() + grace_s
        while self.pending and time.monotonic() < deadline:
            time.sleep(0.05)
        finished = self.pending == 0

        def cancel_all() -> None:
            for task in list(self._tasks):
                task.cancel()

        self._loop.call_soon_threadsafe(cancel_all)
        time.sleep(0.05)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        return finished
