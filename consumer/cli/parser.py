"""`tracejudge` command line: consume, demo, backfill, calibrate, compare, explain, broker; one module per command.

Invalid configuration: one clear line and exit code 2, before any I/O. What stops a start that the user can fix (a
metrics port in use: 2; Kafka not answering within `bootstrap_timeout_ms`: 69) is one line too, never a traceback.
Each command's module adds its own arguments; the consumer flags it takes come from `options.py` (Settings).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import backfill, broker, calibrate, compare, demo, explain
from .consume import calibration_refused, run_consume
from .options import EXIT_USAGE, add_consumer_flags, settings_from_args


def run_demo(namespace: argparse.Namespace) -> int:
    # TRACEJUDGE_CALIBRATION applies to the demo too: refuse a bad report before the broker starts.
    if calibration_refused(settings_from_args(namespace).calibration):
        return EXIT_USAGE
    return demo.run_demo(namespace)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tracejudge", description="Judge live LLM-agent conversations from Kafka.")
    commands = parser.add_subparsers(dest="command", required=True)
    consume = commands.add_parser("consume", help="assemble, sample and judge conversations from a Kafka topic")
    add_consumer_flags(consume)
    consume.set_defaults(handler=run_consume)
    demo_parser = commands.add_parser("demo", help="the whole pipeline on an embedded broker with a scripted agent")
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(handler=run_demo)
    backfill_parser = commands.add_parser("backfill", help="judge a past time range of the span topic")
    backfill.add_arguments(backfill_parser)
    backfill_parser.set_defaults(handler=backfill.run_backfill)
    calibrate_parser = commands.add_parser("calibrate", help="measure a judge model against a labelled gold set")
    calibrate.add_arguments(calibrate_parser)
    add_consumer_flags(calibrate_parser, only=calibrate.CALIBRATE_OPTIONS)
    calibrate_parser.set_defaults(handler=calibrate.run_calibrate)
    compare_parser = commands.add_parser(
        "compare", help="compare two judges' verdicts (primary and shadow) from the results topic"
    )
    compare.add_arguments(compare_parser)
    add_consumer_flags(compare_parser, only=compare.COMPARE_OPTIONS)
    compare_parser.set_defaults(handler=compare.run_compare)
    explain_parser = commands.add_parser(
        "explain", help="one conversation's story from Kafka: its turns, completion, sampling and judgements"
    )
    explain.add_arguments(explain_parser)
    add_consumer_flags(explain_parser, only=explain.EXPLAIN_OPTIONS)
    explain_parser.set_defaults(handler=explain.run_explain)
    # `tracejudge broker`: a local Kafka in one command for the quickstart.
    broker_parser = commands.add_parser("broker", help="a local Kafka (the embedded Tansu) on 127.0.0.1 until Ctrl-C")
    broker.add_arguments(broker_parser)
    broker_parser.set_defaults(handler=broker.run_broker)
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
