"""What a command checks about its judge before it starts: the model string routable, one cheap call answered.

Public, for the consumer's commands (and anyone embedding the judges); LiteLLM is imported by these calls only.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass

from ._errors import JudgeCallError
from ._litellm import _import_litellm, litellm_model_string
from ._provider_errors import classify_litellm_error, unsent_request
from ._results import ERROR_RATE_LIMITED

__all__ = [
    "ERROR_RATE_LIMITED",
    "JUDGE_CHECK_PROMPT",
    "JudgeCallError",
    "JudgeEndpoint",
    "check_judge_model",
    "judge_endpoint",
    "judge_model_problem",
    "key_flaw",
    "unsent_request",
]

PROVIDERS_URL = "https://docs.litellm.ai/docs/providers"


def judge_model_problem(model: str) -> str | None:
    """Why LiteLLM cannot route this model string (an unknown provider prefix), or None; imports LiteLLM."""
    try:
        litellm_model = litellm_model_string(model)
    except ValueError as exc:
        return str(exc)
    provider = litellm_model.partition("/")[0]
    known = {getattr(p, "value", p) for p in _import_litellm().provider_list}
    if provider in known:
        return None
    return (
        f"unknown provider {provider!r} in judge model {model!r}{_suggestion(model, provider, known)}: "
        f"LiteLLM's providers are listed at {PROVIDERS_URL}"
    )


def _suggestion(model: str, provider: str, known: set[str]) -> str:
    """A bare model name (Ollama's `qwen2.5:7b`) is most often a local OpenAI-compatible server's: say how to name
    it; a mistyped prefix: the closest provider."""
    if "/" not in model:
        return f" (for a model served by an OpenAI-compatible server at OPENAI_BASE_URL: openai/{model})"
    close = difflib.get_close_matches(provider, sorted(known), n=1)
    return f" (did you mean {close[0]}/{model.partition('/')[2]}?)" if close else ""


# The startup check's request: a few tokens, no rubric (the local test judge answers it as a check).
JUDGE_CHECK_PROMPT = "tracejudge judge check: reply with the word OK."


def check_judge_model(model: str, *, timeout: float) -> None:
    """One cheap synchronous call to the judge; raises JudgeCallError (reason, provider's message) if it cannot
    answer. Synchronous on purpose: LiteLLM caches async clients, and one bound to a throwaway event loop must not
    be handed to the judges' loop later."""
    litellm = _import_litellm()
    try:
        litellm.completion(
            model=litellm_model_string(model),
            messages=[{"role": "user", "content": JUDGE_CHECK_PROMPT}],
            temperature=0,
            max_tokens=8,
            timeout=timeout,
            max_retries=0,
            num_retries=0,
            drop_params=True,
        )
    except Exception as exc:
        raise classify_litellm_error(exc) from exc


@dataclass(frozen=True, slots=True)
class JudgeEndpoint:
    """Where LiteLLM sends a model's calls, as the user configured it: `url` (the base URL it resolves, or
    `"PROVIDER's API"` when LiteLLM keeps it to itself), and `key_variable` (the environment variable its key is read
    from), for the fix a refusal names. `key_missing`: LiteLLM has no key to send (refused before any request);
    `key_state`: `key_variable` in the environment, `set`, `empty` or `unset`: a server that refuses a key is told
    apart from a key that never was; `key_flaw`: what in a set key no server accepts (a newline, whitespace,
    non-ASCII characters), or None."""

    litellm_model: str
    provider: str
    url: str
    key_variable: str
    key_missing: bool
    key_state: str = "unset"
    key_flaw: str | None = None


def key_flaw(value: str) -> str | None:
    """What in an API key's value no server accepts, in words (`contains a newline at its end`), or None: a key is
    one line of printable ASCII without spaces. The key itself is never quoted."""
    if value and value.isspace():
        return "holds only whitespace"
    flaws = []
    if any(c in "\r\n" for c in value):
        flaws.append("a newline")
    if any(c.isspace() and c not in "\r\n" for c in value):
        flaws.append("whitespace")
    foreign = sorted({c for c in value if not c.isascii()})
    if foreign:
        chars = ", ".join(f"{c!r} U+{ord(c):04X}" for c in foreign[:3])
        flaws.append(f"non-ASCII characters ({chars})" if len(foreign) > 1 else f"a non-ASCII character ({chars})")
    if any(not c.isprintable() and not c.isspace() for c in value):
        flaws.append("control characters")
    if not flaws:
        return None
    stripped, where = value.strip(), ""
    if stripped and all(c.isascii() and c.isprintable() and not c.isspace() for c in stripped):
        ends = value != value.lstrip(), value != value.rstrip()
        where = {(False, True): " at its end", (True, False): " at its start"}.get(ends, " at its start and end")
    return f"contains {' and '.join(flaws)}{where}"


def judge_endpoint(model: str) -> JudgeEndpoint:
    """The endpoint and key variable of `model`, resolved the way LiteLLM resolves them (`OPENAI_BASE_URL`, then
    `OPENAI_API_BASE`, then OpenAI's own URL for an OpenAI-compatible server). Imports LiteLLM; makes no call."""
    litellm = _import_litellm()
    litellm_model = litellm_model_string(model)
    provider, api_base = litellm_model.partition("/")[0], None
    try:
        _name, provider, _key, api_base = litellm.get_llm_provider(litellm_model)
    except Exception:  # an unroutable string is refused before (judge_model_problem); say what we can
        pass
    missing: list[str] = []
    try:
        missing = list(litellm.validate_environment(model=litellm_model).get("missing_keys") or [])
    except Exception:
        pass
    upper = str(provider).upper()
    key_variable = "OPENAI_API_KEY" if provider == "openai" else (missing[0] if missing else f"{upper}_API_KEY")
    url = api_base or getattr(litellm, "api_base", None)
    if not url and provider == "openai":
        url = os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE") or "https://api.openai.com/v1"
    if not url:
        url = os.environ.get(f"{upper}_API_BASE") or os.environ.get(f"{upper}_BASE_URL") or f"{provider}'s API"
    value = os.environ.get(key_variable)
    key_state = "unset" if value is None else "set" if value else "empty"
    # An empty variable is no key (LiteLLM refuses locally), though validate_environment counts it as present.
    missing_key = bool(missing) or key_state == "empty"
    flaw = key_flaw(value) if value else None
    return JudgeEndpoint(litellm_model, str(provider), str(url), key_variable, missing_key, key_state, flaw)
