"""`tracejudge consume`: assemble, sample and judge conversations from a Kafka topic until SIGTERM or SIGINT.

Before any I/O: the settings, the --calibration report, the canary set, the judge tier and the judge itself are
checked (each a one-line refusal with its exit code); then `app.build_app` wires the service and it runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any

from .._logging import configure_logging
from .options import EXIT_USAGE, settings_from_args


def calibration_refused(path: str | None) -> bool:
    """A --calibration / TRACEJUDGE_CALIBRATION report that cannot correct rates: one line on stderr, True."""
    if not path:
        return False
    from tracejudge.metrics.calibration import CalibrationError, load_hallucination_calibration

    try:
        load_hallucination_calibration(path)
    except CalibrationError as exc:
        print(f"tracejudge: invalid configuration: --calibration / TRACEJUDGE_CALIBRATION: {exc}", file=sys.stderr)
        return True
    return False


def canary_refused(settings: Any) -> bool:
    """A --canary-dataset that cannot be read or parsed: one line on stderr, True (before any I/O)."""
    if settings.canary_interval is None:
        return False
    from ..canary import load_canary_items
    from ..gold import DatasetError

    try:
        load_canary_items(settings.canary_dataset)
    except DatasetError as exc:
        print(
            f"tracejudge: invalid configuration: --canary-dataset / TRACEJUDGE_CANARY_DATASET: {exc}", file=sys.stderr
        )
        return True
    return False


def run_consume(namespace: argparse.Namespace) -> int:
    settings = settings_from_args(namespace)
    if calibration_refused(settings.calibration) or canary_refused(settings):
        return EXIT_USAGE
    configure_logging(settings.log_level, settings.log_format)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from ..app import tier_problem
    from .judge_check import refuse_judge, refuse_shadow_judge

    problem = tier_problem(settings)  # before the judge check: a tier the provider lacks is a usage error
    if problem is not None:
        print(f"tracejudge: {problem}", file=sys.stderr)
        return EXIT_USAGE
    refused = refuse_judge(settings)  # before any I/O: the judge can answer, and LiteLLM's import is paid now
    if refused is None:
        refused = refuse_shadow_judge(settings)
    if refused is not None:
        return refused
    from ..app import build_app
    from ..service import StartupError

    try:
        app = build_app(settings)

        def stop(signum: int, _frame: Any) -> None:
            logging.getLogger("tracejudge.consumer").info("signal %d: draining and stopping", signum)
            app.service.request_stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        app.run()
    except StartupError as exc:
        print(f"tracejudge: {exc}", file=sys.stderr)
        return exc.exit_code
    if app.service.failure is not None:  # logged with its traceback; the exit says it did not stop cleanly
        print(f"tracejudge: stopped on an internal error: {app.service.failure!r}", file=sys.stderr)
        return 1
    return 0
