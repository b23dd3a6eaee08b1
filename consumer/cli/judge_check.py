"""The judge at startup (`consume`, `backfill`, `calibrate`): LiteLLM imported, the model string routable, one cheap
call answered, all before any record is read; otherwise one line on stderr and a non-zero exit.

Importing LiteLLM here, before the consumer is ready, also moves its import (seconds) out of the first judgement's
latency. A model string no provider routes is a configuration error (exit 2); a judge that cannot answer the check
(missing or wrong credentials, a key HTTP cannot carry, a model that does not exist, nothing listening, a server
answering 500) exits 3 with a line that names the URL and model it tried, the cause, and that cause's fix.
"""

from __future__ import annotations

import re
import sys

from tracejudge.metrics.judge_check import (
    ERROR_RATE_LIMITED,
    JudgeCallError,
    JudgeEndpoint,
    check_judge_model,
    judge_endpoint,
    judge_model_problem,
    unsent_request,
)

from ..settings import Settings
from .options import EXIT_JUDGE_UNAVAILABLE, EXIT_USAGE

OPT_OUT = "--no-judge-check / TRACEJUDGE_JUDGE_CHECK=false"


def _one_line(text: str, limit: int = 400) -> str:
    return " ".join(text.split())[:limit]


def judge_config_error(settings: Settings) -> str | None:
    """Why `--judge-model` cannot be routed (unknown provider prefix), or None. Imports LiteLLM."""
    problem = judge_model_problem(settings.judge_model)
    if problem is None:
        return None
    return f"tracejudge: invalid configuration: --judge-model / TRACEJUDGE_JUDGE_MODEL: {_one_line(problem)}"


def _provider_message(exc: JudgeCallError) -> str:
    """What the provider (or LiteLLM) said, once: LiteLLM's `litellm.XError: XError: OpenAIException - ` prefixes
    dropped; for a request never sent, why (without the header: it holds the key)."""
    unsent = unsent_request(exc)
    if unsent is not None:  # LiteLLM says "Connection error." to a request that was never sent
        return _one_line(unsent, 160)
    text = str(exc.__cause__ if exc.__cause__ is not None else exc)
    text = re.sub(r"^litellm\.\w+:\s*", "", text.strip())
    for _ in range(3):
        text = re.sub(r"^\w*(?:Error|Exception|Timeout)\s*(?::|-)\s*", "", text)
    return _one_line(text, 160)


def _status(exc: JudgeCallError) -> int | None:
    status = getattr(exc.__cause__, "status_code", None)
    return status if isinstance(status, int) else None


_NOT_FOUND = re.compile(r"model\b.*\b(?:not found|does not exist|not exist)|no such model|unknown model", re.I)
_NOT_AN_API = re.compile(r"Expecting value|Received response|not valid JSON|JSONDecodeError", re.I)


def _cause_and_fix(exc: JudgeCallError, where: JudgeEndpoint, model: str, flag: str, timeout: float) -> tuple[str, str]:
    """(what happened, what to do), for each cause a user meets at startup."""
    url, status = where.url, _status(exc)
    said = _provider_message(exc)
    code = f" (HTTP {status})" if status else ""
    unsent = unsent_request(exc)
    rejected = exc.kind == "auth" and status in (401, 403)
    if where.key_flaw is not None and (unsent is not None or rejected):
        # The key's own content, exactly: not a server that is down (h11 refused the header: "Connection error.") or
        # failing (a non-ASCII character: a 500 no server sent), nor a key the server merely does not know.
        how = f"{url} rejected it{code}" if rejected else "it cannot be sent in an HTTP header"
        them = "them" if " and " in where.key_flaw or "characters" in where.key_flaw else "it"
        remove = "set it to the key itself" if where.key_flaw.startswith("holds only") else f"remove {them}"
        return (
            f"{where.key_variable} {where.key_flaw}, so {how}",
            f"{remove} (a key is one line of ASCII without spaces; a secret made from a file often keeps the "
            "file's newline)",
        )
    if unsent is not None:
        return (
            f"LiteLLM could not send the request to {url} ({unsent})",
            "remove newlines, whitespace and non-ASCII characters from the provider's settings (API key, "
            "organization, extra headers)",
        )
    if exc.kind == "auth" and (
        where.key_missing or (status not in (401, 403) and (where.key_state != "set" or status is None))
    ):
        # No key reached the server: LiteLLM refused before any request (its "Missing credentials", as a 500). A key
        # that is set and was sent is not this case, whatever a server's words ("No API key provided") say.
        local = (
            " (a local server that checks no key takes any value, e.g. placeholder)"
            if "openai" in where.provider
            else ""
        )
        state = {"empty": "is empty", "unset": "is not set"}.get(where.key_state, "is set, but LiteLLM did not send it")
        return (
            f"no API key for {where.litellm_model} at {url} ({where.key_variable} {state})",
            f"set {where.key_variable}{local}",
        )
    kind = exc.kind
    if kind == "auth" and status not in (401, 403) and status is not None:
        # The server's words said no key ("No API key provided") to a key that was sent: its status decides.
        kind = "server_error" if status >= 500 else "bad_request"
    if kind == "auth":  # the server answered 401/403 to the key it was sent, whatever words it chose
        if where.key_state == "set":
            return (
                f"{url} rejected the API key set in {where.key_variable}{code}",
                f"check that {where.key_variable} holds a key this server accepts, with access to {model!r}",
            )
        return f"{url} rejected the credentials LiteLLM sent{code}", f"check the provider's credentials for {model!r}"
    if kind == "connection":
        return (
            f"nothing answers at {url}",
            "start the server, or point OPENAI_BASE_URL at the one you run"
            if where.provider == "openai"
            else "check the network and the provider's endpoint",
        )
    if kind == "timeout":
        return f"no answer from {url} within {timeout:g} s", "check the server's load, or raise --judge-timeout"
    if status == 404 or "NotFound" in type(exc.__cause__).__name__ or _NOT_FOUND.search(said):
        listing = f"GET {url.rstrip('/')}/models" if url.startswith("http") else "the provider's model list"
        return (
            f"{url} does not serve the model {where.litellm_model.partition('/')[2] or model!r}{code}",
            f"name one it serves with {flag} (see {listing}; on Ollama, `ollama pull` it first)",
        )
    if kind == "server_error" and _NOT_AN_API.search(said):
        return (
            f"{url} answered, but not as an OpenAI-compatible API",
            "check that OPENAI_BASE_URL is the API's base URL (it often ends in /v1)",
        )
    if kind == "server_error":
        return (
            f"{url} answered with a server error{code}",
            "see that server's log (a model still loading answers so too: try again)",
        )
    if kind == "bad_request":
        return f"{url} refused the request{code}", f"check {flag} and the server's message"
    return f"LiteLLM could not call {where.litellm_model}", f"check {flag} and its provider's settings"


def judge_refusal(
    model: str, exc: JudgeCallError, *, timeout: float, who: str = "the judge", flag: str = "--judge-model"
) -> str:
    """The one line for a judge that failed the startup check: model, URL, cause, its fix, the provider's words."""
    where = judge_endpoint(model)
    cause, fix = _cause_and_fix(exc, where, model, flag, timeout)
    said = _provider_message(exc)
    return (
        f"tracejudge: {who} {model!r} cannot answer ({exc.kind}): {cause}: {fix} (it said: {said}; "
        f"skip this check with {OPT_OUT})"
    )


def check_judge(settings: Settings, *, who: str = "the judge", flag: str = "--judge-model") -> str | None:
    """One cheap call to the judge; None when it answered (a 429 counts: the judge is there and the key works),
    else the line to print. Retries are not made: a judge that fails its first call at startup is reported now."""
    try:
        check_judge_model(settings.judge_model, timeout=settings.judge_timeout)
    except JudgeCallError as exc:
        if exc.kind == ERROR_RATE_LIMITED:
            return None
        return judge_refusal(settings.judge_model, exc, timeout=settings.judge_timeout, who=who, flag=flag)
    return None


def refuse_judge_config(settings: Settings, *, with_shadow: bool = True) -> int | None:
    """The judge models' configuration (no call): EXIT_USAGE after one line when `--judge-model` (or, with
    `with_shadow`, `--shadow-judge-model`) names a provider LiteLLM does not route, else None. Imports LiteLLM."""
    problem = judge_config_error(settings)
    if problem is None and with_shadow and settings.shadow_judge_model:
        shadow = judge_model_problem(settings.shadow_judge_model)
        if shadow is not None:
            flag = "--shadow-judge-model / TRACEJUDGE_SHADOW_JUDGE_MODEL"
            problem = f"tracejudge: invalid configuration: {flag}: {_one_line(shadow)}"
    if problem is not None:
        print(problem, file=sys.stderr)
        return EXIT_USAGE
    return None


def refuse_unanswering_judge(settings: Settings, *, with_shadow: bool = True) -> int | None:
    """The judge check (unless --no-judge-check): EXIT_JUDGE_UNAVAILABLE after one line when the judge (or, with
    `with_shadow`, the shadow judge) cannot answer one cheap call, else None."""
    if not settings.judge_check:
        return None
    problem = check_judge(settings)
    if problem is None and with_shadow and settings.shadow_judge_model:
        shadow = settings.model_copy(update={"judge_model": settings.shadow_judge_model})
        problem = check_judge(shadow, who="the shadow judge", flag="--shadow-judge-model")
    if problem is not None:
        print(problem, file=sys.stderr)
        return EXIT_JUDGE_UNAVAILABLE
    return None


def refuse_judge(settings: Settings) -> int | None:
    """`backfill`'s and `calibrate`'s startup step: the configuration, then the call; None to go on, else the exit
    code after printing one line on stderr. The judge they call only: neither runs the shadow judge, so a
    TRACEJUDGE_SHADOW_JUDGE_MODEL in their environment (set for `consume`) is not theirs to check."""
    return refuse_judge_config(settings, with_shadow=False) or refuse_unanswering_judge(settings, with_shadow=False)
