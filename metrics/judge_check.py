"""What a command checks about its judge before it starts: the model string routable, one cheap call answered.

Public, for the consumer's commands (and anyone embedding the judges); LiteLLM is imported by these calls only.
"""

from __future__ import annotations

from ._errors import JudgeCallError
from ._litellm import _import_litellm, litellm_model_string
from ._provider_errors import classify_litellm_error
from ._results import ERROR_RATE_LIMITED

__all__ = ["ERROR_RATE_LIMITED", "JUDGE_CHECK_PROMPT", "JudgeCallError", "check_judge_model", "judge_model_problem"]

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
    return f"unknown provider {provider!r} in judge model {model!r}: LiteLLM's providers are listed at {PROVIDERS_URL}"


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
