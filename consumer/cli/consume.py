"""`tracejudge consume`: assemble, sample and judge conversations from a Kafka topic until SIGTERM or SIGINT.

At start, in the order docs/configuration.md states: the configuration (the settings, the --calibration report, the
canary set, the judge tier, the metrics port, the judge model strings: exit 2), the judge (one cheap call: exit
3), then Kafka (exit 69, when `app.build_app` and `App.run` connect); each refusal is one line. Then it runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from .._gc import collect_less
from .._logging import configure_logging
from .options import EXIT_USAGE, settings_from_args

HURRIED_EXIT_S = 1.5  # after a second stop signal the process is gone within this (the bound: 2 s)
EXIT_HURRIED = 130  # 128 + SIGINT, as a shell reports an interrupted command


def stopping(service: Any, grace_s: float) -> Callable[[int, Any], None]:
    """The SIGTERM and SIGINT handler. The first signal drains: what is in flight gets `--shutdown-grace` to finish
    and be committed (said, with what it waits for). A second one stops now: in-flight judgements are cancelled and
    left uncommitted (the conversations are judged again after the restart), and the process exits within
    HURRIED_EXIT_S even if a close still waits on the brokers; nothing unfinished was committed, so leaving then is
    as safe as a kill -9."""
    log = logging.getLogger("tracejudge.consumer")
    received: list[int] = []

    def handle(signum: int, _frame: Any) -> None:
        received.append(signum)
        name = signal.Signals(signum).name
        if len(received) == 1:
            log.info(
                "%s: stopping: draining %s, for at most %gs (--shutdown-grace); send it again (Ctrl-C) to stop at once "
                "(what is unfinished is then judged again after the restart)",
                name,
                service.draining(),
                grace_s,
            )
            service.request_stop()
            return
        log.warning(
            "%s again: stopping now; %s left uncommitted, judged again after the restart",
            name,
            service.draining(),
        )
        service.hurry()
        timer = threading.Timer(
            HURRIED_EXIT_S, lambda: os._exit(1 if getattr(service, "failure", None) is not None else EXIT_HURRIED)
        )
        timer.daemon = True
        timer.start()

    return handle


def leave_now(code: int) -> NoReturn:
    """After a second stop signal, once the service has stopped: exit without the interpreter's finalization. With
    LiteLLM loaded, tearing the modules down holds the GIL for over a second, during which the HURRIED_EXIT_S timer
    cannot run; the judge calls given up still hold non-daemon threads. Everything was closed or flushed by the
    service's stop (outputs, state, commits), so nothing is left but the logs."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


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
    from ..judging.canary import load_canary_items
    from ..judging.gold import DatasetError

    try:
        load_canary_items(settings.canary_dataset, settings.judge_files)
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
    collect_less()
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from prometheus_client import CollectorRegistry, ProcessCollector

    from .._errors import StartupError
    from ..app import MetricsPortUnavailable, build_app, serve_metrics_endpoint, tier_problem
    from .judge_check import refuse_judge_config, refuse_unanswering_judge

    problem = tier_problem(settings)  # before the judge check: a tier the provider lacks is a usage error
    if problem is not None:
        print(f"tracejudge: {problem}", file=sys.stderr)
        return EXIT_USAGE
    # The documented order (docs/configuration.md#run-the-consumer): configuration (exit 2: flags, files, the metrics
    # port, the judge model strings), then the judge (exit 3), then Kafka (exit 69). Nothing connects anywhere before
    # the configuration is known good; a judge that cannot answer never joins the group. The port comes before the
    # model strings: their check imports LiteLLM (seconds), so a port in use is said at once.
    registry = CollectorRegistry()
    # process_cpu_seconds_total, process_resident_memory_bytes, ...: each replica's own cost, summed across replicas
    # and roles by whoever sizes a deployment (docs/deployment.md#sizing, bench/scale_out.py)
    ProcessCollector(registry=registry)
    try:
        metrics_server = serve_metrics_endpoint(settings, registry)
    except MetricsPortUnavailable as exc:
        print(f"tracejudge: {exc}", file=sys.stderr)
        return exc.exit_code
    # LiteLLM's import is paid here, before the consumer is ready.
    refused = refuse_judge_config(settings) or refuse_unanswering_judge(settings)
    if refused is not None:
        metrics_server.shutdown()
        metrics_server.server_close()
        return refused
    try:
        app = build_app(settings, registry=registry, metrics_server=metrics_server)  # closes it if it fails

        signal.signal(signal.SIGTERM, stopping(app.service, settings.shutdown_grace))
        signal.signal(signal.SIGINT, signal.getsignal(signal.SIGTERM))
        try:
            app.run()
        except StartupError:
            raise
        except BaseException:  # a stop that failed after the second signal still leaves at once, saying why
            if not app.service.hurried:
                raise
            logging.getLogger("tracejudge.consumer").exception("stopping after the second stop signal failed")
            leave_now(1)
    except StartupError as exc:
        print(f"tracejudge: {exc}", file=sys.stderr)
        return exc.exit_code
    code = 0
    if app.service.failure is not None:  # logged with its traceback; the exit says it did not stop cleanly
        print(f"tracejudge: stopped on an internal error: {app.service.failure!r}", file=sys.stderr)
        code = 1
    if app.service.hurried:
        leave_now(code or EXIT_HURRIED)
    return code
