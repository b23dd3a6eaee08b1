"""The judge pool: an asyncio loop on its own thread, so the Kafka poll loop never waits for a judge.

Concurrency cap, requests-per-minute token bucket and a USD-per-hour budget (each call made by the metrics layer's
`JudgeRunner`, as every runner makes them); every finished job is handed back through `on_done` (called on the pool's
thread; receivers must be thread-safe).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence

from tracejudge.metrics import ConversationalEvalTestCase, EvalTestCase, HolisticJudgeMetric, MetricResult
from tracejudge.metrics.runner import JudgeRunner, SpendWindow
from tracejudge.metrics.tiers import TIER_BATCH

from ..conversation.job import JudgeJob
from .judgement import OUTCOME_FAILED, OUTCOME_JUDGED, OUTCOME_SKIPPED_BUDGET, Judgement

logger = logging.getLogger("tracejudge.consumer.judging.pool")


class JudgePool:
    def __init__(
        self,
        judges: Sequence[HolisticJudgeMetric],
        on_done: Callable[[Judgement], None],
        *,
        max_concurrency: int = 16,
        max_requests_per_minute: float | None = None,
        max_cost_per_hour: float | None = None,
        shadow_judges: Sequence[HolisticJudgeMetric] = (),
        shadow_sample_rate: float = 0.0,
        shadow_budget_share: float = 0.0,
    ) -> None:
        self.judges = list(judges)
        # The shadow judge: its own share of the budget (the primary keeps the rest), its own deterministic sample.
        self.shadow_judges = list(shadow_judges)
        self.shadow_sample_rate = shadow_sample_rate
        self.shadow_budget_share = shadow_budget_share if self.shadow_judges else 0.0
        self.shadow_budget = SpendWindow(None)
        self.on_done = on_done
        self.max_concurrency = max_concurrency
        self.budget = SpendWindow(max_cost_per_hour)
        self.set_budget(max_cost_per_hour)
        # Primary, canary and shadow calls share its concurrency slots and rate limit; the shadow has its own budget.
        self.runner = JudgeRunner(max_concurrency, max_requests_per_minute, budget=self.budget)
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="tracejudge-judges", daemon=True)
        self._tasks: set[asyncio.Task[None]] = set()
        self._jobs: dict[asyncio.Task[None], JudgeJob] = {}
        self._accepting = True

    def set_budget(self, max_per_hour: float | None) -> None:
        """This worker's USD per hour, split between the primary (and canary) calls and the shadow's share."""
        if max_per_hour is None:
            self.budget.max_per_hour = self.shadow_budget.max_per_hour = None
            return
        self.shadow_budget.max_per_hour = max_per_hour * self.shadow_budget_share
        self.budget.max_per_hour = max_per_hour - self.shadow_budget.max_per_hour

    def shadows(self, job: JudgeJob) -> bool:
        """A deterministic sample of the judged conversations, independent of the primary's (a salted hash)."""
        from .sampling import sample_point

        return bool(self.shadow_judges) and sample_point(f"shadow\x1f{job.conversation_id}") < self.shadow_sample_rate

    def evaluate_side(
        self, calls: Sequence[tuple[HolisticJudgeMetric, ConversationalEvalTestCase]]
    ) -> concurrent.futures.Future[list[MetricResult | None]]:
        """Judge calls that make no production verdict (the canary), on the pool's loop: the same concurrency
        slots, rate limit and budget as live calls; None for a call the budget refused."""

        async def run() -> list[MetricResult | None]:
            return list(await asyncio.gather(*(self._evaluate(j, case, force=False) for j, case in calls)))

        return asyncio.run_coroutine_threadsafe(run(), self._loop)

    @property
    def in_flight(self) -> int:
        """Judge calls under way (admitted by the budget, not yet settled)."""
        return self.runner.in_flight

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet finished (queued for a slot or being judged)."""
        with self._pending_lock:
            return self._pending

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
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
        self._jobs[task] = job
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda done: self._jobs.pop(done, None))

    @property
    def batched(self) -> bool:
        """Every production judge is at the batch tier: a judgement in flight waits for a batch, not for a call."""
        return bool(self.judges) and all(
            getattr(getattr(j, "backend", None), "tier", None) == TIER_BATCH for j in self.judges
        )

    def abandon(self, partitions: set[int]) -> None:
        """Cancel the judgements of jobs from these judge-queue partitions (thread-safe). For a batch-tier pool on
        revocation: they wait for a batch the partitions' new owner waits for too (it reads the batch records), so
        finishing them here would deliver every verdict twice; nothing paid is lost, the batch goes on."""

        def cancel() -> None:
            for task, job in list(self._jobs.items()):
                if job.partition in partitions:
                    task.cancel()

        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(cancel)

    async def _evaluate(
        self,
        judge: HolisticJudgeMetric,
        case: ConversationalEvalTestCase,
        *,
        force: bool,
        budget: SpendWindow | None = None,
    ) -> MetricResult | None:
        """One judge call, or None when the budget (the pool's, or `budget`) refuses it."""
        return await self.runner.run(judge, case, force=force, budget=budget)

    async def _judge(self, job: JudgeJob) -> None:
        try:
            try:
                case = ConversationalEvalTestCase(
                    name=job.conversation_id,
                    turns=[
                        EvalTestCase(input=t.input or "", actual_output=t.output or "") for t in job.judgeable_exchanges
                    ],
                )
                # Negative feedback is judged whatever the budget (as whatever the sample rate); its cost still counts.
                force = job.negative_feedback
                shadow = self.shadows(job) and bool(job.judgeable_exchanges)
                shadow_calls = [
                    self._evaluate(j, case, force=False, budget=self.shadow_budget)
                    for j in (self.shadow_judges if shadow else ())
                ]
                everything = await asyncio.gather(
                    *(self._evaluate(j, case, force=force) for j in self.judges), *shadow_calls
                )
                calls, shadowed = everything[: len(self.judges)], everything[len(self.judges) :]
                results = [r for r in calls if r is not None]
                if len(results) < len(calls):
                    outcome = OUTCOME_SKIPPED_BUDGET  # the results of calls made before the budget ran out are kept
                else:
                    outcome = OUTCOME_JUDGED if all(r.error is None for r in results) else OUTCOME_FAILED
                judgement = Judgement(job, outcome, results)
                for judge, shadow_result in zip(self.shadow_judges, shadowed, strict=False):
                    if shadow_result is None:  # its budget share is spent: counted, never a verdict
                        shadow_result = MetricResult(
                            name=judge.name,
                            threshold=judge.threshold,
                            model=judge.model_name,
                            result_key=judge.result_key,
                        )
                        shadow_result.error, shadow_result.error_kind = "skipped: shadow budget share spent", "budget"
                    judgement.shadow_results.append(shadow_result)
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
