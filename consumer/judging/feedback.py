"""Human feedback joined to verdicts: does the judge's pass/fail agree with the user's thumbs up/down?

Feedback may arrive before the verdict (it waits) or after it (the verdict waits), within a bounded retention.
Called from the poll thread (feedback) and the pool thread (verdicts), hence the lock.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ..adapters import Feedback
from .judgement import Judgement

DEFAULT_RETENTION_S = 3600.0
MAX_REMEMBERED = 100_000


@dataclass(frozen=True, slots=True)
class Agreement:
    agent: str
    metric: str
    judge_passed: bool
    human_positive: bool

    @property
    def agrees(self) -> bool:
        return self.judge_passed == self.human_positive


class FeedbackJoiner:
    def __init__(self, on_agreement: Callable[[Agreement], None], *, retention_s: float = DEFAULT_RETENTION_S) -> None:
        self.on_agreement = on_agreement
        self.retention_s = retention_s
        self._verdicts: OrderedDict[str, tuple[float, str, dict[str, bool]]] = OrderedDict()
        self._pending: OrderedDict[str, tuple[float, str, list[Feedback]]] = OrderedDict()
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def _expire(self, now: float) -> None:
        for store in (self._verdicts, self._pending):
            while store and now - next(iter(store.values()))[0] > self.retention_s:
                store.popitem(last=False)
            while len(store) > MAX_REMEMBERED:
                store.popitem(last=False)

    def feedback(self, conversation_id: str, agent: str, feedback: Feedback, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        joined: list[Agreement] = []
        with self._lock:
            key = f"{conversation_id}\x00{feedback.span_id}"
            if key in self._seen:  # a redelivered feedback span counts once
                return
            self._seen.add(key)
            if len(self._seen) > MAX_REMEMBERED:
                self._seen.clear()
            self._expire(now)
            verdicts = self._verdicts.get(conversation_id)
            if verdicts is not None:
                joined = self._agreements(verdicts[1], verdicts[2], [feedback])
            else:
                _, pending_agent, items = self._pending.pop(conversation_id, (now, agent, []))
                items.append(feedback)
                self._pending[conversation_id] = (now, pending_agent or agent, items[-20:])
        for agreement in joined:
            self.on_agreement(agreement)

    def verdicts(self, judgement: Judgement, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        passed = {r.name: r.success for r in judgement.results if r.error is None}
        if not passed:
            return
        conversation_id, agent = judgement.job.conversation_id, judgement.job.agent
        with self._lock:
            self._expire(now)
            self._verdicts.pop(conversation_id, None)
            self._verdicts[conversation_id] = (now, agent, passed)
            pending = self._pending.pop(conversation_id, None)
            joined = self._agreements(agent, passed, pending[2]) if pending else []
        for agreement in joined:
            self.on_agreement(agreement)

    @staticmethod
    def _agreements(agent: str, passed: dict[str, bool], feedback: list[Feedback]) -> list[Agreement]:
        return [
            Agreement(agent, metric, judge_passed, not item.negative)
            for item in feedback
            for metric, judge_passed in passed.items()
        ]
