"""Provider prompt-caching minimums, and the system prompt a judge sends so that its rubric can be cached.

Providers cache a repeated prompt prefix only from a minimum length; below it every call pays the full input price
and nothing says so. Our rubrics (about 1,200-1,600 tokens) clear the 1,024 of OpenAI and most Claude models, but
not Claude Haiku 4.5's or Opus 4.5's 4,096, nor Gemini 2.5's 2,048. For those models, and only those, the rubric
goes out with an extended set of worked examples (borderline cases for each label, no new rule) so that the static
prefix clears the minimum and is read from the cache at a tenth of the input price. The extended prompt is one
constant per metric, byte-identical on every call, so it is itself the cacheable prefix.
"""

from __future__ import annotations

import re

from ._litellm import needs_cache_breakpoint

# Minimum cacheable prefix by model family, first match wins, over the lowercase LiteLLM model string. Only families
# above our rubrics' length matter here: everything else (OpenAI's automatic caching, other Claude models) caches
# from 1,024 tokens or fewer, which the base rubric already clears.
# Sources: Anthropic's prompt-caching docs, "minimum cacheable prompt length"
# (docs.anthropic.com/en/docs/build-with-claude/prompt-caching); Google's implicit-caching tables
# (ai.google.dev/gemini-api/docs/caching; Vertex AI: cloud.google.com/vertex-ai/generative-ai/docs/context-cache);
# LiteLLM's price list (`prompt_cache_min_tokens`), which tests/metrics/test_cache.py checks this table against.
CLAUDE_MINIMUMS: tuple[tuple[re.Pattern[str], int], ...] = (
    (re.compile(r"claude-(?:haiku-4[-.]5|4[-.]5-haiku)"), 4096),
    (re.compile(r"claude-(?:opus-4[-.][56]|4[-.][56]-opus)"), 4096),
    (re.compile(r"claude-(?:opus-4[-.]7|4[-.]7-opus)"), 2048),
    (re.compile(r"claude-(?:3[-.]5-haiku|3-haiku|haiku-3)"), 2048),
)
GEMINI_MINIMUMS: tuple[tuple[re.Pattern[str], int], ...] = (
    (re.compile(r"gemini-2\.5-(?:flash|pro)(?!-lite)"), 2048),
    (re.compile(r"gemini-3\.[1-9]|gemini-3-pro|gemini-(?:flash|pro)-latest"), 4096),
)
# Vertex AI caches from 2,048 tokens for every Gemini 2.5 model it caches implicitly, Flash-Lite included.
_VERTEX_GEMINI_25 = re.compile(r"gemini-2\.5-")
DEFAULT_MINIMUM = 1024
_IMPLICIT_GEMINI_PROVIDERS = {"gemini", "vertex_ai"}
_OUTPUT_FORMAT = "\n\n## Output format"
_CHARS_PER_TOKEN = 4  # English prose under the GPT, Claude and Gemini tokenizers: 4.3-4.5 characters per token


def caching_minimum(litellm_model: str) -> int | None:
    """The model's minimum cacheable prefix in tokens; None when the request as we send it is not cached at all
    (a Claude model behind a provider we do not mark breakpoints for)."""
    model = litellm_model.lower()
    provider = model.partition("/")[0]
    if "claude" in model:
        if not needs_cache_breakpoint(model):
            return None
        return next((minimum for pattern, minimum in CLAUDE_MINIMUMS if pattern.search(model)), DEFAULT_MINIMUM)
    if provider in _IMPLICIT_GEMINI_PROVIDERS and "gemini" in model:
        fallback = 2048 if provider == "vertex_ai" and _VERTEX_GEMINI_25.search(model) else DEFAULT_MINIMUM
        return next((minimum for pattern, minimum in GEMINI_MINIMUMS if pattern.search(model)), fallback)
    return DEFAULT_MINIMUM


def estimated_tokens(text: str) -> int:
    """A tokenizer-free estimate (LiteLLM is not imported to build a metric); the tests pin it against
    `litellm.token_counter` for the shipped prompts."""
    return len(text) // _CHARS_PER_TOKEN


def with_worked_examples(system_prompt: str, examples: str) -> str:
    """The rubric with the extra examples after its own, before the output format (which stays last)."""
    head, marker, tail = system_prompt.partition(_OUTPUT_FORMAT)
    if not marker:
        return f"{system_prompt}\n\n{examples}"
    return f"{head}\n\n{examples}{marker}{tail}"


def cacheable_system_prompt(system_prompt: str, extended_examples: str, litellm_model: str | None) -> str:
    """The system prompt to send to this model: the rubric alone when it already clears the model's caching minimum
    (or the model is unknown or never cached), the rubric with `extended_examples` when only that clears it."""
    return prompt_for_minimum(
        system_prompt, extended_examples, caching_minimum(litellm_model) if litellm_model else None
    )


def prompt_for_minimum(system_prompt: str, extended_examples: str, minimum: int | None) -> str:
    """`cacheable_system_prompt` for a given minimum (None: not cached at all)."""
    if not extended_examples or minimum is None or estimated_tokens(system_prompt) >= minimum:
        return system_prompt
    extended = with_worked_examples(system_prompt, extended_examples)
    return extended if estimated_tokens(extended) >= minimum else system_prompt
