"""The providers' service tiers: standard (interactive), flex (half price, slower, sometimes unavailable) and batch
(half price through the Batch API, results within the provider's window, usually minutes).

Prices come from LiteLLM's bundled price map (`*_flex`, `*_batches` keys beside the standard ones): the same map
LiteLLM prices standard calls with, so a tier's cost is the provider's published price, cache reads and writes
included. LiteLLM is imported by the caller (these functions take its `model_cost` map or import it lazily).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

TIER_STANDARD = "standard"
TIER_FLEX = "flex"
TIER_BATCH = "batch"
TIERS = (TIER_STANDARD, TIER_FLEX, TIER_BATCH)
_SUFFIX = {TIER_STANDARD: "", TIER_FLEX: "_flex", TIER_BATCH: "_batches"}

# Flex answers are slower: OpenAI's guide raises the client timeout to 15 minutes.
FLEX_MIN_TIMEOUT_S = 900.0
# Providers whose Batch API LiteLLM reaches with an OpenAI-format JSONL file uploaded through its Files API.
BATCH_PROVIDERS = frozenset({"openai", "azure", "hosted_vllm", "litellm_proxy"})

# OpenAI answers a flex request it has no capacity for with 429 `resource_unavailable` ("Resource Unavailable"),
# not charged; Groq with 498 `capacity_exceeded`. Rate limits (429 `rate_limit_exceeded`) are not this.
_FLEX_UNAVAILABLE = re.compile(r"resource[_ ]unavailable|capacity[_ ]exceeded|flex capacity", re.IGNORECASE)


def is_flex_unavailable(exc: BaseException) -> bool:
    """The provider's "no flex capacity now" answer: the call is made again at the standard tier."""
    status = getattr(exc, "status_code", None)
    return status in (429, 498, 503) and bool(_FLEX_UNAVAILABLE.search(str(exc)))


@dataclass(frozen=True, slots=True)
class TierPrices:
    """USD per token at one tier; `cache_read`/`cache_write` fall back to the input price where none is listed."""

    input: float
    output: float
    cache_read: float
    cache_write: float


def model_entry(litellm_model: str, model_cost: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The price map's entry for a LiteLLM model string (`openai/gpt-5-mini`, `gemini/gemini-2.5-flash`)."""
    if model_cost is None:
        import litellm

        model_cost = litellm.model_cost
    provider, _, name = litellm_model.partition("/")
    for key in (litellm_model, name, f"{provider}/{name}"):
        entry = model_cost.get(key)
        if isinstance(entry, dict) and "input_cost_per_token" in entry:
            return entry
    return None


def has_tier_price(litellm_model: str, tier: str, model_cost: dict[str, Any] | None = None) -> bool:
    """Whether the price map lists this tier for the model (standard: any price at all)."""
    entry = model_entry(litellm_model, model_cost)
    if entry is None:
        return False
    return f"input_cost_per_token{_SUFFIX[tier]}" in entry


def tier_prices(litellm_model: str, tier: str, model_cost: dict[str, Any] | None = None) -> TierPrices | None:
    """The model's prices at `tier`; None when the map does not list that tier (or the model)."""
    entry = model_entry(litellm_model, model_cost)
    suffix = _SUFFIX[tier]
    if entry is None or f"input_cost_per_token{suffix}" not in entry:
        return None

    def price(key: str, fallback: float) -> float:
        value = entry.get(f"{key}{suffix}")
        return float(value) if isinstance(value, int | float) else fallback

    tier_input = float(entry[f"input_cost_per_token{suffix}"])
    output = price("output_cost_per_token", float(entry.get("output_cost_per_token") or 0.0))
    # A tier without its own cache prices: the standard cache price, never above the tier's own input price.
    standard_read = entry.get("cache_read_input_token_cost")
    standard_write = entry.get("cache_creation_input_token_cost")
    read_fallback = min(tier_input, float(standard_read)) if isinstance(standard_read, int | float) else tier_input
    standard_input = float(entry.get("input_cost_per_token") or 0.0)
    if isinstance(standard_write, int | float) and standard_input > 0:  # the same cache-write premium as standard
        write_fallback = float(standard_write) * tier_input / standard_input
    else:
        write_fallback = tier_input
    return TierPrices(
        input=tier_input,
        output=output,
        cache_read=price("cache_read_input_token_cost", read_fallback),
        cache_write=price("cache_creation_input_token_cost", write_fallback),
    )


def tier_cost(
    litellm_model: str,
    tier: str,
    *,
    input_tokens: int | None,
    output_tokens: int | None,
    cached_input_tokens: int | None = None,
    cache_write_input_tokens: int | None = None,
    model_cost: dict[str, Any] | None = None,
) -> float | None:
    """USD for one call's usage at `tier` (`input_tokens` includes cache reads and writes); None: no price known."""
    prices = tier_prices(litellm_model, tier, model_cost)
    if prices is None or input_tokens is None:
        return None
    read = cached_input_tokens or 0
    written = cache_write_input_tokens or 0
    fresh = max(0, input_tokens - read - written)
    return (
        fresh * prices.input
        + read * prices.cache_read
        + written * prices.cache_write
        + (output_tokens or 0) * prices.output
    )
