"""One judge call under the limits every runner shares: concurrency slot -> rate limit -> budget -> evaluate -> settle.

The judge pool (`consume`), `tracejudge calibrate`, `evaluate_conversations` and the eval_lib compatibility API all
make their judge calls through `JudgeRunner`; they differ only in what they pass it (a budget, a rate, a call that
turns a metric's exception into a failed result, one-at-a-time calls of a foreign metric).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ._cases import ConversationalEvalTestCase
    from ._judge import HolisticJudgeMetric
    from ._results import MetricResult

R = TypeVar("R")


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
    call's zero would lower it); before any call settled it is the call's own `prior`
    (`HolisticJudgeMetric.estimated_cost`: at the batch tier its prompt at the batch price, where the first settle can
    be an hour away; elsewhere 0, so the overshoot is at most the calls in flight at that moment).
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

    def reserve(self, *, force: bool = False, prior: float = 0.0) -> bool:
        """Admit one call now (True) or refuse it for budget (False); `force` admits it anyway (still counted).
        `prior`: the call's own estimate (its prompt at the tier's prices), used until a call has settled."""
        with self._lock:
            estimate = sum(self._recent) / len(self._recent) if self._recent else prior
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


def _cost_usd(result: MetricResult) -> float:
    return result.cost_usd or 0.0


class JudgeRunner:
    """Makes judge calls, each under a concurrency slot, the requests-per-minute bucket and a budget.

    The budget is decided after the slot and the rate limit, so every call already in flight is counted (a burst
    cannot all pass an earlier check). One runner belongs to one event loop (its semaphore and locks bind to it).
    """

    def __init__(
        self,
        max_concurrency: int = 16,
        max_requests_per_minute: float | None = None,
        max_cost_per_hour: float | None = None,
        *,
        budget: SpendWindow | None = None,
    ) -> None:
        """`budget`: a SpendWindow shared with the caller (which may change its cap); else one of
        `max_cost_per_hour` (None: no cap, spend still recorded)."""
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self.max_concurrency = max_concurrency
        self.bucket = TokenBucket(max_requests_per_minute)
        self.budget = SpendWindow(max_cost_per_hour) if budget is None else budget
        self.in_flight = 0  # calls admitted by the budget and not yet settled
        self._slots = asyncio.Semaphore(max_concurrency)
        self._turns: dict[int, asyncio.Lock] = {}

    async def run(
        self,
        judge: HolisticJudgeMetric,
        case: ConversationalEvalTestCase,
        *,
        force: bool = False,
        budget: SpendWindow | None = None,
    ) -> MetricResult | None:
        """`judge.evaluate(case)`, or None when the budget refuses it; an exception from the judge propagates."""
        return await self.call(judge, case, lambda: judge.evaluate(case), _cost_usd, force=force, budget=budget)

    async def call(
        self,
        judge: Any,
        case: Any,
        evaluate: Callable[[], Awaitable[R]],
        cost: Callable[[R], float | None] | None = None,
        *,
        force: bool = False,
        budget: SpendWindow | None = None,
        serial: bool = False,
    ) -> R | None:
        """`evaluate()` for `judge` on `case`, or None when the budget refuses it; `cost(result)` settles it (no
        `cost`: settled with none, for a runner without a budget, whose results may be anyone's).

        `force`: admitted whatever the budget (still counted). `budget`: another window than the runner's (the
        shadow judge's share). `serial`: this judge is called for one case at a time, its turn taken before a slot
        (so calls waiting on it hold no slot another judge could use). The judge's `estimated_cost(case)` is read
        (and its backend warmed up for it) only when the budget has a cap.
        """
        budget = self.budget if budget is None else budget
        async with self._turn(judge) if serial else contextlib.nullcontext():
            async with self._slots:
                await self.bucket.acquire()
                prior = 0.0
                if budget.max_per_hour is not None:  # the prior estimate reads LiteLLM's price map: imported first
                    if budget.estimate == 0:
                        with contextlib.suppress(Exception):  # a failed import is the call's own failure, reported
                            await judge.backend.warm_up()
                    estimate = getattr(judge, "estimated_cost", None)  # a duck-typed judge may have none
                    prior = estimate(case) if estimate is not None else 0.0
                if not budget.reserve(force=force, prior=prior):
                    return None
                self.in_flight += 1
                settled: float | None = None
                try:
                    result = await evaluate()
                    settled = None if cost is None else cost(result)
                finally:
                    self.in_flight -= 1
                    budget.settle(settled)
        return result

    def _turn(self, judge: Any) -> asyncio.Lock:
        return self._turns.setdefault(id(judge), asyncio.Lock())
