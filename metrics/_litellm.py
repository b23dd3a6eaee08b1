"""LiteLLM itself: its lazy import, the seeds' model names mapped to its model strings, and the prompt-cache
breakpoint some of its providers need. LiteLLM is imported on the first call, not at import time: it takes seconds to
import and applications that only trace must never pay for it. Nothing here writes the process environment (it is the
user's): LiteLLM's switches such as LITELLM_LOCAL_MODEL_COST_MAP are set, with setdefault, only by the `tracejudge`
command's own entry point.
"""

from __future__ import annotations

import threading
from typing import Any

# Seeds' short provider names that differ from LiteLLM's.
_PROVIDER_ALIASES = {"google": "gemini"}


_LITELLM_IMPORTED = threading.Event()


def _import_litellm() -> Any:
    import litellm

    litellm.suppress_debug_info = True
    _LITELLM_IMPORTED.set()
    return litellm


def litellm_model_string(model: str) -> str:
    """Map the seeds' model names to LiteLLM's: `provider:model` → `provider/model`, bare names are OpenAI."""
    model = model.strip()
    if not model:
        raise ValueError("judge model name is empty")
    if "/" in model:
        return model
    if model.startswith("ft:"):  # an OpenAI fine-tune (`ft:gpt-4o-mini:org::id`), not a provider prefix
        return f"openai/{model}"
    if ":" in model:
        provider, _, name = model.partition(":")
        provider = _PROVIDER_ALIASES.get(provider.lower(), provider.lower())
        return f"{provider}/{name}"
    return f"openai/{model}"


# Providers that cache a prompt prefix only up to an explicit `cache_control` breakpoint (Claude on Anthropic, Bedrock,
# Vertex AI, Azure AI Foundry, OpenRouter); OpenAI, Azure OpenAI, Gemini and the like cache a repeated prefix alone.
_BREAKPOINT_PROVIDERS = {"bedrock", "vertex_ai", "azure_ai", "openrouter"}
_EPHEMERAL = {"type": "ephemeral"}


def needs_cache_breakpoint(litellm_model: str) -> bool:
    """Whether this LiteLLM model string names a Claude model whose provider caches only at marked breakpoints."""
    provider, _, name = litellm_model.lower().partition("/")
    if provider == "anthropic":
        return True
    return provider in _BREAKPOINT_PROVIDERS and ("claude" in name or "anthropic" in name)


def with_cache_breakpoint(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leading system message (the static rubric) as one text block marked `cache_control: ephemeral`.

    Anthropic caches the prefix up to and including the marked block; the conversation after it is never marked, so
    each call writes or reads exactly the rubric. LiteLLM carries the block format to Anthropic, Bedrock and Vertex.
    """
    if not messages or messages[0].get("role") != "system" or not isinstance(messages[0].get("content"), str):
        return messages
    block = {"type": "text", "text": messages[0]["content"], "cache_control": dict(_EPHEMERAL)}
    system = {"role": "system", "content": [block]}
    return [system, *messages[1:]]
