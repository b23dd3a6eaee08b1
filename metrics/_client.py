"""What a judge model is to the metrics: the interface of a user-supplied judge client, and the reply every backend
returns. Kept apart from the backends so the public `CustomLLMClient` and the `JudgeReply` value can be imported (by
`tracejudge.metrics`, the batch tier, the usage reader) without pulling in LiteLLM's backend or its retries.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


class CustomLLMClient(ABC):
    """A judge model of your own; the same interface as the seeds' library, so existing clients work unchanged."""

    @abstractmethod
    async def chat_complete(self, messages: list[dict[str, str]], temperature: float) -> tuple[str, float | None]:
        """Return the model's text and its cost in USD (None when unknown)."""

    @abstractmethod
    def get_model_name(self) -> str:
        """The name reported in results and metrics."""


@dataclass(slots=True)
class JudgeReply:
    """`input_tokens` counts every prompt token; `cached_input_tokens` (cache reads) and `cache_write_input_tokens`
    (written to the cache, priced higher on Anthropic) are parts of it."""

    text: str
    cost_usd: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    cache_write_input_tokens: int | None = None
    tier: str | None = None  # the service tier that answered (flex falls back to standard for capacity)
    tier_fallbacks: int = 0  # flex requests refused for capacity and made again at the standard tier
