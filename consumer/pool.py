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

from tracejudge.metrics import ConversationalEvalTestCase, EvalTestCase, HolisticJudgeMetric, MetricResult

from .conversations import JudgeJob

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
    """Judge spend over the last hour, plus calls in flight; the budget refills as old spend slides out.

    The budget is decided when a call is about to be made: `reserve()` admits it only if what was spent, plus an
    estimate for every call in flight, plus an estimate for this call stays within the budget; `settle()` replaces the
    estimate with the real cost. The estimate is the mean cost of the last settled calls that cost something (a failed
    call's zero would lower it); before any call settled it is unknown (zero), so the overshoot is at most the calls
    in flight at that moment.
    """

    def __init__(self, max_per_hour: float | None, window_s: float = 3600.0, *, sample: int = 64) -> None:
        self.max_per_hour = max_per_hour
        self.window_s = window_s
        self._entries: deque[tuple[float, float]] = deque()
        self._total = 0.0
        self._recent: deque[float] = deque(maxlen=sample)
        self._in_flight = 0
        self.refused = 0
        self._lock = threading.Lock()

    def record(self, cost: float) -> None:
        with self._lock:
            self._record(cost)

    def _record(self, cost: float) -> None:
        if cost > 0:
            self._entries.append((time.monotonic(), cost))
            self._total += cost

    def _spent(self) -> float:
        cutoff = time.monotonic() - self.window_s
        while self._entries and self._entries[0][0] < cutoff:
            self._total -= self._entries.popleft()[1]
        return max(0.0, self._total)

    def spent(self) -> float:
        with self._lock:
            return self._spent()

    @property
    def estimate(self) -> float:
        """The expected cost of the next call: the mean of recent calls that cost something (0 before any)."""
        with self._lock:
            return sum(self._recent) / len(self._recent) if self._recent else 0.0

    def reserve(self, *, force: bool = False) -> bool:
        """Admit one call now (True) or refuse it for budget (False); `force` admits it anyway (still counted)."""
        with self._lock:
            estimate = sum(self._recent) / len(self._recent) if self._recent else 0.0
            committed = self._spent() + self._in_flight * estimate
            if not force and self.max_per_hour is not None and committed + estimate > self.max_per_hour:
                self.refused += 1
                return False
            self._in_flight += 1
            return True

    def settle(self, cost: float | None) -> None:
        """A reserved call is over: its real cost replaces its estimate (None: no cost known, e.g. cancelled)."""
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            if cost is not None and cost > 0:  # a call that cost nothing (failed) says nothing about the next one
                self._recent.append(cost)
                self._record(cost)

    @property
    def exhausted(self) -> bool:
        return self.max_per_hour is not None and self.spent() >= self.max_per_hour


class JudgePool:
    def __init__(
        self,
        judges: Sequence[HolisticJudgeMetric],
        on_done: Callable[[Judgement], None],
        *,
        max_concurrency: int = 16,
        max_requests_per_minute: float | None = None,
        max_cost_per_hour: float | None = None,
    ) -> None:
        self.judges = list(judges)
        self.on_done = on_done
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

    async def _evaluate(
        self, judge: HolisticJudgeMetric, case: ConversationalEvalTestCase, *, force: bool
    ) -> MetricResult | None:
        """One judge call, or None when the budget refuses it: decided here, after the concurrency slot and the
        rate limit, so every call already in flight is counted (a burst cannot all pass an earlier check)."""
        assert self._slots is not None
        async with self._slots:
            await self.bucket.acquire()
            if not self.budget.reserve(force=force):
                return None
            self.in_flight += 1
            cost: float | None = None
            try:
                result = await judge.evaluate(case)
                cost = result.cost_usd or 0.0
            finally:
                self.in_flight -= 1
                self.budget.settle(cost)
        return result

    async def _judge(self, job: JudgeJob) -> None:
        try:
            try:
                case = ConversationalEvalTestCase(
                    name=job.conversation_id,
                    turns=[
                        EvalTestCase(input=t.input or "", actual_output=t.output or "") for t in job.judgeable_turns
                    ],
                )
                # Negative feedback is judged whatever the budget (as whatever the sample rate); its cost still counts.
                force = job.negative_feedback
                calls = await asyncio.gather(*(self._evaluate(j, case, force=force) for j in self.judges))
                results = [r for r in calls if r is not None]
                if len(results) < len(calls):
                    outcome = OUTCOME_SKIPPED_BUDGET  # the results of calls made before the budget ran out are kept
                else:
                    outcome = OUTCOME_JUDGED if all(r.error is None for r in results) else OUTCOME_FAILED
                judgement = Judgement(job, outcome, results)
            except Exception:  # a job that never finishes would hold its partition's offset forever
                logger.exception("judging conversation %s failed", job.conversation_id)
                judgement = Judgement(job, OUTCOME_FAILED)
            try:
                self.on_done(judgement)
            except Exception:
                logger.exception("handling a finished judgement failed (conversation %s)", job.conversation_id)
        finally:
            with self._pending_lock:
                self._pending -= 1

    def stop(self, grace_s: float = 30.0) -> bool:
        """Stop accepting; True when every judgement finished within the grace period.

        As aiokafka closes its fetcher: a drain coroutine on the loop waits for the judgements up to the grace period,
        cancels the rest (and any other task on the loop) and gathers them (their `finally` blocks run), shuts down
        async generators; then the loop stops, the thread is joined and the loop closed. Safe to call twice or before
        `start()`; never from the pool's own thread (an `on_done` callback): the drain would wait on its own loop.
        """
        if threading.current_thread() is self._thread:
            raise RuntimeError("JudgePool.stop() called from the pool's own thread (an on_done callback)")
        self._accepting = False
        if not self._thread.is_alive():
            if not self._loop.is_closed():
                self._loop.close()
            return self.pending == 0

        async def drain() -> bool:
            await asyncio.sleep(0)  # jobs submitted just before the stop get their task first
            tasks: set[asyncio.Task[None]] = set(self._tasks)
            left: set[asyncio.Task[None]] = set()
            if tasks:
                _done, left = await asyncio.wait(tasks, timeout=grace_s)
                for task in left:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            # Tasks the judges' libraries started here (LiteLLM's logging worker): cancelled as asyncio.run does.
            others = asyncio.all_tasks() - {asyncio.current_task()}
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
            await self._loop.shutdown_asyncgens()
            return not left

        finished = False
        try:
            finished = asyncio.run_coroutine_threadsafe(drain(), self._loop).result(grace_s + 5.0)
        except Exception as exc:  # a task that ignores cancellation: the thread is a daemon, the loop left running
            logger.warning("stopping the judge pool: %r", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()
        return finished
