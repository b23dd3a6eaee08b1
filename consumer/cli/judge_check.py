"""The judge at startup (`consume`, `backfill`, `calibrate`): LiteLLM imported, the model string routable, one cheap
call answered, all before any record is read; otherwise one line on stderr and a non-zero exit.

Importing LiteLLM here, before the consumer is ready, also moves its import (seconds) out of the first judgement's
latency. A model string no provider routes is a configuration error (exit 2); a judge that cannot answer the check
(missing or wrong credentials, a model that does not exist, a server answering 500) exits 3.
"""

from __future__ import annotations

import sys

from tracejudge.metrics.judge_check import ERROR_RATE_LIMITED, JudgeCallError, check_judge_model, judge_model_problem

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


def check_judge(settings: Settings) -> str | None:
    """One cheap call to the judge; None when it answered (a 429 counts: the judge is there and the key works),
    else the line to print. Retries are not made: a judge that fails its first call at startup is reported now."""
    try:
        check_judge_model(settings.judge_model, timeout=settings.judge_timeout)
    except JudgeCallError as exc:
        if exc.kind == ERROR_RATE_LIMITED:
            return None
        return (
            f"tracejudge: the judge {settings.judge_model!r} cannot answer ({exc.kind}): {_one_line(str(exc))} "
            f"(skip this check with {OPT_OUT})"
        )
    return None


def refuse_shadow_judge(settings: Settings) -> int | None:
    """As `refuse_judge` for `--shadow-judge-model`: a shadow that cannot answer is refused at startup too."""
    if not settings.shadow_judge_model:
        return None
    model = settings.shadow_judge_model
    problem = judge_model_problem(model)
    if problem is not None:
        flag = "--shadow-judge-model / TRACEJUDGE_SHADOW_JUDGE_MODEL"
        print(f"tracejudge: invalid configuration: {flag}: {_one_line(problem)}", file=sys.stderr)
        return EXIT_USAGE
    if settings.judge_check:
        problem = check_judge(settings.model_copy(update={"judge_model": model}))
        if problem is not None:
            print(problem.replace("the judge", "the shadow judge", 1), file=sys.stderr)
            return EXIT_JUDGE_UNAVAILABLE
    return None


def refuse_judge(settings: Settings) -> int | None:
    """The CLI's startup step: None to go on, else the exit code after printing one line on stderr."""
    problem = judge_config_error(settings)
    if problem is not None:
        print(problem, file=sys.stderr)
        return EXIT_USAGE
    if settings.judge_check:
        problem = check_judge(settings)
        if problem is not None:
            print(problem, file=sys.stderr)
            return EXIT_JUDGE_UNAVAILABLE
    return None
