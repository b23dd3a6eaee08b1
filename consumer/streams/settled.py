"""The verdicts a judge worker settled, by transcript: a replayed job is answered from them, not judged (and paid)
again.

A crash between a job's send and the assembler's commit replays the conversation into a second job for the same
transcript (same content id, so same result id). A copy read while the first is being judged waits for its verdict
(`following`); one read after it gets the remembered outcome at once. Only a `judged` outcome is remembered: a
failure or a budget skip is not a verdict, and a later copy is judged. Judge-thread state only.
"""

from __future__ import annotations

from collections import OrderedDict

from ..conversation.job import JudgeJob
from ..judging.judgement import OUTCOME_JUDGED, Judgement

SETTLED_MEMORY = 65_536  # transcripts whose verdicts this worker remembers
WAITS = "waits"  # `admit`: the job is a copy of one in flight, answered with its verdict when it comes


class SettledJudgements:
    def __init__(self, memory: int = SETTLED_MEMORY) -> None:
        self.memory = memory
        self._settled: OrderedDict[str, str] = OrderedDict()  # content id → outcome delivered by this worker
        # content id in flight → (its job's key, whether it is forced, the later copies waiting for it)
        self._following: dict[str, tuple[str, bool, list[JudgeJob]]] = {}

    def admit(self, job: JudgeJob) -> str | None:
        """None: the first job for its transcript here (judge it). WAITS: a copy of the one in flight. Else the
        outcome to answer it with now. A forced job (negative feedback: judged whatever the budget) never waits for
        an unforced one, which may end skipped for budget."""
        if not job.content_id:
            return None
        following = self._following.get(job.content_id)
        if following is not None and (following[1] or not job.negative_feedback):
            following[2].append(job)
            return WAITS
        outcome = self._settled.get(job.content_id)
        if outcome is not None:
            self._settled.move_to_end(job.content_id)
            return outcome
        if following is None:
            self._following[job.content_id] = (job.key, job.negative_feedback, [])
        return None

    def settle(self, judgement: Judgement) -> list[JudgeJob]:
        """Remember a delivered verdict; the copies that waited for it (none unless it is the admitted first)."""
        job = judgement.job
        entry = self._following.get(job.content_id)
        if entry is None or entry[0] != job.key:
            return []
        del self._following[job.content_id]
        if judgement.outcome == OUTCOME_JUDGED:
            self._settled[job.content_id] = judgement.outcome
            while len(self._settled) > self.memory:
                self._settled.popitem(last=False)
        return entry[2]

    def forget(self, partitions: set[int]) -> None:
        """The transcripts in flight on partitions that moved away (their copies are on the same partition): one
        cancelled with its partition (batch tier) never finishes, and its copies must not wait for it."""
        for content, (key, _forced, _copies) in list(self._following.items()):
            if int(key.partition(":")[0]) in partitions:
                del self._following[content]
