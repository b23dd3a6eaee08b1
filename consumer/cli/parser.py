"""`tracejudge` command line: consume, demo, backfill, calibrate, compare.

Invalid configuration: one clear line and exit code 2, before any I/O. What stops a start that the user can fix (a
metrics port in use: 2; Kafka not answering within `bootstrap_timeout_ms`: 69) is one line too, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from .._logging import configure_logging
from .options import CONSUMER_FLAGS, EXIT_USAGE, add_consumer_flags, field_help, settings_from_args


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


def cmd_consume(namespace: argparse.Namespace) -> int:
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


def cmd_demo(namespace: argparse.Namespace) -> int:
    # TRACEJUDGE_CALIBRATION applies to the demo too: refuse a bad report before the broker starts.
    if calibration_refused(settings_from_args(namespace).calibration):
        return EXIT_USAGE
    from .demo import run_demo

    return run_demo(namespace)


def cmd_calibrate(namespace: argparse.Namespace) -> int:
    from .calibrate import run_calibrate

    return run_calibrate(namespace)


def cmd_compare(namespace: argparse.Namespace) -> int:
    from .compare import run_compare

    return run_compare(namespace)


def cmd_backfill(namespace: argparse.Namespace) -> int:
    from .backfill import run_backfill

    return run_backfill(namespace)


# The canary and the shadow judge watch a running consumer's judge: nothing to do in backfill or the demo.
WATCH_OPTIONS = (
    "canary_interval",
    "canary_dataset",
    "canary_accuracy_floor",
    "canary_margin",
    "shadow_judge_model",
    "shadow_sample_rate",
    "shadow_budget_share",
)
# Consumer flags that mean nothing to backfill: no group or commits, no /metrics served (its registry is discarded),
# no backpressure (the range is read once), its own --sample-rate, and no calibrated rates.
BACKFILL_SKIPS = (
    "group_id",
    "start_from",
    "sample_rate",
    "calibration",
    "metrics_host",
    "metrics_port",
    "max_agents",
    "window_sessions",
    "window_seconds",
    "max_open_conversations",
    "commit_interval",
    *WATCH_OPTIONS,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tracejudge", description="Judge live LLM-agent conversations from Kafka.")
    commands = parser.add_subparsers(dest="command", required=True)
    consume = commands.add_parser("consume", help="assemble, sample and judge conversations from a Kafka topic")
    add_consumer_flags(consume)
    consume.set_defaults(handler=cmd_consume)
    demo = commands.add_parser("demo", help="the whole pipeline on an embedded broker with a scripted agent")
    add_consumer_flags(
        demo,
        skip=("topic", "group_id", "start_from", "session_idle_timeout", "calibration", "judge_check", *WATCH_OPTIONS),
        defaults={
            "bootstrap_servers": "an embedded broker",
            "judge_model": "a scripted judge",
            "metrics_host": "127.0.0.1",
            "metrics_port": "a free port",
        },
    )
    demo.add_argument(
        "--serve", action="store_true", help="keep running after the demo for Prometheus and Grafana (default off)"
    )
    demo.add_argument(
        "--seconds-idle", type=float, default=3.0, help="the demo's conversation idle timeout (default %(default)s)"
    )
    demo.set_defaults(handler=cmd_demo)
    backfill = commands.add_parser("backfill", help="judge a past time range of the span topic")
    backfill.add_argument(
        "--from", dest="start", required=True, metavar="TIME", help="start: ISO 8601 or Unix seconds (required)"
    )
    backfill.add_argument(
        "--to", dest="end", required=True, metavar="TIME", help="end, exclusive: as --from (required)"
    )
    backfill.add_argument("--agent", default=None, help="only this agent's conversations (default all)")
    backfill.add_argument(
        "--sample-rate",
        dest="backfill_sample_rate",
        type=float,
        default=None,
        metavar="RATE",
        help=field_help("sample_rate"),
    )
    backfill.add_argument(
        "--rejudge", action="store_true", help="judge again what the results topic already has (default off)"
    )
    backfill.add_argument(
        "--dry-run",
        action="store_true",
        help="read the range, call no judge: print how many conversations would be judged and the estimated "
        "judge cost (default off)",
    )
    add_consumer_flags(backfill, skip=BACKFILL_SKIPS)
    backfill.set_defaults(handler=cmd_backfill)
    from .calibrate import CALIBRATE_OPTIONS, add_arguments

    calibrate = commands.add_parser("calibrate", help="measure a judge model against a labelled gold set")
    add_arguments(calibrate)
    add_consumer_flags(calibrate, skip=[dest for _, dest, _ in CONSUMER_FLAGS if dest not in CALIBRATE_OPTIONS])
    calibrate.set_defaults(handler=cmd_calibrate)
    from .compare import COMPARE_OPTIONS
    from .compare import add_arguments as add_compare_arguments

    compare = commands.add_parser(
        "compare", help="compare two judges' verdicts (primary and shadow) from the results topic"
    )
    add_compare_arguments(compare)
    add_consumer_flags(compare, skip=[dest for _, dest, _ in CONSUMER_FLAGS if dest not in COMPARE_OPTIONS])
    compare.set_defaults(handler=cmd_compare)
    # `tracejudge broker`: a local Kafka in one command for the quickstart (consumer/broker_cmd.py).
    from . import broker as broker_cmd

    broker = commands.add_parser("broker", help="a local Kafka (the embedded Tansu) on 127.0.0.1 until Ctrl-C")
    broker_cmd.add_arguments(broker)
    broker.set_defaults(handler=broker_cmd.run_broker)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # The command's own process, so LiteLLM's switches may be defaulted here (never in the library): the bundled
    # cost map and Anthropic beta headers instead of a blocking fetch at import or on the first Claude call.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True")
    parser = build_parser()
    namespace = parser.parse_args(argv)
    return int(namespace.handler(namespace))


if __name__ == "__main__":
    sys.exit(main())
