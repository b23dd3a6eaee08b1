"""Deterministic sampling: a hash of the conversation id against the rate, so every replica and replay agrees."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from ..conversation.job import JudgeJob


def sample_point(conversation_id: str) -> float:
    """A stable number in [0, 1) for the conversation id."""
    digest = hashlib.blake2b(conversation_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class Sampler:
    def __init__(self, rate: float = 1.0, agent_rates: Mapping[str, float] | None = None) -> None:
        self.rate = rate
        self.agent_rates = dict(agent_rates or {})

    def rate_for(self, agent: str) -> float:
        return self.agent_rates.get(agent, self.rate)

    def should_judge(self, job: JudgeJob) -> bool:
        """Error turns and negative feedback are always judged, and so is a conversation without text (it fails
        `empty_conversation` without a judge call: a failure the user must hear of, never sampled out in silence);
        otherwise the agent's rate (or the global one)."""
        if job.has_error or job.negative_feedback or not job.judgeable_exchanges:
            return True
        return sample_point(job.conversation_id) < self.rate_for(job.agent)
