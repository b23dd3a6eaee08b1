"""A sign of life after `ready`: one INFO line per verdict, folded into one summary line a minute above a rate.

An operator watching the consumer's log sees each verdict with its reason as it is made (conversation, agent, judge,
verdict, the reason cut short); a busy consumer must not bury its other lines under them, so a minute that holds more
than `per_minute` verdicts logs its first `per_minute` one by one and then one summary line (counts per agent, judge
and verdict), and the minutes after it log the summary alone until a minute falls back under the rate. The summary of
a minute is logged when the minute is over (a timer armed by the first verdict folded; the next verdict or `close()`
would otherwise be the first to notice), never held until traffic returns.

Only final production verdicts are lines: a judge's verdict, or `failed` with its error; a shadow judge's results,
sampled-out and skipped conversations and a failure waiting for its retry are not verdicts (the metrics count them).
Logged under `tracejudge.consumer.verdicts`, so `--log-level` or a logging config can silence these lines alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from tracejudge._shared.text import valid_unicode

from ..judging.judgement import OUTCOME_FAILED, OUTCOME_JUDGED, Judgement

logger = logging.getLogger("tracejudge.consumer.verdicts")
PER_MINUTE = 20  # verdicts a minute logged one by one; above it, one summary line a minute
WINDOW_S = 60.0
REASON_CHARS = 100


class Cancellable(Protocol):
    def cancel(self) -> None: ...


def _timer(delay_s: float, callback: Callable[[], None]) -> Cancellable:
    timer = threading.Timer(delay_s, callback)
    timer.name = "tracejudge-verdict-log"
    timer.daemon = True
    timer.start()
    return timer


def safe(text: object) -> str:
    """Printable in any log: a record may name a conversation or agent with a lone surrogate, which a UTF-8 stream
    (and a test runner's report) cannot encode: replaced, never raised."""
    return valid_unicode(str(text))


def short(text: str | None, limit: int = REASON_CHARS) -> str:
    """One line of at most `limit` characters (a judge's reason may hold newlines: a log line must stay one line)."""
    flat = " ".join(safe(text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def verdicts_of(judgement: Judgement) -> list[tuple[str, str, str]]:
    """(judge, verdict, reason) of each final production verdict in `judgement`: a result without a verdict (as
    `tracejudge_verdicts_total` leaves it out) is `failed` with its error."""
    if judgement.outcome not in (OUTCOME_JUDGED, OUTCOME_FAILED):
        return []
    if not judgement.results:
        return [("-", "failed", "failed before the judge call")] if judgement.outcome == OUTCOME_FAILED else []
    verdicts = []
    for result in judgement.results:
        if result.error is None and result.score is not None and result.verdict is not None:
            about = f"[{result.failure_mode}] " if result.failure_mode else ""  # what a failing verdict is about
            verdicts.append((result.name, str(result.verdict), about + result.reason))
        else:
            verdicts.append((result.name, "failed", f"{result.error_kind or 'error'}: {result.error or 'no verdict'}"))
    return verdicts


class VerdictLog:
    """A sink (`Delivery`'s `JudgementSink`): logs, returns nothing to wait for (a log line is not a durable output).

    `clock` (monotonic seconds) and `schedule(delay_s, callback)` are injectable so a test drives the minutes."""

    def __init__(
        self,
        *,
        per_minute: int = PER_MINUTE,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        schedule: Callable[[float, Callable[[], None]], Cancellable] = _timer,
        log: logging.Logger = logger,
    ) -> None:
        self.per_minute = per_minute
        self.window_s = window_s
        self.clock = clock
        self.schedule = schedule
        self.log = log
        self._lock = threading.Lock()  # emit runs on the pool thread, the summary on the timer's
        self._start: float | None = None  # when this minute began (its first verdict)
        self._folding = False  # the minute before was above the rate: this one logs its summary alone
        self._folding_until = 0.0  # ... if it starts before this (a quiet minute between: one line a verdict again)
        self._total = 0
        self._logged = 0
        self._counts: dict[str, Counter[str]] = {"agent": Counter(), "judge": Counter(), "verdict": Counter()}
        self._timer: Cancellable | None = None
        self._closed = False

    def emit(self, judgement: Judgement) -> None:
        verdicts = verdicts_of(judgement)
        if not verdicts:
            return
        job = judgement.job
        with self._lock:
            now = self.clock()
            self._roll(now)
            if self._start is None:
                self._start = now
                if self._folding and now >= self._folding_until:  # rolled by the timer, then a quiet minute
                    self._folding = False
            for judge, verdict, reason in verdicts:
                self._total += 1
                self._counts["agent"][job.agent] += 1
                self._counts["judge"][judge] += 1
                self._counts["verdict"][verdict] += 1
                if not self._folding and self._logged < self.per_minute:
                    self._logged += 1
                    self.log.info(
                        "verdict: conversation %s agent %s judge %s verdict %s: %s",
                        safe(job.conversation_id),
                        safe(job.agent),
                        safe(judge),
                        safe(verdict),
                        short(reason) or "(no reason given)",
                    )
                elif self._timer is None and not self._closed:
                    self._timer = self.schedule(max(0.0, self._start + self.window_s - now), self.flush)

    def flush(self) -> None:
        """The timer's: the minute that is over gets its summary line."""
        with self._lock:
            self._timer = None
            now = self.clock()
            self._roll(now)
            if self._start is not None and self._total > self._logged and not self._closed:  # woken early: again
                self._timer = self.schedule(max(0.0, self._start + self.window_s - now), self.flush)

    def close(self) -> None:
        """At shutdown: the minute under way gets its summary (when it folded anything), no timer outlives us."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._start is not None:
                self._summary(self.clock() - self._start)
            self._reset(folding=False)

    def _roll(self, now: float) -> None:
        """When the minute is over: its summary if it folded any verdict; the next minute folds if this one was
        above the rate and follows it at once (a quiet minute between: back to one line a verdict)."""
        if self._start is None or now - self._start < self.window_s:
            return
        elapsed = now - self._start
        self._summary(self.window_s)
        self._folding_until = self._start + 2 * self.window_s
        self._reset(folding=self._total > self.per_minute and elapsed < 2 * self.window_s)

    def _summary(self, seconds: float) -> None:
        folded = self._total - self._logged
        if folded <= 0:
            return

        def counts(what: str) -> str:
            return ", ".join(f"{safe(name)} {count}" for name, count in self._counts[what].most_common())

        logged = f"the first {self._logged} logged above, " if self._logged else ""
        self.log.info(
            "verdicts: %d in the last %.0f s (%s%d folded into this line: up to %d a minute are logged one by one); "
            "by agent: %s; by judge: %s; by verdict: %s",
            self._total,
            seconds,
            logged,
            folded,
            self.per_minute,
            counts("agent"),
            counts("judge"),
            counts("verdict"),
        )

    def _reset(self, *, folding: bool) -> None:
        self._start = None
        self._folding = folding
        self._total = self._logged = 0
        for counter in self._counts.values():
            counter.clear()
